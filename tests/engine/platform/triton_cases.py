"""The Triton kernels against torch, run by test_triton_kernels.py in a child process with TRITON_INTERPRET=1
(CPU tensors through Triton's interpreter), or directly on a GPU (benchmarks/gpu_check.sh):

    TRITON_INTERPRET=1 python -m pytest tests/engine/platform/triton_cases.py   # no GPU
    python -m pytest tests/engine/platform/triton_cases.py                      # on the GPU, compiled

Not named test_*.py: the interpreter must be chosen before triton is imported, so this file is never
collected beside the rest of the suite.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

import vriksha.device as devices

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'vriksha[gpu]')", allow_module_level=True)

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = devices.host() if INTERPRETED else devices.default_device()
if devices.is_host(DEVICE) and not INTERPRETED:
    pytest.skip("no GPU for the compiled triton kernels; set TRITON_INTERPRET=1", allow_module_level=True)

from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model  # noqa: E402
from vriksha.engine.attention.batch import AttentionBatch  # noqa: E402
from vriksha.engine.attention.gathering import GatheringAttention  # noqa: E402
from vriksha.engine.platform import kernel_sets, triton_kernels  # noqa: E402
from vriksha.engine.platform.kernel_sets import TorchKernels  # noqa: E402

TORCH = TorchKernels()
# one bf16/fp16 step at the values' scale: the elementwise kernels round where torch rounds, so they differ
# from torch's ops only where float32 math lands within an ulp of a rounding boundary
STEP = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}


def _pool_batch(lens: list[int], kv_heads: int, d: int, dv: int, dtype, seed: int):
    """A pool of random K/V and requests whose tokens sit at scattered slots (slot 0 is padding)."""
    g = torch.Generator().manual_seed(seed)
    slots_total = sum(lens) + 17
    k_pool = torch.randn(slots_total, kv_heads, d, generator=g).to(dtype)
    v_pool = torch.randn(slots_total, kv_heads, dv, generator=g).to(dtype)
    order = torch.randperm(slots_total - 1, generator=g) + 1
    table = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    taken = 0
    for i, n in enumerate(lens):
        table[i, :n] = order[taken : taken + n]
        taken += n
    return k_pool, v_pool, table, torch.tensor(lens, dtype=torch.int64), g


def _reference_decode(q, k_pool, v_pool, table, lens, scale, window):
    """float32 SDPA over the gathered K/V of the pool's values, masked as the engine's torch path masks."""
    batch = AttentionBatch(pool=None, slot_mapping=None, num_decode=len(lens), backend=GatheringAttention())
    batch.decode_kv_slots, batch.decode_kv_lens = table, lens
    b, heads, d = q.shape
    kv_heads = k_pool.shape[1]
    k = k_pool.float()[table.view(-1)].view(b, -1, kv_heads, d).transpose(1, 2)
    v = v_pool.float()[table.view(-1)].view(b, -1, kv_heads, v_pool.shape[-1]).transpose(1, 2)
    o = F.scaled_dot_product_attention(
        q.float()[:, :, None],
        k,
        v,
        attn_mask=batch.decode_mask(window),
        scale=scale,
        enable_gqa=heads != kv_heads,
    )
    return o[:, :, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("window", [None, 7])
def test_decode_attention_over_scattered_pool_slots(dtype, group, window):
    kv_heads, d = 2, 20  # a head size that is not a power of two: masked lanes
    k_pool, v_pool, table, lens, g = _pool_batch([1, 33, 70, 9], kv_heads, d, d, dtype, seed=group)
    q = torch.randn(len(lens), kv_heads * group, d, generator=g).to(dtype)
    scale = d**-0.5
    want = _reference_decode(q, k_pool, v_pool, table, lens, scale, window)
    on = [t.to(DEVICE) for t in (q, k_pool, v_pool, table, lens)]
    got = triton_kernels.decode_attention(*on, scale, window)
    assert got.dtype == torch.float32 and got.shape == want.shape
    # both sum the pool's values in float32: only the order of the sums differs
    torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=1e-5)


def test_decode_attention_head_sizes_differ_and_the_set_hands_it_out():
    k_pool, v_pool, table, lens, g = _pool_batch([5, 40], 1, 16, 24, torch.float32, seed=9)
    q = torch.randn(2, 4, 16, generator=g)
    want = _reference_decode(q, k_pool, v_pool, table, lens, 0.3, None)
    kernel = triton_kernels.TritonKernels().decode_attention_for(torch.float32)
    got = kernel(*[t.to(DEVICE) for t in (q, k_pool, v_pool, table, lens)], 0.3, None)
    torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=1e-5)
    assert triton_kernels.TritonKernels().decode_attention_for(torch.int8) is None


def _assert_within_a_step(got: torch.Tensor, want: torch.Tensor, dtype) -> None:
    got, want = got.cpu().float(), want.float()
    scale = want.abs().clamp_min(1.0)
    assert ((got - want).abs() <= STEP[dtype] * scale).all(), (got - want).abs().max()
    if dtype != torch.float32:
        assert (got == want).float().mean() >= 0.97  # torch's roundings, one bf16 step apart at most


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [48, 40])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_with_the_residual_add_fused(dtype, dim, with_residual):
    torch.manual_seed(dim)
    norm = LlamaRMSNorm(dim, eps=1e-6).to(dtype)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(5, dim).to(dtype)
    residual = torch.randn(5, dim).to(dtype) if with_residual else None
    x_torch = x.clone()
    want = TORCH.rms_norm(x_torch, norm, residual)
    x_triton = x.clone().to(DEVICE)
    got = triton_kernels.TritonKernels().rms_norm(
        x_triton, norm.to(DEVICE), None if residual is None else residual.to(DEVICE)
    )
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(x_triton.cpu(), x_torch)  # the residual added in place, rounded as torch rounds
    _assert_within_a_step(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_gating_across_several_blocks(dtype):
    torch.manual_seed(1)
    gate, up = (torch.randn(3, 50).to(dtype) * 3 for _ in range(2))
    want = TORCH.silu_mul(gate, up)
    got = triton_kernels.silu_mul(gate.to(DEVICE), up.to(DEVICE), block=64)  # 150 values: three programs
    assert got.dtype == dtype
    _assert_within_a_step(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_embedding(dtype):
    torch.manual_seed(2)
    x = torch.randn(5, 3, 16).to(dtype)
    angles = torch.randn(5, 8) * 3
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype)
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype)
    want = TORCH.rope(x, cos, sin)
    got = triton_kernels.TritonKernels().rope(x.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE))
    assert got.dtype == dtype
    _assert_within_a_step(got, want, dtype)


def test_the_set_falls_back_to_torch_where_its_kernels_do_not_fit():
    norm = LlamaRMSNorm(8).to(torch.float64)
    x = torch.randn(2, 8, dtype=torch.float64)
    assert torch.equal(triton_kernels.TritonKernels().rms_norm(x, norm), TORCH.rms_norm(x, norm))
    assert triton_kernels.TritonKernels().decode_attention_for(torch.float64) is None


def test_engine_greedy_tokens_equal_the_torch_set(default_tokenizer):
    """A tiny random Llama (4 query heads over 2 KV heads), prompts prefilled in chunks then decoded: the
    triton set's tokens and log-probs equal the torch set's."""
    from vriksha import LLM, SamplingParams

    assert "triton" in kernel_sets.available(DEVICE, torch.float32)
    model = tiny_model("llama", 512).to(DEVICE)
    prompts = [{"prompt_token_ids": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]}, {"prompt_token_ids": [9, 2, 6]}]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    outs = {}
    for name in ("triton", "torch"):
        llm = LLM.from_module(model, default_tokenizer, kernels=name, **ENGINE_TEST_OPTIONS)
        try:
            assert llm.engine.runner.kernels.name == name
            decode_kernel = llm.engine.runner.attention.decode_kernel
            assert (decode_kernel is triton_kernels.decode_attention) == (name == "triton")
            outs[name] = llm.generate(prompts, params)
        finally:
            llm.close()
    for a, b in zip(outs["triton"], outs["torch"], strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert len(a.outputs[0].token_ids) == 4
        assert a.outputs[0].token_logprobs == pytest.approx(b.outputs[0].token_logprobs, abs=1e-4)


def test_engine_decode_graphs_over_the_triton_decode_attention(default_tokenizer):
    """Decode-only steps through the CUDA-graph path's static buffers (captured on a GPU, eager under the
    interpreter): padded rows, each row's slots read up to its length from a buffer as wide as the context."""
    from vriksha import LLM, SamplingParams
    from vriksha.engine.runner.decode_graphs import DecodeGraphs

    model = tiny_model("llama", 512).to(DEVICE)
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (11, 3, 17)]
    params = [
        SamplingParams(temperature=0, max_tokens=4 + 3 * i, ignore_eos=True, logprobs=0) for i in range(3)
    ]
    outs = {}
    for graphs in (True, False):
        llm = LLM.from_module(
            model,
            default_tokenizer,
            kernels="triton",
            cuda_graphs="auto" if graphs else "off",
            **ENGINE_TEST_OPTIONS,
        )
        try:
            runner = llm.engine.runner
            if graphs and INTERPRETED:
                runner.paths.insert(
                    0,
                    DecodeGraphs(
                        runner.run,
                        runner.model,
                        runner.pool,
                        runner.table.table,
                        runner.attention,
                        8,
                        capture=False,
                    ),
                )
            if graphs:
                assert runner.path(DecodeGraphs) is not None, runner.decode_graphs_choice
                assert INTERPRETED or runner.path(DecodeGraphs).graphs
            outs[graphs] = llm.generate(prompts, params)
        finally:
            llm.close()
    for a, b in zip(outs[True], outs[False], strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].token_logprobs == pytest.approx(b.outputs[0].token_logprobs, abs=1e-4)
