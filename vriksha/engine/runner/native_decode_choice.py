"""Up to which decode batch size the native decode step runs, decided once at load.

`EngineConfig.platform.native_decode`: `auto` measures the native step against the lean forward on a synthetic decode
step the first time a model of these shapes starts on this CPU, thread count and kernel set (the choice is
kept in the artifact store as `native_decode.json`), and uses it up to the largest measured batch size where it was
faster; `on` up to 64; `off` never.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from vriksha import timing_load
from vriksha.artifact_store import announce_first_load, read_json, write_json
from vriksha.engine.attention.backend import AttentionBackend
from vriksha.engine.attention.batch import AttentionBatch
from vriksha.engine.core.kv_pool import KVPool
from vriksha.engine.platform.cpu_features import cpu_features
from vriksha.engine.platform.packed_linear import PackedLinear
from vriksha.engine.platform.packed_linear import source_digest as quant_source_digest
from vriksha.engine.runner.forward_path import ForwardPath, ForwardScope
from vriksha.engine.runner.native_decode import SOURCE, NativeDecode
from vriksha.engine.runner.step import ForwardStep, StepInputs

logger = logging.getLogger(__name__)

MEASURE_BATCHES = (1, 8, 64)
CACHE_FILE = "native_decode.json"
WHAT = "native decode"


def set_up(
    mode: str,
    model: nn.Module,
    kernels,
    pool: KVPool,
    quant: PackedLinear | None,
    lean: ForwardPath | None,
    attention: AttentionBackend,
    scope: ForwardScope,
    bf16_matmuls: bool,
    excluded: str | None = None,
) -> tuple[NativeDecode | None, str]:
    """The native decode path for `mode` (auto, on, off), or None, and what was decided and why (logs,
    --verbose). `lean`: the lean forward it is measured against (None: the model runs the Transformers
    forward); `excluded`: a setting that rules it out."""
    if mode == "off":
        return None, "off"
    if lean is None:
        return None, "off: the model runs the Transformers forward"
    if excluded is not None:
        return None, f"off: {excluded}"
    try:
        native = NativeDecode(model, kernels, pool, quant, scope)
    except ValueError as exc:
        logger.info("decode steps run the lean forward: %s", exc)
        return None, f"off: {exc}"
    if mode == "on":
        return native, f"on: decode batches up to {native.max_batch}"
    key = choice_key(model, kernels, quant, pool, bf16_matmuls)
    cached = cached_choice(key)
    if cached is not None:
        best, times = cached["max_batch"], cached["timings"]
        how = "cached"
    else:
        announce_first_load()
        watch = timing_load.LoadWatch()
        best, times = measure(native, lean, pool, attention, model.model.embed_tokens.weight.shape[0])
        if times:
            store_choice(key, best, times, watch)
        how = "measured"
    native.max_batch = best
    choice = (
        f"auto ({how}): decode batches up to {best} natively "
        f"({'; '.join(times) or 'not measured: small KV pool'})"
    )
    logger.info("native decode %s", choice)
    return (native if best > 0 else None), choice


def measure(
    native: ForwardPath, lean: ForwardPath, pool: KVPool, attention: AttentionBackend, vocab: int
) -> tuple[int, list[str]]:
    """The largest measured decode batch size up to which the native step was faster, and the timings."""
    best, times = 0, []
    for b in MEASURE_BATCHES:
        inputs = synthetic_decode(pool, attention, b, 16, vocab)
        if inputs is None:
            break
        step = ForwardStep(inputs=inputs)
        lean_s = time_step(lambda step=step: lean(step))
        fused_s = time_step(lambda step=step: native(step))
        times.append(f"batch {b}: {fused_s * 1e3:.2f} ms native vs {lean_s * 1e3:.2f} ms lean")
        if fused_s >= lean_s:
            break
        best = b
    return best, times


def choice_key(
    model: nn.Module, kernels, quant: PackedLinear | None, pool: KVPool, bf16_matmuls: bool = False
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


def time_step(run: Callable[[], object], repeats: int = 3) -> float:
    """Best seconds of `run()` over `repeats` calls, after one warm-up."""
    run()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def synthetic_decode(
    pool: KVPool, attention: AttentionBackend, batch: int, context: int, vocab: int
) -> StepInputs | None:
    """A decode step of `batch` requests with `context` tokens each on free pool slots (their K/V are
    scratch: a slot is written before any request reads it), or None when the pool is too small."""
    if pool.num_slots <= batch * context:
        return None
    slots = torch.arange(1, batch * context + 1, dtype=torch.int64).view(batch, context)
    lens = torch.full((batch,), context, dtype=torch.int64)
    attn = AttentionBatch(
        pool=pool, slot_mapping=slots[:, -1].contiguous(), num_decode=batch, backend=attention
    )
    attn.decode_kv_slots, attn.decode_kv_lens = slots, lens
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, batch), generator=generator)
    positions = torch.full((1, batch), context - 1, dtype=torch.int64)
    return StepInputs(ids, positions, attn, torch.arange(batch))
