"""Signals: what a request's text says about it, each one a name that fires (or not) with a score and a
reason. Keyword/regex signals need only the text; embedding and classifier signals the text's embedding."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from vriksha.router.semantic import safety
from vriksha.router.semantic.config import (
    ClassifierSignal,
    EmbeddingSignal,
    KeywordSignal,
    RoutesConfig,
    SafetySignal,
)
from vriksha.router.semantic.examples import ensure_head
from vriksha.router.semantic.head import Head


@dataclass(slots=True)
class Fired:
    score: float
    why: str


@dataclass(slots=True)
class SignalValues:
    """Fired signals by name; a classifier's fires as `name:label`. `pending`: the signals not computed yet
    (those that need the embedding, until it is there)."""

    fired: dict[str, Fired] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)

    def __contains__(self, name: str) -> bool:
        return name in self.fired


class KeywordMatcher:
    def __init__(self, cfg: KeywordSignal) -> None:
        flags = 0 if cfg.case_sensitive else re.IGNORECASE
        words = [re.compile(r"(?<!\w)" + re.escape(k) + r"(?!\w)", flags) for k in cfg.keywords]
        self.patterns = words + [re.compile(p, flags) for p in cfg.regex]
        self.sources = list(cfg.keywords) + list(cfg.regex)
        self.all = cfg.operator == "all"

    def match(self, text: str) -> Fired | None:
        hits = [src for p, src in zip(self.patterns, self.sources, strict=True) if p.search(text)]
        if not hits or (self.all and len(hits) < len(self.patterns)):
            return None
        return Fired(len(hits) / len(self.patterns), f"matched {hits[0]!r}")


class ExampleMatcher:
    def __init__(self, cfg: EmbeddingSignal, examples: torch.Tensor) -> None:
        self.cfg = cfg
        self.examples = examples  # (n, dim), unit rows

    def match(self, emb: torch.Tensor) -> Fired | None:
        sims = self.examples @ emb
        c = self.cfg
        if c.aggregation == "any":
            above = int((sims >= c.threshold).sum())
            ok, score = above >= c.min_matches, float(sims.max())
        else:
            score = float(sims.max() if c.aggregation == "max" else sims.mean())
            ok = score >= c.threshold
        if not ok:
            return None
        best = int(sims.argmax())
        return Fired(score, f"{c.aggregation} similarity {score:.2f} (closest: {c.examples[best][:40]!r})")


class Classifier:
    def __init__(self, cfg: ClassifierSignal, head: Head) -> None:
        self.cfg, self.head = cfg, head

    def predict(self, emb: torch.Tensor) -> tuple[str, float]:
        p = self.head.probs(emb.unsqueeze(0))[0]
        i = int(p.argmax())
        return self.head.labels[i], float(p[i])


class SafetyDetector:
    def __init__(self, cfg: SafetySignal) -> None:
        self.cfg = cfg

    def match(self, text: str) -> Fired | None:
        if self.cfg.kind == "jailbreak":
            phrase = safety.jailbreak(text)
            return None if phrase is None else Fired(1.0, f"jailbreak pattern {phrase!r}")
        kinds = safety.pii(text, self.cfg.pii_types)
        return Fired(1.0, "pii: " + ",".join(kinds)) if kinds else None


class SignalSet:
    """Every signal of a routes config, ready: example phrases embedded, heads loaded."""

    def __init__(self, cfg: RoutesConfig, encode) -> None:
        s = cfg.signals
        self.keywords = {k.name: KeywordMatcher(k) for k in s.keyword}
        self.safety = {k.name: SafetyDetector(k) for k in s.safety}
        self.examples = {e.name: ExampleMatcher(e, encode(e.examples)) for e in s.embedding}
        self.classifiers = {c.name: Classifier(c, ensure_head(cfg, c, encode)) for c in s.classifier}

    @property
    def needs_embedding(self) -> bool:
        return bool(self.examples or self.classifiers)

    def text_values(self, text: str) -> SignalValues:
        """The cheap signals; the embedding ones are left pending."""
        out = SignalValues(pending={*self.examples, *self.classifiers})
        for name, m in [*self.keywords.items(), *self.safety.items()]:
            hit = m.match(text)
            if hit is not None:
                out.fired[name] = hit
        return out

    def embedding_values(self, emb: torch.Tensor, out: SignalValues) -> SignalValues:
        for name, m in self.examples.items():
            hit = m.match(emb)
            if hit is not None:
                out.fired[name] = hit
        for name, c in self.classifiers.items():
            label, p = c.predict(emb)
            if p >= c.cfg.threshold:
                out.fired[f"{name}:{label}"] = Fired(p, f"{name} says {label} ({p:.2f})")
        out.pending.clear()
        return out
