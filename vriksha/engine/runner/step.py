"""One engine step as the forward paths see it: the scheduler's batch, and the flattened inputs built from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vriksha.engine.attention.batch import AttentionBatch
from vriksha.engine.core.batch import ForwardBatch
from vriksha.engine.platform.lora_linear import LoraRows


@dataclass(slots=True)
class StepInputs:
    """A built step: the flattened ragged batch [1, T], its attention layout, and the rows to sample."""

    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    attn: AttentionBatch
    sample_index: torch.Tensor  # [S]: the rows whose logits the step returns
    lora: LoraRows | None = None  # the rows of each LoRA adapter in the step (None: the base model's only)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]


class ForwardStep:
    """A step to compute: the scheduler's `batch` (None for a step built elsewhere: another rank's, a
    measurement's, a graph capture's) and its `inputs`, built from the batch the first time a path asks."""

    __slots__ = ("batch", "_inputs", "_build")

    def __init__(
        self,
        batch: ForwardBatch | None = None,
        inputs: StepInputs | None = None,
        build: Callable[[ForwardBatch], StepInputs] | None = None,
    ) -> None:
        if inputs is None and (batch is None or build is None):
            raise ValueError("a step needs its inputs, or a batch and the builder of its inputs")
        self.batch = batch
        self._inputs = inputs
        self._build = build

    @property
    def inputs(self) -> StepInputs:
        if self._inputs is None:
            self._inputs = self._build(self.batch)
        return self._inputs
