"""Decode steps with every decoder layer in one native call (`native/layers.c`), for Llama/Qwen2/Qwen3 on the CPU.

At small decode batches the lean forward (`runner/lean_forward.py`) spends more time around its kernels than in them:
a dozen ctypes calls, views and allocations per layer, a Python attention function with its own bookkeeping.
Here the same kernels run in the same order from one C loop over the layers, with each layer's weight, norm
and KV-pool pointers prepared once: the embedding, the rotary table, the final norm and the LM head stay in
Python (one call each per step). A linear layer runs packed where `PackedLinear` routes that batch size to its
packed kernel, else on its float32 weight with the native linear kernel.

It takes a step only when every token is a decode row (no draft run), at most `max_batch` of them (short
prefill chunks become decode rows: `StepBuilder.chunks_as_decode_rows`); every other step, and every model
or setting it does not cover, takes the lean forward. Rows on LoRA adapters stay in the call: it adds each
adapter's delta after the base matmul of each adapted projection (`native_lora.py`), for the float32 and the
packed base weights alike; a step with an adapter it cannot add (one adapting a layer it does not run) takes
the lean forward. Up to which batch size it runs is decided at load
(`native_decode_choice.py`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch
from torch import nn

import vriksha.device as devices
from vriksha.engine.attention.batch import AttentionBatch
from vriksha.engine.core.kv_pool import KVPool
from vriksha.engine.platform import native
from vriksha.engine.platform.native import isa
from vriksha.engine.platform.native.quant import KINDS, PATHS
from vriksha.engine.platform.packed_linear import BUCKETS, PackedLinear, bucket_index
from vriksha.engine.runner.forward_path import ForwardScope
from vriksha.engine.runner.lean_forward import decoder_layers, unsupported_reason
from vriksha.engine.runner.native_lora import NativeLoras, StepLora, layer_projections
from vriksha.engine.runner.step import ForwardStep
from vriksha.profiling.annotate import native_call

logger = logging.getLogger(__name__)

SOURCE = Path(native.__file__).with_name("layers.c")
LORA_SOURCE, LORA_HEADER = SOURCE.with_name("lora_delta.c"), SOURCE.with_name("lora_delta.h")
MAX_BATCH = 64  # the most decode tokens one native step takes


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
        return native.build(compiler, variant, (SOURCE, LORA_SOURCE), (LORA_HEADER,), "layers")

    loaded = native.load_variant(None, build, "decode steps run the lean Python forward")
    if loaded is None:
        return None
    lib = ctypes.CDLL(str(loaded[0]))
    lib.vl_decode.argtypes = [_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _I64, ctypes.c_int]
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
    for layer in decoder_layers(model):
        attn = layer.self_attn
        for m in layer_projections(layer):
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
    """A forward path (`forward_path.py`) for steps whose every row is a decode row, up to `max_batch`."""

    name = "native decode"

    def __init__(
        self,
        model: nn.Module,
        kernels,
        pool: KVPool,
        quant: PackedLinear | None,
        scope: ForwardScope | None = None,
    ) -> None:
        reason = unsupported(model, kernels, pool)
        if reason is not None:
            raise ValueError(f"native decode does not support this model here: {reason}")
        self.model = model
        self.pool = pool
        self.quant = quant
        self.lib = _library()
        self.kernels = kernels
        self.layers = decoder_layers(model)
        self.scope = scope if scope is not None else ForwardScope()
        self.max_batch = MAX_BATCH
        self._fns = {
            n: _address(kernels.lib._lib, f"{n}_f32") for n in ("linear", "rms_norm", "rope", "silu_mul")
        }
        attention = "decode_attention_f32" if pool.dtype == torch.float32 else "decode_attention_f32q_bf16kv"
        self._fns["attention"] = _address(kernels.lib._lib, attention)
        self._plans: dict[int, tuple[_Model, ctypes.Array, tuple]] = {}  # per packed-kernel bucket
        lora = self.scope.lora
        self.loras = NativeLoras(lora, self.layers) if lora is not None else None
        self.lora_deltas = True  # False: steps with LoRA rows take the lean forward (for measurements)

    def weights_updated(self) -> None:
        """After a weight update: the packed routes may have changed (`PackedLinear.refresh`)."""
        self._plans.clear()

    def accepts(self, step: ForwardStep) -> bool:
        attn, lora = step.inputs.attn, step.inputs.lora
        return (
            not attn.prefills
            and 0 < step.inputs.num_tokens == attn.num_decode <= self.max_batch
            and (lora is None or (self.lora_deltas and self.loras is not None and self.loras.covers(lora)))
        )

    def __call__(self, step: ForwardStep) -> torch.Tensor:
        i = step.inputs
        lora = None
        if i.lora is not None:
            if self.loras is None:
                raise RuntimeError("a step with LoRA rows reached an engine built without --enable-lora")
            lora = self.loras.step(i.lora, i.num_tokens)
        with self.scope(i.attn):
            return self.logits(i.input_ids, i.position_ids, i.attn, i.sample_index, lora=lora)

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

    def logits(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        batch: AttentionBatch,
        sample_index: torch.Tensor,
        lora: StepLora | None = None,
    ) -> torch.Tensor:
        """`lora`: the step's rows on LoRA adapters (`NativeLoras.step`), None when every row is the base's."""
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
            lora.rows if lora is not None else None,
            lora.rank if lora is not None else 0,
            torch.get_num_threads(),
        )
        if done != 0:
            raise RuntimeError(
                f"native decode failed ({'out of memory' if done == -1 else 'a kernel refused'})"
            )
        return self.model.lm_head.forward(self.kernels.rms_norm(h[sample_index], inner.norm))
