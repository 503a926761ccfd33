"""The native CPU kernels against torch's reference math, and the engine with them against the engine without."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.engine.conftest import assert_same_samples, engines_over, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.platform import native
from vriksha.engine.platform.native import isa, kernels


def isa_flags(variant: str) -> list[str]:
    return isa.missing_flags(isa.variant(variant))


@pytest.fixture(scope="module")
def k():
    built = kernels()
    assert built is not None, "the native kernels should build on this machine (gcc is installed)"
    return built


@pytest.mark.parametrize("out_f,in_f", [(576, 576), (7, 5), (193, 577), (64, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_f_linear(k, out_f, in_f, bias):
    gen = torch.Generator().manual_seed(out_f * in_f)
    w = torch.randn(out_f, in_f, generator=gen)
    b = torch.randn(out_f, generator=gen) if bias else None
    for rows in (1, 2, 3, 5, 17):
        x = torch.randn(rows, in_f, generator=gen)
        torch.testing.assert_close(k.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def _reference_attention(q, k_pool, v_pool, slots, lens, scale, window):
    batch, heads, d = q.shape
    kv_heads = k_pool.shape[1]
    out = torch.empty(batch, heads, v_pool.shape[2])
    for b in range(batch):
        n = int(lens[b])
        start = max(0, n - window) if window else 0
        keys = k_pool[slots[b, start:n]].transpose(0, 1)  # [Hkv, n, D]
        values = v_pool[slots[b, start:n]].transpose(0, 1)
        o = F.scaled_dot_product_attention(
            q[b].view(kv_heads, heads // kv_heads, d), keys, values, scale=scale
        )
        out[b] = o.reshape(heads, -1)
    return out


@pytest.mark.parametrize(
    "heads,kv_heads,d", [(9, 3, 64), (4, 4, 16), (8, 1, 24), (8, 2, 40), (16, 4, 128), (2, 1, 32)]
)
@pytest.mark.parametrize("window", [None, 5])
def test_decode_attention_matches_sdpa(k, heads, kv_heads, d, window):
    gen = torch.Generator().manual_seed(heads * 100 + d)
    num_slots = 300
    k_pool = torch.randn(num_slots, kv_heads, d, generator=gen)
    v_pool = torch.randn(num_slots, kv_heads, d, generator=gen)
    lens = torch.tensor([1, 7, 40, 100])
    slots = torch.zeros(len(lens), int(lens.max()), dtype=torch.int64)
    for b, n in enumerate(lens.tolist()):  # each request's slots scattered over the pool, padding slot 0
        slots[b, :n] = torch.randperm(num_slots - 1, generator=gen)[:n] + 1
    q = torch.randn(len(lens), heads, d, generator=gen)
    got = k.decode_attention(q, k_pool, v_pool, slots, lens, d**-0.5, window)
    want = _reference_attention(q, k_pool, v_pool, slots, lens, d**-0.5, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "tokens,prefix,heads,kv_heads,d",
    [(32, 512, 9, 3, 64), (300, 0, 9, 3, 64), (7, 3, 8, 2, 128), (1, 0, 4, 4, 64), (40, 100, 32, 2, 64),
     (5, 17, 6, 6, 16)],
)  # fmt: skip
@pytest.mark.parametrize("variant", ["avx2", "avx512"])
def test_f32_prefill_attention_is_causal_softmax_over_the_pool(variant, tokens, prefix, heads, kv_heads, d):
    """A prompt chunk's queries over its slots in a float32 pool (a cached prefix, then its own K/V): token t
    sees the prefix and its chunk up to itself, as a masked SDPA over the gathered K/V does, within 1e-5."""
    lib = kernels(variant)
    if lib is None:
        pytest.skip(f"this CPU cannot run the {variant} build: needs {', '.join(isa_flags(variant))}")
    gen = torch.Generator().manual_seed(tokens + prefix + d)
    pool_size = 3000
    k_pool = torch.randn(pool_size, kv_heads, d, generator=gen)
    v_pool = torch.randn(pool_size, kv_heads, d, generator=gen)
    slots = torch.randperm(pool_size - 1, generator=gen)[: prefix + tokens] + 1
    q = torch.randn(tokens, heads, d, generator=gen)
    got = lib.prefill_attention(q, k_pool, v_pool, slots, d**-0.5)
    group = heads // kv_heads
    keys = k_pool[slots].transpose(0, 1).repeat_interleave(group, 0)  # [H, L, D]
    values = v_pool[slots].transpose(0, 1).repeat_interleave(group, 0)
    causal = torch.arange(prefix + tokens)[None, :] <= torch.arange(tokens)[:, None] + prefix
    want = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=causal, scale=d**-0.5)
    torch.testing.assert_close(got, want.transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_f32_prefill_attention_says_where_it_cannot():
    """Head sizes off the kernel's vector widths, or a build without AVX2, answer None: the engine then runs
    SDPA for that chunk."""
    q = torch.randn(4, 2, 24)
    pool = torch.randn(50, 2, 24)
    slots = torch.arange(1, 11)
    assert kernels().prefill_attention(q, pool, pool, slots, 0.2) is None  # 24 values: not a multiple of 16
    scalar = kernels("generic")
    if scalar is not None:
        q, pool = torch.randn(4, 2, 32), torch.randn(50, 2, 32)
        assert scalar.prefill_attention(q, pool, pool, slots, 0.2) is None


def test_disabled_or_unbuildable_falls_back_to_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    try:
        native.kernels.cache_clear()
        monkeypatch.setenv("VRIKSHA_NATIVE", "0")
        assert kernels() is None
        native.kernels.cache_clear()
        monkeypatch.setenv("VRIKSHA_NATIVE", "1")
        monkeypatch.setenv("CC", "false")  # a "compiler" that fails every build
        assert kernels() is None
        assert not list((tmp_path / "native").glob("*.so"))
    finally:
        native.kernels.cache_clear()


@pytest.mark.parametrize("name", ["llama", "qwen2-sliding", "gemma3"])
def test_engine_with_native_kernels_equals_engine_without(name, default_tokenizer):
    vocab = 512
    model = tiny_model(name, vocab)
    fast, plain = engines_over(model, default_tokenizer, native_kernels=False)
    assert fast.engine.runner.native is not None and plain.engine.runner.native is None
    assert_same_samples(fast, plain, vocab, seed=4, n=2, atol=1e-4)


def test_engine_in_a_dtype_without_native_kernels_keeps_torchs(default_tokenizer):
    model = tiny_model("llama", 512).to(torch.float16)
    llm = LLM.from_module(model, default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=128)
    runner = llm.engine.runner
    assert runner.native is None and runner.kernels.name == "torch" and runner.attention.decode_kernel is None
    out = llm.generate(
        [{"prompt_token_ids": [1, 2, 3]}], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )
    assert len(out[0].outputs[0].token_ids) == 4


def test_elementwise_kernels_match_torch(k):
    gen = torch.Generator().manual_seed(7)
    for rows, dim in ((1, 576), (5, 64), (3, 13)):
        x, res, w = (torch.randn(rows, dim, generator=gen) for _ in range(3))
        w = w[0]
        torch.testing.assert_close(k.rms_norm(x.clone(), w, 1e-5), F.rms_norm(x, (dim,), w, 1e-5))
        updated = x.clone()
        got = k.rms_norm(updated, w, 1e-5, residual=res)
        torch.testing.assert_close(updated, x + res)
        torch.testing.assert_close(got, F.rms_norm(x + res, (dim,), w, 1e-5))
    tokens, heads, dim = 4, 3, 16
    x = torch.randn(tokens, heads, dim, generator=gen)
    angles = torch.randn(tokens, dim // 2, generator=gen).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()
    rotated = torch.cat((-x[..., dim // 2 :], x[..., : dim // 2]), dim=-1)
    want = x * cos[:, None] + rotated * sin[:, None]
    torch.testing.assert_close(k.rope_(x.clone(), cos, sin), want)
    gate, up = torch.randn(2, 100, generator=gen), torch.randn(2, 100, generator=gen)
    torch.testing.assert_close(k.silu_mul(gate, up), F.silu(gate) * up)
