"""Engine configuration: defaults that run on a 2-core laptop CPU, and the command-line flags built from them.

Each option is declared once, with its help text (`vriksha/options.py`): `EngineConfig.add_arguments` makes the
flags of every command that builds an engine (`generate`, `serve`, `env eval`, `train`), `from_args` reads
back the ones given, and `from_dict` reads a config file's section, naming any unknown key.

The options that tune the engine to the machine (kernels, linear paths, native decode, CUDA graphs, fp32
precision, packed activations, malloc, threads) form the nested `platform` section (`PlatformConfig`); the
serving options (model, memory, batching, caching, speculation, parallelism) sit at the top. Every option keeps
its flag (`--native-decode`, not `--platform-native-decode`), and takes its name in code (`LLM(native_decode=
"off")`, `EngineConfig.from_flat(...)`) and in a config file, where the section may also be written out
(`platform: {native_decode: "off"}`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vriksha.errors import ConfigError
from vriksha.options import Options, option, section

DTYPES = ("auto", "fastest", "float32", "bfloat16", "float16")
SPECULATIVE_METHODS = ("none", "ngram")
PACKED_ACTIVATIONS = ("auto", "float32", "int16", "int8")
NATIVE_DECODE = ("auto", "on", "off")
GRAMMAR_OVERLAP = ("auto", "on", "off")
FRONT_END_CORE = ("auto", "on", "off")
CUDA_GRAPHS = ("auto", "on", "off")
FP32_PRECISION = ("auto", "ieee", "bf16")
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATION = ("none", "gguf", "int8", "auto")
KV_TIER_DTYPES = ("int8", "float32")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"engine option {name} must be one of {', '.join(allowed)}, got {value!r}")


def _positive(values: dict[str, object]) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"engine option {name} must be a positive integer, got {value!r}")


@dataclass(slots=True)
class PlatformConfig(Options):
    """How the engine runs on this machine: its kernels, linear paths, forward paths and process settings.
    Decided once at load into the platform plan (`engine/platform/plan.py`)."""

    options_label = "engine"
    flag_dest_prefix = "engine_"

    kernels: str = option(
        "auto", "kernel set bound to the engine's layers (RMSNorm, SiLU gating, rotary, decode attention, "
        "linear): auto (the best this device and dtype have), torch, native, native-<isa> (docs/kernels.md)"
    )  # fmt: skip
    native_kernels: bool = option(
        True, "compile and use the engine's C kernels (CPU fp32/bf16 decode attention over the KV pool in "
        "place, bandwidth-bound linear layers, fused norms); off: torch's kernels only"
    )  # fmt: skip
    kernel_layers: str | None = option(
        None, "layers from local kernel repositories in the `kernels` package's format, bound in place of "
        "the model's: NAME=DIR[:LAYER],... e.g. RMSNorm=/opt/kernels/rmsnorm (no hub access)"
    )  # fmt: skip
    fast_linear: bool = option(True, "pick the fastest matmul path per linear-layer shape on the CPU")
    fast_forward: bool = option(
        True,
        "Llama/Qwen2/Qwen3: the engine's lean loop over the model's modules instead of the Transformers forward",
    )
    native_decode: str = option(
        "auto", "decode steps of Llama/Qwen2/Qwen3 on the CPU in float32 with the native kernels: every decoder "
        "layer in one native call; auto: for the batch sizes where it measured faster at load, on: up to 64 "
        "requests, off: the lean Python loop", choices=NATIVE_DECODE,
    )  # fmt: skip
    cuda_graphs: str = option(
        "auto", "on a CUDA device: decode-only steps replayed from CUDA graphs captured at load, one per batch "
        "size up to --cuda-graph-max-batch (a step is padded to the next size); auto: where the lean forward and "
        "a decode attention reading the KV pool in place (the triton kernel set) run; on: any model (a forward "
        "that cannot be captured falls back to eager, with the reason logged); off: every step eager",
        choices=CUDA_GRAPHS,
    )  # fmt: skip
    cuda_graph_max_batch: int = option(64, "largest decode batch replayed from a CUDA graph (--cuda-graphs)")
    fp32_precision: str = option(
        "auto", "fp32 engines on the CPU: bf16 lets a linear layer's calls run in bf16 arithmetic with fp32 sums "
        "(oneDNN, AMX or AVX512-BF16) at the batch sizes where that measured faster (logits move about as far as "
        "a bf16 model's), ieee keeps strict fp32; auto: bf16 under --dtype fastest, else ieee",
        choices=("auto", "ieee", "bf16"),
    )  # fmt: skip
    packed_activations: str = option(
        "auto", "activations of the packed kernels: float32 (as they are: the dequantized model's numbers at "
        "every batch size), or rounded per block of 32 where that measures faster: int16 (1/65534 of the "
        "block's largest; logits within about 1e-3 of the dequantized model's), int8 (1/254, llama.cpp's Q8 "
        "numerics: on CPUs with AVX2 or AVX-512 VNNI, linears up to 1.9x faster; logits move about as far as a "
        "bf16 model's, so greedy outputs may differ, and with the batch); auto: int8 under --dtype fastest "
        "(unless --fp32-precision ieee) or --fp32-precision bf16, else float32",
        choices=PACKED_ACTIVATIONS,
    )  # fmt: skip
    host_malloc_tuning: bool = option(
        True, "on the CPU under glibc: keep freed memory mapped for the next step (malloc's mmap threshold "
        "32 MiB, trim threshold 1 GiB) instead of faulting in fresh pages every step; left alone where MALLOC_* "
        "variables or a preloaded tcmalloc/jemalloc/mimalloc say otherwise (docs/engine.md)"
    )  # fmt: skip
    front_end_core: str = option(
        "auto",
        "on the CPU: run small steps (at most 16 tokens: decode batches) on one thread fewer, leaving a core to "
        "the server's event loop and local clients, whose wake-ups otherwise stall the steps' OpenMP barriers; "
        "larger steps use every thread; auto: on when a server drives the engine, off for offline generate",
        choices=FRONT_END_CORE,
    )
    grammar_overlap: str = option(
        "auto",
        "structured outputs: compute step t+1's grammar masks while step t's forward runs (on), or just before "
        "sampling (off); auto: on with an accelerator or with CPU cores torch does not use, else on for steps of "
        "4 or more constrained sequences",
        choices=GRAMMAR_OVERLAP,
    )

    def __post_init__(self) -> None:
        _positive({"cuda_graph_max_batch": self.cuda_graph_max_batch})
        if self.fp32_precision not in FP32_PRECISION:
            raise ConfigError(
                f"engine option fp32_precision must be auto, ieee or bf16, got {self.fp32_precision!r}"
            )
        for name, allowed in (
            ("packed_activations", PACKED_ACTIVATIONS),
            ("native_decode", NATIVE_DECODE),
            ("cuda_graphs", CUDA_GRAPHS),
            ("front_end_core", FRONT_END_CORE),
            ("grammar_overlap", GRAMMAR_OVERLAP),
        ):
            _one_of(name, getattr(self, name), allowed)


@dataclass(slots=True)
class EngineConfig(Options):
    options_label = "engine"
    flag_dest_prefix = "engine_"  # apart from a command's own options (`generate --seed` seeds requests)

    model: str | None = option(
        None,
        "a local Transformers directory, a .gguf file, or a packaged model's name (`vriksha models list`: "
        "qwen2.5-coder-0.5b-instruct, ...); default: the embedded SmolLM2-135M-Instruct",
    )
    dtype: str = option(
        "auto", "weights and KV dtype; auto: the model's own numbers (float32 on the CPU, a GGUF dequantized to "
        "float32; on an accelerator the checkpoint's dtype); fastest: the fastest dtype here, measured once per "
        "CPU/device and cached, and with it bf16 arithmetic for fp32 matmuls and int8 activations in the packed "
        "kernels where they measure faster (logits move about as far as a bf16 model's: greedy outputs and "
        "log-probs may differ from the model's, and with the batch)",
        choices=DTYPES,
    )  # fmt: skip
    device: str | None = option(None, "cpu, cuda, cuda:1, ... (default: the accelerator if there is one)")
    kv_cache_memory_gb: float | None = option(
        None, "KV pool size in GiB (default: 1 on the CPU, pages touched only as slots fill; 40% of free "
        "memory on an accelerator)"
    )  # fmt: skip
    kv_cache_tokens: int | None = option(
        None, "KV pool size in tokens, whatever the KV dtype (overrides --kv-cache-memory-gb)"
    )
    max_num_seqs: int = option(256, "most requests running at once")
    max_num_batched_tokens: int = option(
        1024, "most tokens one forward pass computes (decode tokens + prefill chunks)"
    )
    chunked_prefill_size: int = option(512, "most prompt tokens of one request per step")
    max_model_len: int | None = option(None, "context limit (default: the model's max_position_embeddings)")
    enable_prefix_caching: bool = option(
        True, "share prompt prefixes through the radix cache", flag="prefix-caching"
    )
    session_pin_fraction: float = option(
        0.5, "most of the KV pool that open sessions may keep pinned against eviction (their latest prefix); "
        "past it the youngest session's pin gives way (older sessions stay resident); 0: sessions pin nothing"
    )  # fmt: skip
    session_timeout_s: float = option(
        300.0, "seconds a session may stay idle (no request) before its pin is released"
    )
    kv_tier_tokens: int = option(
        0, "tokens of a second KV tier in host memory below the pool: evicted prefixes are written there and "
        "loaded back on a hit instead of being recomputed (0: off)"
    )  # fmt: skip
    kv_tier_dtype: str = option(
        "int8", "the second KV tier's storage: int8 (a quarter of fp32, one scale per token and head) or "
        "float32 (exact)", choices=KV_TIER_DTYPES
    )  # fmt: skip
    kv_cache_dtype: str = option(
        "auto", "KV pool dtype: auto (bfloat16 for a float32 engine allowed bf16 arithmetic by --fp32-precision, "
        "else the engine's dtype), float32, bfloat16, float16; bfloat16 under a float32 engine reads half the "
        "bytes in decode attention and holds twice the tokens (K/V rounded to bf16, the rest fp32)",
        choices=("auto", "float32", "bfloat16", "float16"),
    )  # fmt: skip
    quantization: str = option(
        "auto", "linear weights served packed: gguf (the GGUF file's Q4_0/Q4_1/Q8_0/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K "
        "blocks), int8 (weight-only, per output channel, any model), none (fp32), auto (the GGUF's blocks where "
        "measured faster on this CPU, else none)", choices=("none", "gguf", "int8", "auto"),
    )  # fmt: skip
    lpm_max_queue: int = option(
        128,
        "order the waiting queue by longest cached prefix up to this many requests, else first come first served",
    )
    in_batch_prefix_min: int = option(
        32, "defer a prompt sharing this many uncached tokens with one admitted in the same step"
    )
    seed: int = option(0, "seed of the sampler for requests without their own seed", flag="engine-seed")
    tensor_parallel_size: int = option(
        1, "ranks the engine runs on (spawned processes): each holds 1/N of the attention heads, MLP columns "
        "and KV pool; Llama, Qwen2 and Qwen3 models loaded from a path"
    )  # fmt: skip
    enable_lora: bool = option(
        False, "serve LoRA adapters: a request names one through `model`; each step adds every adapter's "
        "low-rank product to its own rows after the base linear (steps with adapter rows skip the native decode "
        "loop)"
    )  # fmt: skip
    max_loras: int = option(
        4, "most LoRA adapters loaded at once (--enable-lora), versions still in use by requests included: "
        "keep it >= max_staleness + 1 when a trainer swaps adapter versions in"
    )  # fmt: skip
    max_lora_rank: int = option(64, "largest LoRA rank an adapter may have (--enable-lora)")
    speculative: str = option(
        "none",
        "speculative decoding: ngram proposes the tokens that followed the sequence's last n-gram earlier in "
        "the same sequence, verified by the model in one forward (greedy and seeded outputs unchanged)",
        choices=SPECULATIVE_METHODS,
    )
    num_speculative_tokens: int = option(4, "most tokens proposed per request and step (with --speculative)")
    ngram_min: int = option(2, "shortest n-gram the ngram proposer matches")
    ngram_max: int = option(4, "longest n-gram the ngram proposer matches (the longest that matches wins)")
    grammar_max_bytes: int = option(
        512 * 1024,
        "structured outputs: largest compiled grammar of one request, in bytes; larger ones get 400",
    )
    grammar_max_branches: int = option(
        1000, "structured outputs: most alternatives in one anyOf/oneOf/choice of a request; more get 400"
    )
    platform: PlatformConfig = section(
        PlatformConfig, "platform (kernels, linear and forward paths, precision, threads, malloc)"
    )

    def __post_init__(self) -> None:
        _positive(
            {
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "chunked_prefill_size": self.chunked_prefill_size,
                "tensor_parallel_size": self.tensor_parallel_size,
                "num_speculative_tokens": self.num_speculative_tokens,
                "ngram_min": self.ngram_min,
                "ngram_max": self.ngram_max,
                "grammar_max_bytes": self.grammar_max_bytes,
                "grammar_max_branches": self.grammar_max_branches,
                "max_loras": self.max_loras,
                "max_lora_rank": self.max_lora_rank,
            }
        )
        if self.enable_lora and self.tensor_parallel_size > 1:
            raise ConfigError(
                "--enable-lora does not work with tensor parallel yet; use --tensor-parallel-size 1"
            )
        if self.enable_lora and getattr(self.platform, "kernel_layers", None):
            raise ConfigError(
                "--enable-lora does not work with --kernel-layers (a bound layer may bypass the adapted linears)"
            )
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 2:
            raise ConfigError(f"engine option kv_cache_tokens must be >= 2, got {self.kv_cache_tokens}")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ConfigError(f"engine option kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        _one_of("dtype", self.dtype, DTYPES)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"engine option kv_cache_dtype must be auto, float32, bfloat16 or float16, got {self.kv_cache_dtype!r}"
            )
        if self.quantization not in QUANTIZATION:
            raise ConfigError(
                f"engine option quantization must be none, gguf, int8 or auto, got {self.quantization!r}"
            )
        if not 0.0 <= self.session_pin_fraction <= 1.0:
            raise ConfigError(
                f"engine option session_pin_fraction must be between 0 and 1, got {self.session_pin_fraction}"
            )
        if self.session_timeout_s <= 0:
            raise ConfigError(f"engine option session_timeout_s must be > 0, got {self.session_timeout_s}")
        if self.kv_tier_tokens < 0:
            raise ConfigError(
                f"engine option kv_tier_tokens must be >= 0 (0: off), got {self.kv_tier_tokens}"
            )
        _one_of("kv_tier_dtype", self.kv_tier_dtype, KV_TIER_DTYPES)
        _one_of("speculative", self.speculative, SPECULATIVE_METHODS)
        if not isinstance(self.platform, PlatformConfig):
            raise ConfigError(f"engine option platform must be a PlatformConfig, got {self.platform!r}")
        if self.ngram_min > self.ngram_max:
            raise ConfigError(
                f"engine option ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            self.max_num_batched_tokens = self.max_num_seqs
