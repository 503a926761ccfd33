"""Rank 0's forward paths under tensor parallel: each step is broadcast to the other ranks, then computed."""

from __future__ import annotations

import torch

from vriksha.engine.runner.forward_path import ForwardPath
from vriksha.engine.runner.step import ForwardStep
from vriksha.engine.tensor_parallel.group import TensorParallelGroup


class TensorParallelPath:
    """`inner`'s steps, each broadcast to the group's other ranks before rank 0 computes its share."""

    def __init__(self, inner: ForwardPath, group: TensorParallelGroup) -> None:
        self.inner = inner
        self.group = group
        self.name = f"{inner.name} on {group.size} ranks"

    def accepts(self, step: ForwardStep) -> bool:
        return self.inner.accepts(step)

    def __call__(self, step: ForwardStep) -> torch.Tensor:
        return self.group.run_step(self.inner, step)
