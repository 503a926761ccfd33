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

    def __init__(self, linears: Sequence[EngagedLinears] = ()) -> None:
        self.linears = list(linears)

    @contextlib.contextmanager
    def __call__(self, attn: AttentionBatch) -> Iterator[None]:
        with (
            torch.inference_mode(),
            phase("engine.forward"),
            forward_context(attn),
            contextlib.ExitStack() as s,
        ):
            for linear in self.linears:
                s.enter_context(linear.engaged())
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
        with self.scope(i.attn):
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
