"""Engine configuration: defaults that run on a 2-core laptop CPU."""

from __future__ import annotations

from dataclasses import dataclass

from vriksha.errors import ConfigError


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct
    dtype: str = "float32"
    device: str | None = None  # None: the current accelerator if there is one, else the CPU
    kv_cache_memory_gb: float | None = None  # None: 1 GiB on the CPU (pages are touched only as slots fill), 40% of free memory on an accelerator
    max_num_seqs: int = 256  # running requests at once
    max_num_batched_tokens: int = 1024  # tokens one forward pass computes (decode tokens + prefill chunks)
    chunked_prefill_size: int = 512  # at most this many prompt tokens of one request per step
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    fast_linear: bool = True  # pick the fastest matmul path per linear-layer shape on the CPU
    fast_forward: bool = True  # Llama/Qwen2/Qwen3: the engine's lean loop over the model's modules
    native_kernels: bool = True  # CPU fp32: compiled decode attention and bandwidth-bound linear kernels
    lpm_max_queue: int = 128  # order the waiting queue by longest prefix match up to this length, else FCFS
    in_batch_prefix_min: int = 32  # defer a prompt sharing this many uncached tokens with one admitted this step
    seed: int = 0

    def __post_init__(self) -> None:
        positive = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "chunked_prefill_size": self.chunked_prefill_size,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"engine option {name} must be a positive integer, got {value!r}")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ConfigError(f"engine option kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"engine option dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            self.max_num_batched_tokens = self.max_num_seqs
