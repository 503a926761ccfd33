"""Labelled prompts (JSON lines of {"text", "label"}) and the classifier signal they train."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vriksha.errors import ConfigError
from vriksha.router.semantic.config import ClassifierSignal, RoutesConfig
from vriksha.router.semantic.head import Head, fit_head

logger = logging.getLogger(__name__)
Encode = Callable[[list[str]], torch.Tensor]


@dataclass(slots=True)
class Example:
    text: str
    label: str


def load_examples(path: str | Path, labels: list[str] | None = None) -> list[Example]:
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ex = Example(str(row["text"]), str(row["label"]))
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f'{path}:{n}: expected a JSON object with "text" and "label"') from None
        if labels is not None and ex.label not in labels:
            raise ConfigError(
                f"{path}:{n}: label {ex.label!r} is not one of the classifier's labels {labels}"
            )
        out.append(ex)
    if not out:
        raise ConfigError(f"{path} holds no examples")
    return out


def classifier_signal(cfg: RoutesConfig, name: str | None) -> ClassifierSignal:
    found = cfg.signals.classifier
    if name is not None:
        found = [c for c in found if c.name == name]
    if not found:
        raise ConfigError(
            f"{cfg.source}: no classifier signal{f' named {name!r}' if name else ''} under signals.classifier"
        )
    if len(found) > 1:
        raise ConfigError(f"{cfg.source}: several classifier signals; pick one with --signal NAME")
    return found[0]


def encode_all(encode: Encode, texts: list[str], batch: int = 64) -> torch.Tensor:
    return torch.cat([encode(texts[i : i + batch]) for i in range(0, len(texts), batch)])


def fit_signal(
    sig: ClassifierSignal, examples: list[Example], encode: Encode, l2: float = 1e-3
) -> tuple[Head, float]:
    """The head fitted on `examples`, and its accuracy on them."""
    missing = sorted(set(sig.labels) - {e.label for e in examples})
    if missing:
        raise ConfigError(f"no examples of {missing} for the classifier {sig.name!r}; every label needs some")
    emb = encode_all(encode, [e.text for e in examples])
    targets = torch.tensor([sig.labels.index(e.label) for e in examples])
    head = fit_head(emb, targets, sig.labels, l2=l2)
    return head, float((head.probs(emb).argmax(-1) == targets).float().mean())


def ensure_head(cfg: RoutesConfig, sig: ClassifierSignal, encode: Encode) -> Head:
    """The stored head; or, when there is none and the signal names `examples`, one fitted now and stored."""
    path = cfg.head_path(sig)
    if path.is_file() or sig.examples is None:
        return Head.load(path, sig.labels, cfg.embedding.mode)
    examples = load_examples(cfg.resolve(sig.examples), sig.labels)
    head, acc = fit_signal(sig, examples, encode)
    logger.info("fitted %s on %d examples (training accuracy %.3f)", sig.name, len(examples), acc)
    try:
        head.save(path, {"examples": str(len(examples)), "mode": cfg.embedding.mode})
    except OSError as exc:
        logger.warning("could not store the fitted head at %s (%s); using it from memory", path, exc)
    return head
