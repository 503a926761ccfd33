"""Engine configuration: defaults that run on a 2-core laptop CPU, and the command-line flags built from them.

Each option is declared once, with its help text; `EngineConfig.add_arguments` makes the flags of every
command that builds an engine (`generate`, `serve`, `env eval`, `train`), `from_args` reads back the ones
given, and `from_dict` reads a config file's section, naming any unknown key.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vriksha.errors import ConfigError

_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
DTYPES = ("auto", "fastest", "float32", "bfloat16", "float16")
SPECULATIVE_METHODS = ("none", "ngram")
PACKED_ACTIVATIONS = ("auto", "float32", "int16", "int8")
NATIVE_DECODE = ("auto", "on", "off")
GRAMMAR_OVERLAP = ("auto", "on", "off")
FRONT_END_CORE = ("auto", "on", "off")
CUDA_GRAPHS = ("auto", "on", "off")


def option(
    default: Any, help: str, *, flag: str | None = None, choices: tuple[str, ...] | None = None
) -> Any:
    """A config field with its command-line help; `flag` overrides the flag's name (`--<flag>`)."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


@dataclass(slots=True)
class EngineConfig:
    model: str | None = option(
        None, "a local Transformers directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)"
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
    host_malloc_tuning: bool = option(
        True, "on the CPU under glibc: keep freed memory mapped for the next step (malloc's mmap threshold "
        "32 MiB, trim threshold 1 GiB) instead of faulting in fresh pages every step; left alone where MALLOC_* "
        "variables or a preloaded tcmalloc/jemalloc/mimalloc say otherwise (docs/engine.md)"
    )  # fmt: skip
    cuda_graphs: str = option(
        "auto", "on a CUDA device: decode-only steps replayed from CUDA graphs captured at load, one per batch "
        "size up to --cuda-graph-max-batch (a step is padded to the next size); auto: where the lean forward and "
        "a decode attention reading the KV pool in place (the triton kernel set) run; on: any model (a forward "
        "that cannot be captured falls back to eager, with the reason logged); off: every step eager",
        choices=CUDA_GRAPHS,
    )  # fmt: skip
    cuda_graph_max_batch: int = option(64, "largest decode batch replayed from a CUDA graph (--cuda-graphs)")
    native_kernels: bool = option(
        True, "compile and use the engine's C kernels (CPU fp32/bf16 decode attention over the KV pool in "
        "place, bandwidth-bound linear layers, fused norms); off: torch's kernels only"
    )  # fmt: skip
    kernels: str = option(
        "auto", "kernel set bound to the engine's layers (RMSNorm, SiLU gating, rotary, decode attention, "
        "linear): auto (the best this device and dtype have), torch, native, native-<isa> (docs/kernels.md)"
    )  # fmt: skip
    kernel_layers: str | None = option(
        None, "layers from local kernel repositories in the `kernels` package's format, bound in place of "
        "the model's: NAME=DIR[:LAYER],... e.g. RMSNorm=/opt/kernels/rmsnorm (no hub access)"
    )  # fmt: skip
    fp32_precision: str = option(
        "auto", "fp32 engines on the CPU: bf16 lets a linear layer's calls run in bf16 arithmetic with fp32 sums "
        "(oneDNN, AMX or AVX512-BF16) at the batch sizes where that measured faster (logits move about as far as "
        "a bf16 model's), ieee keeps strict fp32; auto: bf16 under --dtype fastest, else ieee",
        choices=("auto", "ieee", "bf16"),
    )  # fmt: skip
    kv_cache_dtype: str = option(
        "auto", "KV pool dtype: auto (bfloat16 for a float32 engine allowed bf16 arithmetic by --fp32-precision, "
        "else the engine's dtype), float32, bfloat16, float16; bfloat16 under a float32 engine reads half the "
        "bytes in decode attention and holds twice the tokens (K/V rounded to bf16, the rest fp32)",
        choices=("auto", "float32", "bfloat16", "float16"),
    )  # fmt: skip
    quantization: str = option(
        "auto", "linear weights served packed: gguf (the GGUF file's Q4_0/Q4_1/Q8_0 blocks), int8 (weight-only, "
        "per output channel, any model), none (fp32), auto (the GGUF's blocks where measured faster on this "
        "CPU, else none)", choices=("none", "gguf", "int8", "auto"),
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
    speculative: str = option(
        "none",
        "speculative decoding: ngram proposes the tokens that followed the sequence's last n-gram earlier in "
        "the same sequence, verified by the model in one forward (greedy and seeded outputs unchanged)",
        choices=SPECULATIVE_METHODS,
    )
    num_speculative_tokens: int = option(4, "most tokens proposed per request and step (with --speculative)")
    ngram_min: int = option(2, "shortest n-gram the ngram proposer matches")
    ngram_max: int = option(4, "longest n-gram the ngram proposer matches (the longest that matches wins)")
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
    grammar_max_bytes: int = option(
        512 * 1024,
        "structured outputs: largest compiled grammar of one request, in bytes; larger ones get 400",
    )
    grammar_max_branches: int = option(
        1000, "structured outputs: most alternatives in one anyOf/oneOf/choice of a request; more get 400"
    )

    def __post_init__(self) -> None:
        positive = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "chunked_prefill_size": self.chunked_prefill_size,
            "tensor_parallel_size": self.tensor_parallel_size,
            "num_speculative_tokens": self.num_speculative_tokens,
            "ngram_min": self.ngram_min,
            "ngram_max": self.ngram_max,
            "cuda_graph_max_batch": self.cuda_graph_max_batch,
            "grammar_max_bytes": self.grammar_max_bytes,
            "grammar_max_branches": self.grammar_max_branches,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"engine option {name} must be a positive integer, got {value!r}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 2:
            raise ConfigError(f"engine option kv_cache_tokens must be >= 2, got {self.kv_cache_tokens}")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ConfigError(f"engine option kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"engine option dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(
                f"engine option kv_cache_dtype must be auto, float32, bfloat16 or float16, got {self.kv_cache_dtype!r}"
            )
        if self.fp32_precision not in ("auto", "ieee", "bf16"):
            raise ConfigError(
                f"engine option fp32_precision must be auto, ieee or bf16, got {self.fp32_precision!r}"
            )
        if self.quantization not in ("none", "gguf", "int8", "auto"):
            raise ConfigError(
                f"engine option quantization must be none, gguf, int8 or auto, got {self.quantization!r}"
            )
        if self.packed_activations not in PACKED_ACTIVATIONS:
            raise ConfigError(
                f"engine option packed_activations must be one of {', '.join(PACKED_ACTIVATIONS)}, "
                f"got {self.packed_activations!r}"
            )
        if self.native_decode not in NATIVE_DECODE:
            raise ConfigError(
                f"engine option native_decode must be one of {', '.join(NATIVE_DECODE)}, got {self.native_decode!r}"
            )
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise ConfigError(
                f"engine option cuda_graphs must be one of {', '.join(CUDA_GRAPHS)}, got {self.cuda_graphs!r}"
            )
        if self.speculative not in SPECULATIVE_METHODS:
            raise ConfigError(
                f"engine option speculative must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.speculative!r}"
            )
        if self.front_end_core not in FRONT_END_CORE:
            raise ConfigError(
                f"engine option front_end_core must be one of {', '.join(FRONT_END_CORE)}, "
                f"got {self.front_end_core!r}"
            )
        if self.grammar_overlap not in GRAMMAR_OVERLAP:
            raise ConfigError(
                f"engine option grammar_overlap must be one of {', '.join(GRAMMAR_OVERLAP)}, "
                f"got {self.grammar_overlap!r}"
            )
        if self.ngram_min > self.ngram_max:
            raise ConfigError(
                f"engine option ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            self.max_num_batched_tokens = self.max_num_seqs

    # ---- command line ------------------------------------------------------------------------------
    @classmethod
    def add_arguments(
        cls, parser: argparse.ArgumentParser, exclude: Iterable[str] = (), title: str = "engine"
    ) -> None:
        """One flag per option (booleans as --x / --no-x); only flags given reach `from_args`."""
        group = parser.add_argument_group(title)
        skip = set(exclude)
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            kind = _kind(f)
            help_text = f.metadata["help"]
            if f.default is not None and "(default" not in help_text:
                help_text += (
                    f" (default: {'on' if f.default is True else 'off' if f.default is False else f.default})"
                )
            kwargs: dict[str, Any] = {
                "dest": _dest(f.name),
                "default": argparse.SUPPRESS,
                "help": help_text.replace("%", "%%"),
            }
            if kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = kind
                kwargs["metavar"] = f.name.upper() if f.metadata["choices"] is None else None
                if f.metadata["choices"] is not None:
                    kwargs["choices"] = f.metadata["choices"]
            group.add_argument(f"--{_flag(f)}", **kwargs)

    @classmethod
    def given_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The engine options given on the command line, by field name."""
        fields = dataclasses.fields(cls)
        return {f.name: getattr(args, _dest(f.name)) for f in fields if hasattr(args, _dest(f.name))}

    @classmethod
    def from_args(cls, args: argparse.Namespace, **defaults: Any) -> EngineConfig:
        """The config from parsed flags; `defaults` apply where a flag was not given."""
        return cls(**{**defaults, **cls.given_args(args)})

    # ---- config files ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> EngineConfig:
        """The config from a mapping (a config file's section); unknown keys and wrong types are named."""
        data = dict(data or {})
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown engine option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"the options are {', '.join(known)}"
            )
        for name, value in data.items():
            kind = _kind(known[name])
            if value is None and known[name].default is None:
                continue
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                data[name] = float(value)
            elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ConfigError(f"engine option {name} must be a {kind.__name__}, got {value!r}")
        return cls(**data)

    def to_dict(self, changed_only: bool = False) -> dict[str, Any]:
        """The options as plain data; `changed_only`: those that differ from the defaults."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if changed_only:
            out = {k: v for k, v in out.items() if v != _DEFAULTS[k]}
        return out


def _kind(f: dataclasses.Field) -> type:
    names = [t.strip() for t in str(f.type).split("|") if t.strip() != "None"]
    return _TYPES[names[0]]


def _dest(name: str) -> str:
    return f"engine_{name}"  # apart from a command's own options (`generate --seed` seeds requests)


def _flag(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or f.name.replace("_", "-")


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
