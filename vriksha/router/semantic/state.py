"""What the semantic front's routes share, built once per app and handed to them through `Depends`: the pools
(each a router over its replicas), the classifier, the semantic cache and the metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request

from vriksha.router.config import ReplicaSpec, RouterConfig
from vriksha.router.metrics import RouterMetrics
from vriksha.router.pool import ReplicaPool
from vriksha.router.proxy import Forwarder
from vriksha.router.semantic.cache import SemanticCache
from vriksha.router.semantic.classify import RouteClassifier
from vriksha.router.semantic.config import Pool, RoutesConfig
from vriksha.router.semantic.metrics import SemanticMetrics
from vriksha.router.tokens import PromptTokens


@dataclass(slots=True)
class PoolRuntime:
    cfg: Pool
    pool: ReplicaPool
    forwarder: Forwarder
    tokens: PromptTokens
    served: str | None

    async def served_name(self, http: httpx.AsyncClient) -> str:
        if self.served is None:
            for r in self.pool.healthy():
                try:
                    models = (await http.get(f"{r.url}/v1/models", timeout=2)).json()["data"]
                    self.served = str(models[0]["id"])
                    break
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    continue
        return self.served or self.cfg.name


@dataclass(slots=True)
class SemanticState:
    cfg: RoutesConfig
    classifier: RouteClassifier
    http: httpx.AsyncClient
    pools: dict[str, PoolRuntime]
    replica_metrics: RouterMetrics  # one registry over every pool: replica URLs tell the pools apart
    metrics: SemanticMetrics
    cache: SemanticCache | None

    @classmethod
    def build(cls, cfg: RoutesConfig, classifier: RouteClassifier, base: RouterConfig) -> SemanticState:
        http = httpx.AsyncClient(
            timeout=httpx.Timeout(base.request_timeout_s, connect=base.connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        tokenizers: dict[str | None, PromptTokens] = {}
        pools: dict[str, PoolRuntime] = {}
        for p in cfg.pools:
            pool = ReplicaPool(_pool_router_config(p, base), http)
            if p.tokenizer not in tokenizers:
                tokenizers[p.tokenizer] = PromptTokens.for_model(p.tokenizer)
            pools[p.name] = PoolRuntime(
                p, pool, Forwarder(pool, http), tokenizers[p.tokenizer], p.served_model
            )
        every = [r for rt in pools.values() for r in rt.pool.replicas]
        shared = RouterMetrics(lambda: every)
        for rt in pools.values():
            rt.pool.metrics = shared
        metrics = SemanticMetrics()
        for b in classifier.batchers:
            b.on_batch = lambda n, _s: metrics.batch_size.observe(n)
        cache = SemanticCache(cfg.cache) if cfg.cache.enabled else None
        return cls(cfg, classifier, http, pools, shared, metrics, cache)


def _pool_router_config(p: Pool, base: RouterConfig) -> RouterConfig:
    specs = [ReplicaSpec(u.partition(",")[0].rstrip("/"), u.partition(",")[2] or None) for u in p.replicas]
    fields = {f: getattr(base, f) for f in base.__slots__ if f not in ("replicas", "policy", "model")}
    return RouterConfig(replicas=specs, policy=p.policy, model=p.tokenizer, **fields)


def semantic_state(request: Request) -> SemanticState:
    return request.app.state.semantic


State = Annotated[SemanticState, Depends(semantic_state)]
