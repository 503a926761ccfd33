"""The forward paths: each computes a step's logits one way, and says which steps it takes.

The model runner assembles its paths once at load into an ordered chain (`runner/model_runner.py`); each step runs
on the first path that accepts it. In chain order: `DecodeGraphs` (decode-only steps replayed from CUDA
graphs), `NativeDecode` (decode rows through every layer in one native call), `LeanForward` (a flat loop over
the model's modules) and `TransformersForward` (the model's own forward), the last accepting every step.
Every path but the graphs' computes inside one `ForwardScope`: the engine's attention sees the step's batch
layout and the linear layers take their measured paths.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import torch

from vriksha.engine.attention.batch import AttentionBatch
from vriksha.engine.attention.paged import forward_context
from vriksha.engine.platform.lora_linear import LoraLinears, LoraRows
from vriksha.engine.runner.step import ForwardStep
from vriksha.profiling import phase


@runtime_checkable
class ForwardPath(Protocol):
    name: str

    def accepts(self, step: ForwardStep) -> bool:
        """Whether this path computes `step` (the chain asks the paths in order)."""
        ...

    def __call__(self, step: ForwardStep) -> torch.Tensor:
        """Logits [len(step.inputs.sample_index), vocab]."""
        ...


class EngagedLinears(Protocol):
    def engaged(self) -> contextlib.AbstractContextManager: ...


class ForwardScope:
    """What every computing path runs inside: inference mode, the step's layout published to the engine's
    attention, and the linear layers routed to their measured paths (`platform`'s dense and packed linears)."""

    def __init__(self, linears: Sequence[EngagedLinears] = (), lora: LoraLinears | None = None) -> None:
        self.linears = list(linears)
        self.lora = lora

    @contextlib.contextmanager
    def __call__(self, attn: AttentionBatch, lora: LoraRows | None = None) -> Iterator[None]:
        """`lora`: the step's rows of each LoRA adapter, whose deltas the adapted layers add."""
        if lora is not None and self.lora is None:
            raise RuntimeError("a step with LoRA rows reached an engine built without --enable-lora")
        with (
            torch.inference_mode(),
            phase("engine.forward"),
            forward_context(attn),
            contextlib.ExitStack() as s,
        ):
            for linear in self.linears:
                s.enter_context(linear.engaged())
            if self.lora is not None:
                s.enter_context(self.lora.engaged(lora))
            yield


class TransformersForward:
    """The model's own Transformers forward, with the engine's attention: it takes every step."""

    name = "transformers forward"

    def __init__(self, model: torch.nn.Module, scope: ForwardScope) -> None:
        self.model = model
        self.scope = scope

    def accepts(self, step: ForwardStep) -> bool:
        return True

    def __call__(self, step: ForwardStep) -> torch.Tensor:
        i = step.inputs
        with self.scope(i.attn, i.lora):
            out = self.model(
                input_ids=i.input_ids,
                position_ids=i.position_ids,
                use_cache=False,
                logits_to_keep=i.sample_index,
            )
        return out.logits[0]


def first_accepting(paths: Sequence[ForwardPath], step: ForwardStep) -> ForwardPath:
    for path in paths:
        if path.accepts(step):
            return path
    raise RuntimeError(f"no forward path takes this step (paths: {', '.join(p.name for p in paths)})")
