"""Apply the mesh to the policy: tensor parallel per model family, then FSDP2, in that order.

Tensor parallel (on the `tp` sub-mesh): q/k/v and gate/up are split by output columns
(`ColwiseParallel`, each rank holds `heads / tp` attention heads and `intermediate / tp` MLP
columns), o and down by input rows (`RowwiseParallel`, one all-reduce each), so a decoder layer
costs two all-reduces forward and two backward. The embedding and the LM head are split over the
vocabulary (`shard_vocab`, the default: logits stay sharded and `vocab_parallel.py` takes the
log-softmax with three small all-reduces instead of gathering the vocabulary) or replicated.
The norms stay replicated: sequence parallel would save activation memory only on sequences far
longer than a rollout's, and Transformers' decoder builds its masks and positions from the
sequence length a shard would hide.

FSDP2 then shards every block, and the root, over the data-parallel sub-mesh.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from vriksha.errors import ConfigError
from vriksha.train.distributed import ParallelDims
from vriksha.train.lora import lora_tp_plan
from vriksha.train.policy import decoder_layers

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

__all__ = ["parallelize", "apply_tp", "apply_fsdp", "check_tp_degree", "tp_plan", "TP_FAMILIES"]

Model = TypeVar("Model", bound="PreTrainedModel")  # a Transformers causal LM, split and sharded in place


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    return decoder_layers(model, "parallel.tp", " to split", "train this model with parallel.tp=1")


def _decoder_plan(model: nn.Module, shard_vocab: bool) -> dict[str, ParallelStyle]:
    """The plan of a Llama-style decoder (`model.layers.N.self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`)."""
    plan: dict[str, ParallelStyle] = {}
    if shard_vocab:
        # rows of the embedding table by vocabulary id (out-of-range ids masked, partial sums
        # all-reduced); the head's output columns by vocabulary id, left sharded for the loss
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        plan["lm_head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    for i in range(len(_decoder_layers(model))):
        prefix = f"model.layers.{i}"
        for name in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ):
            plan[f"{prefix}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"{prefix}.{name}"] = RowwiseParallel()
    return plan


def _qk_norm_plan(model: nn.Module, shard_vocab: bool) -> dict[str, ParallelStyle]:
    """Qwen3: RMSNorm over each head's q and k. A rank sees only its heads, so the norm weight's
    gradient is a partial sum: as a DTensor over inputs sharded on the head dimension (dim 2 of
    `[batch, seq, heads, head_dim]`), the sum over ranks is taken for it."""
    plan = _decoder_plan(model, shard_vocab)
    for i in range(len(_decoder_layers(model))):
        for name in ("q_norm", "k_norm"):
            plan[f"model.layers.{i}.self_attn.{name}"] = SequenceParallel(
                sequence_dim=2, use_local_output=True
            )
    return plan


TP_FAMILIES: dict[str, Callable[[nn.Module, bool], dict[str, ParallelStyle]]] = {
    "llama": _decoder_plan,
    "qwen2": _decoder_plan,
    "qwen3": _qk_norm_plan,
}


def _family(model: nn.Module) -> str:
    family = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    if family not in TP_FAMILIES:
        raise ConfigError(
            f"parallel.tp: tensor parallel has a plan for {', '.join(sorted(TP_FAMILIES))}, "
            f"not for {family!r}; train this model with parallel.tp=1"
        )
    return family


def check_tp_degree(config: object, tp: int) -> None:
    """`tp` must divide the attention heads, the KV heads and the MLP width (a plain head split)."""
    if tp == 1:
        return
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, field, None)
        if value is not None and value % tp:
            raise ConfigError(
                f"parallel.tp: {tp} does not divide the model's {field} ({value}); "
                f"choose a tp that divides it"
            )


def tp_plan(model: nn.Module, shard_vocab: bool = True) -> dict[str, ParallelStyle]:
    return TP_FAMILIES[_family(model)](model, shard_vocab)


def _tied(model: PreTrainedModel) -> bool:
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and head.weight is embed.weight


def apply_tp(model: Model, tp_mesh: DeviceMesh, shard_vocab: bool = True) -> Model:
    """Split the model over `tp_mesh` in place (a no-op on a mesh of one)."""
    if tp_mesh.size() == 1:
        return model
    plan = lora_tp_plan(model, tp_plan(model, shard_vocab))  # adapters split like their base layers
    check_tp_degree(model.config, tp_mesh.size())
    tied = _tied(model)
    parallelize_module(model, tp_mesh, plan)
    head = model.get_output_embeddings()
    if tied and shard_vocab:
        # both styles shard the (vocab, hidden) table by rows: one parameter serves both again
        head.weight = model.get_input_embeddings().weight
    elif tied:
        assert head.weight is model.get_input_embeddings().weight
    logger.info(
        "tensor parallel over %d ranks (vocabulary %s)",
        tp_mesh.size(),
        "sharded" if shard_vocab else "replicated",
    )
    return model


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: modules of a class Transformers says must not be split."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        layers = getattr(getattr(model, "model", None), "layers", None)
        blocks = list(layers) if layers is not None else []
    return blocks


def apply_fsdp(model: Model, dp_mesh: DeviceMesh, param_dtype: torch.dtype | None = None) -> Model:
    """`fully_shard` each transformer block, then the root (embeddings, final norm, head).

    FSDP averages gradients over the data-parallel ranks; the loss is normalised by the global
    token count, so the caller scales each rank's loss by the data-parallel degree (see
    `update.py`) to get the summed, i.e. the single-process, gradient. (A divide factor of 1
    would say the same, but gloo has no PREMUL_SUM.)
    """
    # fully_shard's own default policy where the parameters keep their dtype
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    policy = mp or MixedPrecisionPolicy()
    # one rank: keep the gathered parameters from forward to backward (nothing to save by freeing
    # them, and the prompt and completion forwards of a micro-batch then gather only once)
    reshard = dp_mesh.size() > 1
    for block in _blocks(model):
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
    # the root (embeddings, final norm, head) stays gathered from forward to backward, as FSDP's
    # own default does for a root: its backward needs it at once, and the log-probs apply the
    # head after the forward, in chunks (see `logprobs.py`)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False, mp_policy=policy)
    return model


def parallelize(
    model: Model, dims: ParallelDims, param_dtype: torch.dtype | None = None, shard_vocab: bool = True
) -> Model:
    """Tensor parallel on `dims.tp_mesh`, then FSDP2 on `dims.dp_mesh` (torchtitan's order)."""
    apply_tp(model, dims.tp_mesh, shard_vocab)
    return apply_fsdp(model, dims.dp_mesh, param_dtype)
