"""Decode steps with every decoder layer in one native call (`native/layers.c`), for Llama/Qwen2/Qwen3 on the CPU.

At small decode batches the lean forward (`fast_forward.py`) spends more time around its kernels than in them:
a dozen ctypes calls, views and allocations per layer, a Python attention function with its own bookkeeping.
Here the same kernels run in the same order from one C loop over the layers, with each layer's weight, norm
and KV-pool pointers prepared once: the embedding, the rotary table, the final norm and the LM head stay in
Python (one call each per step). A linear layer runs packed where `QuantLinear` routes that batch size to its
packed kernel, else on its float32 weight with the native linear kernel.

It takes a step only when every token is a decode row (no draft run), at most `max_batch` of them (short
prefill chunks become decode rows: `ModelRunner._chunks_as_decode_rows`); every other step, and every model
or setting it does not cover, takes the lean forward.
`EngineConfig.native_decode`: `auto` measures both paths on a synthetic decode step the first time a model of
these shapes starts on this CPU, thread count and kernel set (the choice is kept in the cache dir as
`native_decode.json`), and uses this one up to the largest measured batch size where it was faster; `on` up
to 64; `off` never.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import time
from pathlib import Path

import torch
from torch import nn

import vriksha.device as devices
from vriksha import timing_load
from vriksha.cache import read_json, write_json
from vriksha.cpu_features import cpu_features
from vriksha.engine import native
from vriksha.engine.attention import AttentionBatch
from vriksha.engine.fast_forward import FastForward, unsupported_reason
from vriksha.engine.kv_pool import KVPool
from vriksha.engine.native import isa
from vriksha.engine.native.quant import KINDS, PATHS
from vriksha.engine.quant_linear import BUCKETS, QuantLinear, bucket_index
from vriksha.engine.quant_linear import source_digest as quant_source_digest
from vriksha.profiling.annotate import native_call

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "native" / "layers.c"
MAX_BATCH = 64  # the most decode tokens one native step takes
MEASURE_BATCHES = (1, 8, 64)
CACHE_FILE = "native_decode.json"
WHAT = "native decode"


def choice_key(
    model: nn.Module, kernels, quant: QuantLinear | None, pool: KVPool, bf16_matmuls: bool = False
) -> str:
    """What `auto`'s measurement depends on: the layers' shapes and dtypes, which of them are packed and how,
    the KV pool's layout, the kernel set, whether the lean path's fp32 matmuls may run in bf16 arithmetic,
    the CPU, the thread count, torch and this module's C source."""
    parts = [f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in model.named_parameters()]
    if bf16_matmuls:
        parts.append("fp32 matmuls:bf16")
    if quant is not None:
        parts += [f"packed:{w.qtype}:{w.out_features}x{w.in_features}" for _, w in quant.layers]
        parts.append(f"packed kernels:{quant.kernels.variant}:{quant_source_digest()}")
    parts.append(f"pool:{pool.num_slots}:{getattr(pool, 'dtype', '')}")
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    source = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return (
        f"v1|{cpu_features().signature}|t{torch.get_num_threads()}|torch {torch.__version__}|"
        f"{getattr(kernels, 'name', type(kernels).__name__)}|{source}|{digest}"
    )


def cached_choice(key: str) -> dict | None:
    """The kept `auto` choice for `key` ({"max_batch", "timings"}), or None (also where it was timed under
    load: `vriksha/timing_load.py`)."""
    record = read_json(CACHE_FILE).get(key)
    if not timing_load.usable(WHAT, key, record) or not isinstance(record.get("max_batch"), int):
        return None
    return record


def store_choice(key: str, max_batch: int, timings: list[str], watch: timing_load.LoadWatch) -> None:
    """Keep the choice measured since `watch` started, with the machine's load meanwhile."""
    known = read_json(CACHE_FILE)
    known[key] = timing_load.stamped(WHAT, key, {"max_batch": max_batch, "timings": timings}, watch)
    write_json(CACHE_FILE, known, "the native decode choice")


_PTR, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Linear(ctypes.Structure):
    _fields_ = [
        ("kind", _I64),
        ("weight", _PTR),
        ("scale", _PTR),
        ("bias", _PTR),
        ("out", _I64),
        ("in_", _I64),
        ("path", _I64),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, _Linear) for name in ("q", "k", "v", "o", "gate", "up", "down")),
        *((name, _PTR) for name in ("input_norm", "post_norm", "q_norm", "k_norm")),
        *((name, _F32) for name in ("input_eps", "post_eps", "q_eps", "k_eps", "scale")),
        ("window", _I64),
        ("k_pool", _PTR),
        ("v_pool", _PTR),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        *((name, _PTR) for name in ("linear", "vq_linear", "rms_norm", "rope", "silu_mul", "attention")),
        *(
            (name, _I64)
            for name in ("num_layers", "hidden", "heads", "kv_heads", "head_dim", "v_dim", "inter")
        ),
        ("layers", _PTR),
        ("kv_bf16", _I64),
    ]


@functools.cache
def _library() -> ctypes.CDLL | None:
    def build(compiler: str, variant: isa.Variant) -> Path:
        return native.build(compiler, variant, (SOURCE,), (), "layers")

    loaded = native.load_variant(None, build, "decode steps run the lean Python forward")
    if loaded is None:
        return None
    lib = ctypes.CDLL(str(loaded[0]))
    lib.vl_decode.argtypes = [_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, ctypes.c_int]
    lib.vl_decode.restype = ctypes.c_int
    return lib


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def unsupported(model: nn.Module, kernels, pool: KVPool) -> str | None:
    """Why decode steps of this model cannot run natively here, or None when they can."""
    if _library() is None:
        return "the native layer library could not be built"
    if getattr(kernels, "lib", None) is None:
        return f"kernel set {kernels.name} is not a native one"
    if not devices.is_host(pool.device) or pool.dtype not in (torch.float32, torch.bfloat16):
        return "it runs float32 on the CPU only (over a float32 or bfloat16 KV pool)"
    reason = unsupported_reason(model)
    if reason is not None:
        return reason
    for layer in FastForward(model).layers:
        attn, mlp = layer.self_attn, layer.mlp
        for m in (
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        ):
            if type(m) is not nn.Linear or m.weight.dtype != torch.float32 or not m.weight.is_contiguous():
                return f"a projection of layer {attn.layer_idx} is not a plain float32 nn.Linear"
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [attn.q_norm, attn.k_norm] if hasattr(attn, "q_norm") else []
        if any(getattr(n, "weight", None) is None or n.weight.dtype != torch.float32 for n in norms):
            return "a norm without a float32 weight"
        if getattr(attn, "sinks", None) is not None or getattr(attn, "attn_logit_softcapping", None):
            return "attention terms the native kernel lacks"
    k0, v0 = pool.k[0], pool.v[0]
    if any(
        k.shape[1:] != k0.shape[1:] or v.shape[1:] != v0.shape[1:]
        for k, v in zip(pool.k, pool.v, strict=True)
    ):
        return "layers with different KV shapes"
    return None


class NativeDecode:
    """Callable like `FastForward` on decode-only batches; `accepts(batch)` says which batches it takes."""

    def __init__(self, model: nn.Module, kernels, pool: KVPool, quant: QuantLinear | None) -> None:
        reason = unsupported(model, kernels, pool)
        if reason is not None:
            raise ValueError(f"native decode does not support this model here: {reason}")
        self.model = model
        self.pool = pool
        self.quant = quant
        self.lib = _library()
        self.kernels = kernels
        self.layers = FastForward(model).layers
        self.max_batch = MAX_BATCH
        self._fns = {
            n: _address(kernels.lib._lib, f"{n}_f32") for n in ("linear", "rms_norm", "rope", "silu_mul")
        }
        attention = "decode_attention_f32" if pool.dtype == torch.float32 else "decode_attention_f32q_bf16kv"
        self._fns["attention"] = _address(kernels.lib._lib, attention)
        self._plans: dict[int, tuple[_Model, ctypes.Array, tuple]] = {}  # per packed-kernel bucket

    def refresh(self) -> None:
        """After a weight update: the packed routes may have changed (`QuantLinear.refresh`)."""
        self._plans.clear()

    def accepts(self, batch: AttentionBatch, tokens: int) -> bool:
        return not batch.prefills and 0 < tokens == batch.num_decode <= self.max_batch

    def _linear(self, module: nn.Linear, rows: int) -> _Linear:
        packed = self.quant.packed_for(module, rows, native=True) if self.quant is not None else None
        bias = _ptr(module.bias)
        if packed is None:
            return _Linear(
                -1, module.weight.data_ptr(), None, bias, module.out_features, module.in_features, 0
            )
        weight, path = packed
        return _Linear(
            KINDS[weight.qtype],
            self.quant.kernels.pointer(weight, path),
            _ptr(weight.scale),
            bias,
            weight.out_features,
            weight.in_features,
            PATHS[path],
        )

    def _plan(self, rows: int) -> _Model:
        key = bucket_index(BUCKETS, rows)
        if key in self._plans:
            return self._plans[key][0]
        layers = (_Layer * len(self.layers))()
        for i, layer in enumerate(self.layers):
            attn, mlp, entry = layer.self_attn, layer.mlp, layers[i]
            for name, module in (
                ("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj), ("o", attn.o_proj),
                ("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj),
            ):  # fmt: skip
                setattr(entry, name, self._linear(module, rows))
            entry.input_norm = layer.input_layernorm.weight.data_ptr()
            entry.input_eps = layer.input_layernorm.variance_epsilon
            entry.post_norm = layer.post_attention_layernorm.weight.data_ptr()
            entry.post_eps = layer.post_attention_layernorm.variance_epsilon
            if hasattr(attn, "q_norm"):
                entry.q_norm, entry.q_eps = attn.q_norm.weight.data_ptr(), attn.q_norm.variance_epsilon
                entry.k_norm, entry.k_eps = attn.k_norm.weight.data_ptr(), attn.k_norm.variance_epsilon
            entry.scale = attn.scaling if attn.scaling is not None else attn.head_dim**-0.5
            window = getattr(attn, "sliding_window", None)
            entry.window = int(window) if window else 0
            entry.k_pool = self.pool.k[attn.layer_idx].data_ptr()
            entry.v_pool = self.pool.v[attn.layer_idx].data_ptr()
        k0, v0 = self.pool.k[0], self.pool.v[0]
        quant_kernels = self.quant.kernels if self.quant is not None else None
        plan = _Model(
            self._fns["linear"],
            _address(quant_kernels._lib, "vq_linear") if quant_kernels is not None else None,
            self._fns["rms_norm"],
            self._fns["rope"],
            self._fns["silu_mul"],
            self._fns["attention"],
            len(self.layers),
            self.model.model.embed_tokens.weight.shape[1],
            self.layers[0].self_attn.q_proj.out_features // k0.shape[2],
            k0.shape[1],
            k0.shape[2],
            v0.shape[2],
            self.layers[0].mlp.gate_proj.out_features,
            ctypes.addressof(layers),
            int(self.pool.dtype == torch.bfloat16),
        )
        # the layer array, and every tensor it points into, live as long as the plan
        held = (*self.model.parameters(), *self.pool.k, *self.pool.v)
        self._plans[key] = (plan, layers, held)
        return plan

    def __call__(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        batch: AttentionBatch,
        sample_index: torch.Tensor,
    ) -> torch.Tensor:
        inner = self.model.model
        h = inner.embed_tokens.forward(input_ids)[0].contiguous()  # [B, hidden], updated in place
        cos, sin = inner.rotary_emb(h[None], position_ids=position_ids)
        cos, sin = cos[0].contiguous(), sin[0].contiguous()
        rows = h.shape[0]
        plan = self._plan(rows)
        slots = batch.decode_kv_slots
        done = native_call(self.lib.vl_decode, "decode_layers")(
            ctypes.byref(plan),
            h.data_ptr(),
            rows,
            cos.data_ptr(),
            sin.data_ptr(),
            batch.slot_mapping.data_ptr(),
            slots.data_ptr(),
            batch.decode_kv_lens.data_ptr(),
            slots.shape[1],
            torch.get_num_threads(),
        )
        if done != 0:
            raise RuntimeError(
                f"native decode failed ({'out of memory' if done == -1 else 'a kernel refused'})"
            )
        return self.model.lm_head.forward(self.kernels.rms_norm(h[sample_index], inner.norm))


def time_step(run, repeats: int = 3) -> float:
    """Best seconds of `run()` over `repeats` calls, after one warm-up."""
    run()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def synthetic_decode(
    pool: KVPool, decode_kernel, batch: int, context: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch, torch.Tensor] | None:
    """A decode step of `batch` requests with `context` tokens each on free pool slots (their K/V are
    scratch: a slot is written before any request reads it), or None when the pool is too small."""
    if pool.num_slots <= batch * context:
        return None
    slots = torch.arange(1, batch * context + 1, dtype=torch.int64).view(batch, context)
    lens = torch.full((batch,), context, dtype=torch.int64)
    attn = AttentionBatch(pool=pool, slot_mapping=slots[:, -1].contiguous(), num_decode=batch)
    attn.decode_kernel, attn.decode_kv_slots, attn.decode_kv_lens = decode_kernel, slots, lens
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, batch), generator=generator)
    positions = torch.full((1, batch), context - 1, dtype=torch.int64)
    return ids, positions, attn, torch.arange(batch)
