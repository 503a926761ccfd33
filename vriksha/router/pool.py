"""The replica set: health and load polling, ejection and re-admission, session affinity, the policy."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

import httpx

from vriksha.net.trust import internal_headers
from vriksha.router.config import RouterConfig
from vriksha.router.metrics import RouterMetrics
from vriksha.router.policies import Decision, make_policy
from vriksha.router.replica import Load, Replica
from vriksha.router.subscriber import EventSubscriber

logger = logging.getLogger(__name__)


class ReplicaPool:
    def __init__(self, config: RouterConfig, http: httpx.AsyncClient) -> None:
        self.config = config
        self.http = http
        self.replicas = [Replica(spec, i) for i, spec in enumerate(config.replicas)]
        self.policy = make_policy(config)
        self.metrics = RouterMetrics(lambda: self.replicas)
        self.sessions: OrderedDict[str, int] = OrderedDict()
        self._tasks: list[asyncio.Task] = []
        # the router's own credentials on its polls: a replica's /load takes the API key or the internal key
        self.poll_headers = internal_headers(config.internal_key)
        if config.api_key:
            self.poll_headers["authorization"] = f"Bearer {config.api_key}"
        self.internal_headers = internal_headers(config.internal_key)

    async def start(self) -> None:
        for r in self.replicas:
            if r.spec.events:
                r.events = EventSubscriber(
                    r.url,
                    r.spec.events,
                    f"{r.url}/kv_events/snapshot",
                    self.http,
                    on_resync=lambda reason, url=r.url: self.metrics.resyncs.labels(url, reason).inc(),
                    internal_key=self.config.internal_key,
                )
                r.events.start()
        await asyncio.gather(*(self._poll(r) for r in self.replicas))
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="router-health"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for r in self.replicas:
            if r.events is not None:
                await r.events.stop()

    # ---- health ------------------------------------------------------------------------------------
    def eject(self, r: Replica, why: str) -> None:
        if r.healthy:
            logger.warning("replica %s ejected: %s", r.url, why)
            self.metrics.ejections.labels(r.url).inc()
        r.healthy = False

    def _admit(self, r: Replica) -> None:
        if not r.healthy:
            logger.info("replica %s in rotation", r.url)
            self.metrics.readmissions.labels(r.url).inc()
            if r.events is not None:
                r.events.request_resync("readmit")
        r.healthy = True
        r.failures = 0

    async def _poll(self, r: Replica, with_health: bool = True) -> None:
        t = self.config.connect_timeout_s
        try:
            if with_health or not r.healthy:
                h = await self.http.get(f"{r.url}/health", headers=self.poll_headers, timeout=t)
                if h.status_code != 200:
                    self.eject(r, f"/health answered {h.status_code}")
                    return
            sent_in_flight = r.in_flight
            resp = await self.http.get(f"{r.url}/load", headers=self.poll_headers, timeout=t)
            resp.raise_for_status()
            body = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            r.failures += 1
            if r.failures >= 2 or isinstance(exc, httpx.ConnectError):
                self.eject(r, f"{type(exc).__name__}: {exc}")
            return
        r.load = Load(
            int(body.get("num_running", 0)),
            int(body.get("num_waiting", 0)) + int(body.get("server_waiting", 0)),
            float(body.get("kv_usage", 0.0)),
            max(sent_in_flight, r.in_flight),
        )
        ev = body.get("kv_events")
        if r.events is not None and ev:
            r.events.check_behind(ev.get("instance"), int(ev.get("seq", -1)))
        self._admit(r)

    async def _poll_loop(self) -> None:
        every = max(1, round(self.config.health_interval_s / self.config.load_interval_s))
        n = 0
        while True:
            await asyncio.sleep(self.config.load_interval_s)
            n += 1
            await asyncio.gather(*(self._poll(r, n % every == 0) for r in self.replicas))

    # ---- choosing ----------------------------------------------------------------------------------
    def healthy(self, exclude: set[int] = frozenset()) -> list[Replica]:  # type: ignore[assignment]
        """The replicas in rotation that take requests (prefill replicas take none)."""
        return [r for r in self.replicas if r.healthy and r.index not in exclude and r.spec.role != "prefill"]

    def healthy_prefill(self) -> list[Replica]:
        return [r for r in self.replicas if r.healthy and r.spec.role == "prefill"]

    @property
    def has_prefill(self) -> bool:
        return any(r.spec.role == "prefill" for r in self.replicas)

    def choose(self, tokens: list[int], session: str | None, exclude: set[int]) -> Decision | None:
        candidates = self.healthy(exclude)
        if not candidates:
            return None
        decision: Decision | None = None
        if session is not None and session in self.sessions:
            idx = self.sessions[session]
            pinned = next((r for r in candidates if r.index == idx), None)
            if pinned is not None:
                self.sessions.move_to_end(session)
                decision = Decision(pinned, "session", pinned.cached_prefix(tokens))
        if decision is None:
            decision = self.policy.choose(tokens, candidates)
            if exclude:
                decision.reason = "retry"
        if session is not None:
            self.sessions[session] = decision.replica.index
            self.sessions.move_to_end(session)
            while len(self.sessions) > self.config.max_sessions:
                self.sessions.popitem(last=False)
        self.policy.routed(decision, tokens)
        url = decision.replica.url
        self.metrics.decisions.labels(self.policy.name, url, decision.reason).inc()
        self.metrics.prompt_tokens.labels(url).inc(len(tokens))
        self.metrics.predicted_cached.labels(url).inc(decision.cached_tokens)
        return decision
