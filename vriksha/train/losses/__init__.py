"""Policy losses behind one interface: `LossInputs` in, `LossOutputs` out, chosen by `grpo.loss_type`."""

from vriksha.train.losses.base import Loss, LossInputs, LossOutputs, build_loss, loss_names, register_loss
from vriksha.train.losses.distill import ReverseKL
from vriksha.train.losses.importance import ImportanceCorrection, ImportanceWeights, off_policy_mask
from vriksha.train.losses.kl import k3_kl
from vriksha.train.losses.policy_loss import LOSS_SHAPES, PolicyLoss
from vriksha.train.losses.sft import TokenNLL

__all__ = [
    "LOSS_SHAPES",
    "ImportanceCorrection",
    "ImportanceWeights",
    "Loss",
    "LossInputs",
    "LossOutputs",
    "PolicyLoss",
    "ReverseKL",
    "TokenNLL",
    "build_loss",
    "k3_kl",
    "loss_names",
    "off_policy_mask",
    "register_loss",
]
