"""The loss seam: one input record per micro-batch, one output record, and the registry of losses.

A loss is a plug-in chosen by `grpo.loss_type`: a class registered here under that name, built once
from the `grpo` section and called on every micro-batch. The update (`train/update.py`) computes the
log-probabilities, fills a `LossInputs`, backpropagates `LossOutputs.loss` and sums the metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from torch import Tensor

from vriksha.errors import ConfigError

if TYPE_CHECKING:
    from vriksha.train.config import GRPOConfig

__all__ = ["Loss", "LossInputs", "LossOutputs", "build_loss", "loss_names", "register_loss"]


@dataclass(slots=True)
class LossInputs:
    """One micro-batch, token by token. Per-token tensors are [B, T] over the completions' positions
    (prompts excluded); `advantages` is [B] (one per sequence) or [B, T]."""

    logprobs: Tensor  # log pi_theta(t) of the policy being updated (with grad)
    old_logprobs: Tensor  # log pi_old(t): the policy the batch is credited to (detached)
    advantages: Tensor
    loss_mask: Tensor  # 1 on tokens the policy generated, 0 on environment tokens and padding
    sampling_logprobs: Tensor  # log mu(t): what the engine reported when it sampled t (0 where it did not)
    ref_logprobs: Tensor | None = None  # log pi_ref(t) of the frozen initial model (when a loss needs it)
    entropy: Tensor | None = (
        None  # [B, T] entropy of pi_theta at each position, with grad (when a loss needs it)
    )
    teacher_logprobs: Tensor | None = None  # log pi_teacher(t) of the sampled tokens (on-policy distillation)
    num_tokens_global: float = 1.0  # generated tokens in the whole step, every rank and micro-batch
    num_sequences_global: float = 1.0  # completions (rows) in the whole step, masked or not
    num_micro_batches_global: float = 1.0  # micro-batches with completions in the whole step, every rank

    @property
    def num_tokens(self) -> float:
        """This micro-batch's generated tokens."""
        return float(self.loss_mask.sum())


@dataclass(slots=True)
class LossOutputs:
    """The scalar to backpropagate (normalised so that the step's gradient is the sum over every
    micro-batch and rank) and the micro-batch's metrics: sums over its generated tokens, by name; a step
    reports each divided by the step's generated tokens."""

    loss: Tensor
    tokens: float = 0.0  # the generated tokens the metrics are summed over
    metrics: dict[str, float] = field(default_factory=dict)


class Loss(Protocol):
    metric_names: ClassVar[tuple[str, ...]]  # the keys of every `LossOutputs.metrics` it returns

    @property
    def needs_entropy(self) -> bool:
        """Whether `LossInputs.entropy` must be given, with its gradient (an entropy bonus)."""
        ...

    def __call__(self, inputs: LossInputs) -> LossOutputs: ...


LossFactory = Callable[["GRPOConfig"], Loss]
_LOSSES: dict[str, LossFactory] = {}


def register_loss(name: str, factory: LossFactory) -> None:
    """`grpo.loss_type: NAME` builds its loss as `factory(grpo_config)` (the package registers the
    built-in losses when it is imported)."""
    if name in _LOSSES:
        raise ValueError(f"a loss named {name!r} is registered already")
    _LOSSES[name] = factory


def loss_names() -> list[str]:
    return sorted(_LOSSES)


def build_loss(cfg: GRPOConfig) -> Loss:
    if cfg.loss_type not in loss_names():
        raise ConfigError(
            f"grpo.loss_type: unknown loss {cfg.loss_type!r}; choose one of {', '.join(loss_names())}"
        )
    return _LOSSES[cfg.loss_type](cfg)
