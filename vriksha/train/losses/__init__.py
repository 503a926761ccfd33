"""Policy losses behind one interface: `LossInputs` in, `LossOutputs` out, chosen by `grpo.loss_type`."""

from vriksha.train.losses.base import Loss, LossInputs, LossOutputs, build_loss, loss_names, register_loss
from vriksha.train.losses.dapo import DAPOLoss
from vriksha.train.losses.kl import k3_kl

__all__ = [
    "DAPOLoss",
    "Loss",
    "LossInputs",
    "LossOutputs",
    "build_loss",
    "k3_kl",
    "loss_names",
    "register_loss",
]
