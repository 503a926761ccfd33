"""Labelled prompts (JSON lines of {"text", "label"}) and the classifier signal they train."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vriksha.errors import ConfigError
from vriksha.semantic.config import ClassifierSignal, RoutesConfig


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
