"""The bf16 path: native kernels over a bf16 KV pool against torch's bf16 ops, in the engine and alone."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.platform.native import isa, kernels
from vriksha.engine.runner.lean_forward import LeanForward

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def lib():
    built = kernels()
    assert built is not None, "the native kernels should build on this machine (gcc is installed)"
    return built


def test_bf16_decode_attention_is_close_to_torchs_bf16_sdpa(lib):
    """Against torch's own bf16 SDPA over gathered K/V (what the engine ran before): within 2e-2, the
    bf16 rounding of torch's output; against float32 math on the same values: within 1e-4."""
    gen = torch.Generator().manual_seed(11)
    heads, kv_heads, d = 9, 3, 64
    k_pool = torch.randn(400, kv_heads, d, generator=gen).to(BF16)
    v_pool = torch.randn(400, kv_heads, d, generator=gen).to(BF16)
    lens = torch.tensor([3, 50, 300])
    slots = torch.zeros(3, 300, dtype=torch.int64)
    for b, n in enumerate(lens.tolist()):
        slots[b, :n] = torch.randperm(399, generator=gen)[:n] + 1
    q = torch.randn(3, heads, d, generator=gen).to(BF16)
    got = lib.decode_attention(q, k_pool, v_pool, slots, lens, d**-0.5, None)
    for b, n in enumerate(lens.tolist()):
        keys, values = k_pool[slots[b, :n]].transpose(0, 1), v_pool[slots[b, :n]].transpose(0, 1)
        qb = q[b].view(kv_heads, heads // kv_heads, d)
        torch_bf16 = F.scaled_dot_product_attention(qb, keys, values, scale=d**-0.5).reshape(heads, d)
        torch.testing.assert_close(got[b].to(BF16), torch_bf16, rtol=2e-2, atol=2e-2)
        exact = F.scaled_dot_product_attention(qb.float(), keys.float(), values.float(), scale=d**-0.5)
        torch.testing.assert_close(got[b], exact.reshape(heads, d), rtol=1e-4, atol=1e-4)


@pytest.fixture(params=["avx512_bf16", "amx"])
def lanes(request, lib):
    """The attention lanes' instruction set: AVX512-BF16 pairs, or AMX tiles (where this CPU and the OS allow
    them); restored to the library's default after."""
    want_amx = request.param == "amx"
    if want_amx and not lib.attention_amx():
        missing = sorted({"amx_bf16", "amx_tile"} - isa.cpu_flags())
        why = f"this CPU lacks {', '.join(missing)}" if missing else "the OS did not grant the tile state"
        pytest.skip(f"the AMX attention lanes need amx_bf16 and amx_tile: {why}")
    assert lib.attention_amx(want_amx) == want_amx
    yield request.param
    lib.attention_amx(True)


def _shared_prefix_slots(lens, prefixes, pool_size, gen):
    """[B, max(lens)] slot rows: row b starts with prefixes[b] (shared slots, or None) then slots of its own."""
    own = (torch.randperm(pool_size - 1, generator=gen) + 1).tolist()
    own = [s for s in own if all(p is None or s not in p for p in prefixes)]
    slots = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    for b, n in enumerate(lens):
        head = prefixes[b] or []
        slots[b, :n] = torch.tensor(head + [own.pop() for _ in range(n - len(head))])
    return slots


@pytest.mark.parametrize(
    "heads,kv_heads,d",
    [(9, 3, 64), (8, 2, 128), (4, 4, 64), (32, 2, 64)],  # groups of 3, 4, 1 and 16 query heads per KV head
)
def test_bf16_decode_attention_over_shared_prefixes(lib, lanes, heads, kv_heads, d):
    """Rows sharing a long run of prefix slots (the radix cache's layout for a shared prompt) attend to it
    together, then to their own slots, merging the two softmaxes: the result must be the one softmax over all
    of a row's slots, in float32 math within 4e-3 (the shared pass weighs the bf16 values by probabilities
    rounded to bf16, as the pool rounds the values themselves; its sums stay float32), whatever the grouping:
    two groups interleaved in the batch,
    a row alone, a row whose shared run is too short to group (it keeps its group from forming), rows of
    different lengths, a group of more rows than a vector holds query heads. The float32-query entry (an fp32
    engine over a bf16 pool) gives the same values."""
    gen = torch.Generator().manual_seed(heads * d)
    first, second, third = list(range(1000, 1300)), list(range(2000, 2100)), list(range(3000, 3200))
    layouts = [
        ([310, 140, 305, 200, 101, 250, 400, 120], [first, second, first, None, second, second, first, None]),
        ([310, 305, 120, 400], [first, first, first[:40], first]),  # the short run holds the first group back
        ([300] * 7 + [230] * 6, [first] * 7 + [third] * 6),
    ]
    for lens, prefixes in layouts:
        pool_size = 5000
        k_pool = torch.randn(pool_size, kv_heads, d, generator=gen).to(BF16)
        v_pool = torch.randn(pool_size, kv_heads, d, generator=gen).to(BF16)
        slots = _shared_prefix_slots(lens, prefixes, pool_size, gen)
        q = torch.randn(len(lens), heads, d, generator=gen)
        got = lib.decode_attention(q.to(BF16), k_pool, v_pool, slots, torch.tensor(lens), d**-0.5, None)
        fp32_query, lens_t = torch.empty_like(got), torch.tensor(lens)
        entry = lib._lib.decode_attention_f32q_bf16kv  # what the native decode step calls in an fp32 engine
        entry.argtypes, entry.restype = lib._fns["decode_attention", BF16].argtypes, None
        pointers = (q, k_pool, v_pool, slots, lens_t, fp32_query)
        entry(
            *(t.data_ptr() for t in pointers), len(lens), heads, kv_heads, d, d, slots.shape[1], d**-0.5, 0, 2
        )
        torch.testing.assert_close(fp32_query, got, rtol=0, atol=0)
        for b, n in enumerate(lens):
            keys, values = (
                k_pool[slots[b, :n]].float().transpose(0, 1),
                v_pool[slots[b, :n]].float().transpose(0, 1),
            )
            qb = q[b].to(BF16).float().view(kv_heads, heads // kv_heads, d)
            exact = F.scaled_dot_product_attention(qb, keys, values, scale=d**-0.5).reshape(heads, d)
            torch.testing.assert_close(got[b], exact, rtol=1e-2, atol=4e-3)


@pytest.mark.parametrize(
    "tokens,prefix,heads,kv_heads,d",
    [(32, 512, 9, 3, 64), (300, 0, 9, 3, 64), (7, 3, 8, 2, 128), (1, 0, 4, 4, 64), (40, 100, 32, 2, 64)],
)
def test_bf16_prefill_attention_is_causal_softmax_over_the_pool(
    lib, lanes, tokens, prefix, heads, kv_heads, d
):
    """A prompt chunk's queries over its slots in the pool (a cached prefix, then its own K/V): token t sees
    the prefix and its chunk up to itself, within 4e-3 of float32 math on the query rounded to bf16 (the
    probabilities weigh the bf16 values in bf16, with float32 sums); where the build cannot (no AVX-512 BF16)
    it says so with None, and the engine runs SDPA."""
    gen = torch.Generator().manual_seed(tokens + prefix + d)
    pool_size = 3000
    k_pool = torch.randn(pool_size, kv_heads, d, generator=gen).to(BF16)
    v_pool = torch.randn(pool_size, kv_heads, d, generator=gen).to(BF16)
    slots = torch.randperm(pool_size - 1, generator=gen)[: prefix + tokens] + 1
    q = torch.randn(tokens, heads, d, generator=gen)
    got = lib.prefill_attention(q, k_pool, v_pool, slots, d**-0.5)
    if "avx512_bf16" not in lib.variant.cpu_flags:
        assert got is None
        pytest.skip("the prefill kernel needs avx512_bf16")
    group = heads // kv_heads
    keys = k_pool[slots].float().transpose(0, 1).repeat_interleave(group, 0)  # [H, L, D]
    values = v_pool[slots].float().transpose(0, 1).repeat_interleave(group, 0)
    causal = torch.arange(prefix + tokens)[None, :] <= torch.arange(tokens)[:, None] + prefix
    queries = q.to(BF16).float().transpose(0, 1)
    want = F.scaled_dot_product_attention(queries, keys, values, attn_mask=causal, scale=d**-0.5)
    torch.testing.assert_close(got, want.transpose(0, 1), rtol=1e-2, atol=4e-3)


def test_the_kernel_set_offers_the_prefill_kernel_only_where_it_was_built():
    """Builds without AVX-512 BF16 have no prompt-chunk kernel for a bf16 pool: the engine keeps SDPA there
    rather than asking the C side on every chunk and falling back. A float32 pool's kernel is offered by the
    AVX2 build, where it was measured against SDPA."""
    from vriksha.engine.platform.kernel_sets import NativeKernels

    for variant in ("avx2", "avx512", "avx512_bf16"):
        built = kernels(variant)
        if built is None:
            continue  # this CPU cannot run that build
        offered = NativeKernels(built, "native").prefill_attention_for(BF16)
        assert (offered is not None) == (variant == "avx512_bf16"), variant
        offered_f32 = NativeKernels(built, "native").prefill_attention_for(torch.float32)
        assert (offered_f32 is not None) == (variant == "avx2"), variant


def _agreement_with(reference, run):
    """Per prompt, how far `run`'s greedy tokens follow `reference`'s, and the log-prob errors on that stretch;
    where the tokens part, `reference` itself must have nearly tied the two (a bf16 rounding can flip a tie)."""
    errors = []
    for a, b in zip(run, reference, strict=True):
        x, y = a.outputs[0], b.outputs[0]
        for step, (u, v) in enumerate(zip(x.token_ids, y.token_ids, strict=True)):
            if u != v:
                assert u in y.logprobs[step] and y.logprobs[step][v] - y.logprobs[step][u] < 0.25, (
                    step,
                    u,
                    v,
                )
                break
            errors.append(abs(x.logprobs[step][u] - y.logprobs[step][u]))
    return errors


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen2-sliding"])
def test_engine_in_bf16_with_native_kernels_is_as_close_to_float32_as_torchs_bf16(name, default_tokenizer):
    """Both bf16 paths round at different points (torch per op, the native kernels per fused layer; AVX512-BF16
    dot products where the CPU has them), so each is held against the float32 model rather than against the
    other: the native path's log-prob error must be of the size torch's own bf16 error is."""
    vocab = 512
    model = tiny_model(name, vocab)
    gen = torch.Generator().manual_seed(5)
    prompts = [
        {"prompt_token_ids": torch.randint(0, vocab, (k,), generator=gen).tolist()} for k in (1, 9, 30)
    ]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=3)
    runs = {}
    for label, dtype, kernels_name in (
        ("float32", torch.float32, "torch"),
        ("native", BF16, "native"),
        ("torch", BF16, "torch"),
    ):
        llm = LLM.from_module(
            copy.deepcopy(model).to(dtype), default_tokenizer, kernels=kernels_name, **ENGINE_TEST_OPTIONS
        )
        runner = llm.engine.runner
        assert runner.pool.dtype == dtype
        assert (runner.attention.decode_kernel is not None) == (kernels_name == "native")
        lean = runner.path(LeanForward)
        assert lean is not None and lean.kernels.name == kernels_name
        runs[label] = llm.generate(prompts, params)
        llm.close()
    native = _agreement_with(runs["float32"], runs["native"])
    torch_bf16 = _agreement_with(runs["float32"], runs["torch"])
    assert (
        len(native) >= 16
    )  # of 48: random tiny models in bf16 tie often (qwen2-sliding first at steps 6-11)
    assert max(native) < 0.15, max(native)  # torch's own bf16 error reaches about 0.08 on these models
    assert sum(native) / len(native) <= 1.5 * sum(torch_bf16) / len(torch_bf16) + 0.005


def test_fast_linears_native_path_in_bf16(lib):
    from vriksha.engine.platform import dense_linear

    torch.manual_seed(3)
    layer = torch.nn.Linear(64, 96).to(BF16)
    layouts = dense_linear._Layouts(layer, set(), lib)
    x = torch.randn(3, 64).to(BF16)
    got = layouts.run("native", x)
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float()).to(BF16)
    assert got.dtype == BF16
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)
