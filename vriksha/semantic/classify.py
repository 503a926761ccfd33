"""From a request's text to its ordered candidate routes: the signals (embedding batched across
concurrent requests) and the decisions. Shared by the HTTP front, `vriksha route eval` and the benchmark."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from vriksha.semantic.batcher import EmbedBatcher
from vriksha.semantic.config import RoutesConfig
from vriksha.semantic.decisions import Route, candidates
from vriksha.semantic.embedder import Embedder
from vriksha.semantic.signals import SignalSet, SignalValues


@dataclass(slots=True)
class Classified:
    routes: list[Route]
    values: SignalValues
    emb: torch.Tensor | None
    embed_s: float = 0.0
    decide_s: float = 0.0


class RouteClassifier:
    def __init__(self, cfg: RoutesConfig, embedder: Embedder, need_embedding: bool = False) -> None:
        self.cfg = cfg
        self.embedder = embedder
        self.signals = SignalSet(cfg, embedder.encode)
        self.need_embedding = need_embedding or self.signals.needs_embedding
        e = cfg.embedding
        self.batcher = EmbedBatcher(embedder.encode, e.max_batch, e.max_wait_ms)

    async def classify(self, text: str) -> Classified:
        emb = None
        embed_s = 0.0
        if self.need_embedding and text:
            t0 = time.perf_counter()
            emb = await self.batcher.embed(text)
            embed_s = time.perf_counter() - t0
        return self.decide(text, emb, embed_s)

    def decide(self, text: str, emb: torch.Tensor | None, embed_s: float = 0.0) -> Classified:
        t0 = time.perf_counter()
        values = self.signals.text_values(text)
        if emb is not None:
            self.signals.embedding_values(emb, values)
        routes = candidates(self.cfg, values)
        return Classified(routes, values, emb, embed_s, time.perf_counter() - t0)
