"""Tensor-parallel serving: the engine on N ranks, attention heads, MLP columns and the KV pool split across
them, the scheduler and the sampler on rank 0 (docs/engine.md, "Tensor parallel")."""

from vriksha.engine.tensor_parallel.group import TensorParallelError, TensorParallelGroup
from vriksha.engine.tensor_parallel.shard import check_degree, shard_model

__all__ = ["TensorParallelError", "TensorParallelGroup", "check_degree", "shard_model"]
