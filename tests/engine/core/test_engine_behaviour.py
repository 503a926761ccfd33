"""Scheduling, memory pressure, sampling semantics, bad input and the async engine, on a tiny model."""

import asyncio

import pytest
import torch

from tests.engine.conftest import tiny_model
from vriksha import LLM, SamplingParams
from vriksha.engine.core.async_engine import AsyncEngine
from vriksha.engine.core.llm_engine import LLMEngine
from vriksha.errors import InvalidRequestError, ModelLoadError, PromptTooLongError

VOCAB = 512


def make_llm(tokenizer, **kwargs) -> LLM:
    kwargs.setdefault("kv_cache_memory_gb", 0.01)
    kwargs.setdefault("max_model_len", 256)
    return LLM.from_module(tiny_model("llama", VOCAB), tokenizer, **kwargs)


def random_prompts(n, seed=0, lo=3, hi=60):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [{"prompt_token_ids": torch.randint(0, VOCAB, (k,), generator=g).tolist()} for k in lens]


def kv_slots_balanced(llm: LLM) -> bool:
    """Every KV slot is owned by exactly one of: the free list, the radix tree (no requests remain)."""
    engine = llm.engine
    free = engine.allocator.free_slot_set()
    tree = engine.cache.slot_set()
    return not (free & tree) and len(free) + len(tree) == engine.allocator.capacity


def test_small_pool_completes_every_request_identically(default_tokenizer):
    prompts = random_prompts(24, seed=1)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    roomy = make_llm(default_tokenizer).generate(prompts, params)
    tiny = make_llm(default_tokenizer)
    bytes_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads, head_dim 16, fp32
    small = make_llm(default_tokenizer, kv_cache_memory_gb=150 * bytes_per_token / 2**30, max_num_seqs=32)
    assert small.engine.allocator.capacity < sum(len(p["prompt_token_ids"]) + 40 for p in prompts)
    outs = small.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in roomy]
    assert small.stats().num_retracted > 0, "the pool was meant to be too small to run everything at once"
    assert kv_slots_balanced(small)
    del tiny


def test_no_slot_leaks_across_abort_and_finish(default_tokenizer):
    llm = make_llm(default_tokenizer)
    engine = llm.engine
    ids = [
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
        for p in random_prompts(6)
    ]
    for _ in range(5):
        engine.step()
    engine.abort(ids[0])
    engine.abort(ids[3])
    while engine.has_unfinished:
        engine.step()
    assert kv_slots_balanced(llm)
    assert engine.stats().kv_used_tokens == 0
    assert llm.flush_cache() and len(engine.allocator.free_slot_set()) == engine.allocator.capacity


def test_parallel_samples_share_the_prompt_prefill(default_tokenizer):
    llm = make_llm(default_tokenizer)
    prompt = random_prompts(1, seed=4, lo=100, hi=101)[0]
    out = llm.generate(prompt, SamplingParams(n=6, temperature=1.0, seed=5, max_tokens=8, ignore_eos=True))[0]
    assert len(out.outputs) == 6
    stats = llm.stats()
    # the first sample computes the prompt; the other five read it from the cache
    assert stats.cached_prompt_tokens == 5 * (len(prompt["prompt_token_ids"]) - 1)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_seeded_sampling_is_reproducible(default_tokenizer):
    llm = make_llm(default_tokenizer)
    prompts = random_prompts(3, seed=6)
    params = SamplingParams(
        temperature=0.9, top_p=0.9, top_k=50, min_p=0.01, seed=11, max_tokens=20, ignore_eos=True
    )
    first = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    second = [o.outputs[0].token_ids for o in llm.generate(prompts[::-1], params)][::-1]
    assert first == second
    other = [
        o.outputs[0].token_ids
        for o in llm.generate(
            prompts, SamplingParams(temperature=0.9, seed=12, max_tokens=20, ignore_eos=True)
        )
    ]
    assert other != first


def test_top_k_one_is_greedy(default_tokenizer):
    llm = make_llm(default_tokenizer)
    prompts = random_prompts(3, seed=7)
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    topk = llm.generate(
        prompts, SamplingParams(temperature=1.5, top_k=1, seed=1, max_tokens=10, ignore_eos=True)
    )
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in topk]


def test_stop_token_ids_max_tokens_and_per_prompt_params(default_tokenizer):
    llm = make_llm(default_tokenizer)
    prompt = random_prompts(1, seed=8)[0]
    free = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].outputs[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 20
    stop_at = free.token_ids[5]
    first_index = free.token_ids.index(stop_at)
    stopped, short = llm.generate(
        [prompt, prompt],
        [
            SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_at]),
            SamplingParams(temperature=0, max_tokens=3),
        ],
    )
    assert stopped.outputs[0].finish_reason == "stop"
    assert stopped.outputs[0].token_ids == free.token_ids[: first_index + 1]
    assert short.outputs[0].token_ids == free.token_ids[:3]


def test_stop_strings_cut_the_text(default_tokenizer):
    llm = make_llm(default_tokenizer)
    prompt = random_prompts(1, seed=9)[0]
    free = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0].outputs[0]
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]
    assert stop.strip(), "the free text should be long enough to cut"
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, stop=[stop], ignore_eos=True))[
        0
    ].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == free.text[: free.text.find(stop)]


def test_streaming_is_cumulative_and_ends_finished(default_tokenizer):
    llm = make_llm(default_tokenizer)
    prompt = random_prompts(1, seed=10)[0]
    steps = list(llm.stream(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)))
    assert steps[-1].finished and not any(s.finished for s in steps[:-1])
    lengths = [len(s.outputs[0].token_ids) for s in steps]
    assert lengths == sorted(lengths) and lengths[-1] == 6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(top_k=0), "top_k"),
        (dict(n=0), "n"),
    ],
)
def test_invalid_sampling_values_are_named(kwargs, match):
    with pytest.raises(InvalidRequestError, match=match):
        SamplingParams(**kwargs)


def test_bad_prompts_get_clear_errors_and_nothing_else_is_disturbed(default_tokenizer):
    llm = make_llm(default_tokenizer)
    engine = llm.engine
    good = engine.add_request(
        random_prompts(1)[0], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    )
    engine.step()
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate("", SamplingParams())
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate({"prompt_token_ids": []}, SamplingParams())
    with pytest.raises(PromptTooLongError, match="256"):
        llm.generate({"prompt_token_ids": [1] * 300}, SamplingParams())
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        llm.generate({"prompt_token_ids": [VOCAB + 5]}, SamplingParams())
    with pytest.raises(InvalidRequestError, match="KV pool"):
        small = make_llm(default_tokenizer, kv_cache_memory_gb=100 * 512 / 2**30)
        small.generate({"prompt_token_ids": [1] * 50}, SamplingParams(max_tokens=200))
    done = []
    while engine.has_unfinished:
        done += engine.step()
    assert [o.request_id for o in done] == [good] and len(done[0].outputs[0].token_ids) == 5


def test_unknown_model_path_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM(model="/no/such/model")


def test_weights_updated_drops_the_cache_and_uses_new_weights(default_tokenizer):
    llm = make_llm(default_tokenizer)
    prompt = random_prompts(1, seed=12)[0]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before = llm.generate(prompt, params)[0].outputs[0].token_ids
    assert llm.engine.cache.total_size() > 0
    with torch.no_grad():
        for p in llm.model.parameters():
            p.mul_(-1.0)  # in place: the engine reads the same tensors
    llm.weights_updated()
    assert llm.engine.cache.total_size() == 0
    after = llm.generate(prompt, params)[0]
    assert after.num_cached_tokens == 0 and after.outputs[0].token_ids != before
    ref = llm.model
    with torch.no_grad():
        ids = torch.tensor([prompt["prompt_token_ids"]])
        expected = ref.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, ids.shape[1] :].tolist()
    assert after.outputs[0].token_ids == expected


def test_async_engine_streams_and_aborts_on_cancel(default_tokenizer):
    model = tiny_model("llama", VOCAB)
    engine = AsyncEngine(
        LLMEngine.from_module(model, default_tokenizer, kv_cache_memory_gb=0.01, max_model_len=256)
    )

    async def scenario():
        await engine.start()
        try:
            prompts = random_prompts(4, seed=13)

            async def full(p):
                last = None
                async for out in engine.generate(
                    p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
                ):
                    last = out
                return last

            finished = await asyncio.gather(*(full(p) for p in prompts))
            assert all(o.finished and len(o.outputs[0].token_ids) == 12 for o in finished)

            async def cut(p):
                async for out in engine.generate(
                    p, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
                ):
                    if len(out.outputs[0].token_ids) >= 3:
                        return out  # leaving the loop closes the generator: the request is aborted

            await asyncio.gather(*(cut(p) for p in prompts))
            await asyncio.sleep(0.3)
            stats = engine.stats()
            assert stats.num_running == 0 and stats.kv_used_tokens == 0
            with pytest.raises(InvalidRequestError):
                async for _ in engine.generate("", SamplingParams()):
                    pass
        finally:
            await engine.shutdown(timeout_s=5)
        assert not engine.running

    asyncio.run(scenario())
