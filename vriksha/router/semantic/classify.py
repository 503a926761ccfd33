"""From a request's text to its ordered candidate routes: the signals (embedding batched across
concurrent requests) and the decisions. Shared by the HTTP front, `vriksha route eval` and the benchmark.

`classify` computes the cheap signals first and embeds the text only when a rule that could still be taken
needs an embedding signal; `complete` embeds later (a fall-through past the settled routes)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from vriksha.net.offload import off_loop
from vriksha.router.semantic.batcher import EmbedBatcher
from vriksha.router.semantic.config import RoutesConfig
from vriksha.router.semantic.decisions import Route, candidates, settled
from vriksha.router.semantic.embedder import Embedder
from vriksha.router.semantic.signals import SignalSet, SignalValues
from vriksha.router.semantic.static import StaticEmbedder


@dataclass(slots=True)
class Classified:
    routes: list[Route]
    values: SignalValues
    emb: torch.Tensor | None
    embed_s: float = 0.0
    decide_s: float = 0.0
    complete: bool = True  # False: `routes` are those the cheap signals settle; more may follow


class RouteClassifier:
    def __init__(
        self,
        cfg: RoutesConfig,
        embedder: Embedder | StaticEmbedder,
        eager: bool = False,
        cache_embedder: Embedder | None = None,
    ) -> None:
        """`eager`: embed every text before deciding (the behaviour without the cheap-signal shortcut).
        `cache_embedder`: the transformer the semantic cache compares texts with when routing is static
        (static vectors cannot tell "capital of France" from "capital of Germany"); loaded here when the
        cache is on and none is given."""
        if embedder.mode != cfg.embedding.mode:
            raise ValueError(
                f"a {embedder.mode} embedder for a config with embedding.mode {cfg.embedding.mode}"
            )
        self.cfg = cfg
        self.embedder = embedder
        self.signals = SignalSet(cfg, embedder.encode)
        self.eager = eager
        e = cfg.embedding
        self.batcher = EmbedBatcher(embedder.encode, e.max_batch, e.max_wait_ms, memo_entries=e.memo_entries)
        self.cache_batcher: EmbedBatcher | None = None  # None: the cache uses the routing vectors
        if embedder.mode != "transformer" and (cfg.cache.enabled or cache_embedder is not None):
            if cache_embedder is None:
                from vriksha.router.semantic.embedder import embedder_for

                cache_embedder = embedder_for(cfg, "transformer")
            self.cache_batcher = EmbedBatcher(
                cache_embedder.encode, e.max_batch, e.max_wait_ms, memo_entries=e.memo_entries
            )

    @property
    def batchers(self) -> list[EmbedBatcher]:
        return [self.batcher] + ([self.cache_batcher] if self.cache_batcher is not None else [])

    async def embed(self, text: str) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        if self.embedder.inline:  # the static table: cheaper than a hop to the batching thread
            emb = self.embedder.encode([text])[0]
        else:
            emb = await self.batcher.embed(text)
        return emb, time.perf_counter() - t0

    async def cache_vector(self, text: str, emb: torch.Tensor | None) -> tuple[torch.Tensor, float, bool]:
        """The vector the semantic cache compares `text` by, the seconds it took, and whether it is also the
        routing embedding (`emb`, the routing one when at hand)."""
        if self.cache_batcher is None:
            if emb is not None:
                return emb, 0.0, True
            emb, took = await self.embed(text)
            return emb, took, True
        t0 = time.perf_counter()
        vec = await self.cache_batcher.embed(text)
        return vec, time.perf_counter() - t0, False

    async def classify(self, text: str) -> Classified:
        t0 = time.perf_counter()
        values = await off_loop(len(text), self.signals.text_values, text)  # a long text: scanned on a thread
        if not text:
            values.pending.clear()  # nothing to embed: the embedding signals do not fire
        routes, complete = settled(self.cfg, values)
        decide_s = time.perf_counter() - t0
        if not self.eager and (
            complete or routes
        ):  # a settled route to try first: embed on fall-through only
            return Classified(routes, values, None, 0.0, decide_s, complete)
        emb, embed_s = await self.embed(text)
        return self.decide(text, emb, embed_s, values)

    async def complete(self, text: str, partial: Classified, emb: torch.Tensor | None = None) -> Classified:
        """Every candidate route of a request `classify` left incomplete (the text embedded now unless its
        embedding `emb` is at hand). Its first routes are `partial.routes`, the same ones in the same order."""
        if partial.complete:
            return partial
        embed_s = 0.0
        if emb is None:
            emb, embed_s = await self.embed(text)
        return self.decide(text, emb, embed_s, partial.values)

    def decide(
        self, text: str, emb: torch.Tensor | None, embed_s: float = 0.0, values: SignalValues | None = None
    ) -> Classified:
        """Every candidate route; `values`: the text's cheap signals when already computed (taken over)."""
        t0 = time.perf_counter()
        if values is None:
            values = self.signals.text_values(text)
        if emb is not None:
            self.signals.embedding_values(emb, values)
        values.pending.clear()
        routes = candidates(self.cfg, values)
        return Classified(routes, values, emb, embed_s, time.perf_counter() - t0)
