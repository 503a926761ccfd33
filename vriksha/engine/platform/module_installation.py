"""The engine's changes to a model's modules, recorded with their undo, so the model can be handed back as it came.

The engine selects its attention implementation on the model and routes linear layers to the fastest CPU
path by replacing their `forward`. Both go through one `ModuleInstallation`; `undo()` (run by
`LLMEngine.close()`, by an `LLM` going out of scope, or on leaving a `with` block) restores every attribute
it changed, in reverse order, so that a training model wrapped by `LLM.from_module` behaves as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

_MISSING = object()


def _configs(model: torch.nn.Module) -> Iterator[Any]:
    """Every Transformers config reachable from the model (its own, sub-configs, and submodules')."""
    seen: set[int] = set()
    stack = [getattr(m, "config", None) for m in model.modules()]
    while stack:
        config = stack.pop()
        if config is None or id(config) in seen or not hasattr(config, "sub_configs"):
            continue
        seen.add(id(config))
        stack.extend(getattr(config, key, None) for key in config.sub_configs)
        yield config


class ModuleInstallation:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._undo: list[Callable[[], None]] = []

    @property
    def installed(self) -> bool:
        return bool(self._undo)

    def _remember(self, obj: Any, name: str) -> None:
        previous = obj.__dict__.get(name, _MISSING)

        def restore() -> None:
            if previous is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                obj.__dict__[name] = previous

        self._undo.append(restore)

    def set_attn_implementation(self, name: str) -> None:
        """Select the attention registered as `name` on the model and every sub-config."""
        for config in _configs(self.model):
            self._remember(config, "_attn_implementation_internal")
        self.model.set_attn_implementation(name)

    def replace_forward(self, module: torch.nn.Module, forward: Callable) -> None:
        self._remember(module, "forward")
        module.forward = forward

    def undo(self) -> None:
        """Restore everything changed, newest first; safe to call twice."""
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> ModuleInstallation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()
