"""Speculative decoding (n-gram prompt lookup): outputs equal the engine's without it, KV memory stays balanced.

The tiny model here is a random Llama whose attention and MLP outputs are scaled down: its greedy output falls
into cycles, so the proposer's tokens get accepted, while attention still moves every logit (a wrong K/V in
the pool would show in the log-probabilities compared below).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_config
from vriksha import LLM, SamplingParams
from vriksha.engine.config import EngineConfig
from vriksha.engine.speculative.ngram_proposer import NgramProposer
from vriksha.errors import ConfigError

VOCAB = 512
LP_TOL = 1e-4


def cycling_llama(alpha: float) -> torch.nn.Module:
    """A tiny random Llama whose output head maps each token to the next in its block of six (t -> t + 1,
    wrapping), with attention and MLP outputs scaled by `alpha`: its greedy output cycles, while attention
    still moves every logit."""
    config = tiny_config("llama", VOCAB)
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(alpha)
            layer.mlp.down_proj.weight.mul_(alpha)
        t = torch.arange(VOCAB)
        succ = torch.where(6 * (t // 6) + 6 <= VOCAB, 6 * (t // 6) + (t % 6 + 1) % 6, t)
        emb = model.model.embed_tokens.weight
        model.lm_head.weight[succ] = emb / emb.norm(dim=1, keepdim=True)
    return model


@pytest.fixture(scope="module")
def cycler():
    return cycling_llama(0.05)


def test_attention_moves_the_cycling_models_logits(cycler, default_tokenizer):
    """The log-probabilities compared in these tests see the K/V: without attention they differ."""
    prompts = random_prompts((5, 20))
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    with_attention, _ = pair(cycler, default_tokenizer)
    without, _ = pair(cycling_llama(0.0), default_tokenizer)
    a, b = with_attention.generate(prompts, params), without.generate(prompts, params)
    same = [
        (x.outputs[0], y.outputs[0])
        for x, y in zip(a, b, strict=True)
        if x.outputs[0].token_ids == y.outputs[0].token_ids
    ]
    assert same
    for x, y in same:
        assert max(abs(p - q) for p, q in zip(x.token_logprobs, y.token_logprobs, strict=True)) > 100 * LP_TOL


def pair(model, tokenizer, **options):
    """The same model without and with speculation."""
    opts = {**ENGINE_TEST_OPTIONS, **options}
    plain = LLM.from_module(copy.deepcopy(model), tokenizer, **opts)
    spec = LLM.from_module(copy.deepcopy(model), tokenizer, **opts, speculative="ngram")
    return plain, spec


def random_prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(0, VOCAB, (k,), generator=g).tolist()} for k in lengths]


def assert_same(xs, ys):
    for x, y in zip(xs, ys, strict=True):
        assert len(x.outputs) == len(y.outputs)
        for u, v in zip(x.outputs, y.outputs, strict=True):
            assert u.token_ids == v.token_ids
            assert u.text == v.text
            assert (u.finish_reason, u.stop_reason) == (v.finish_reason, v.stop_reason)
            assert u.token_logprobs == pytest.approx(v.token_logprobs, abs=LP_TOL)
            if u.logprobs is not None:
                for a, b in zip(u.logprobs, v.logprobs, strict=True):
                    assert a.keys() == b.keys()
                    assert list(a.values()) == pytest.approx(list(b.values()), abs=LP_TOL)


def assert_balanced(llm):
    """No request holds memory: every slot is free or in the radix tree, and a flush frees them all."""
    engine = llm.engine
    free, tree = engine.allocator.free_slot_set(), engine.cache.slot_set()
    assert not free & tree and len(free) + len(tree) == engine.allocator.capacity
    assert engine.stats().kv_used_tokens == 0
    assert llm.flush_cache() and engine.allocator.num_free == engine.allocator.capacity


# ---- the proposer ----------------------------------------------------------------------------------------
def test_proposer_takes_the_longest_suffix_match_and_its_latest_occurrence():
    p = NgramProposer(1, 3)
    # [7, 8] recurs twice; the later one is followed by 3, 4
    assert p.propose([7, 8, 1, 2, 9, 7, 8, 3, 4, 5, 7, 8], 2) == [3, 4]
    # the 3-gram [6, 7, 8] beats the more recent 2-gram [7, 8]
    assert p.propose([6, 7, 8, 1, 2, 7, 8, 3, 6, 7, 8], 2) == [1, 2]
    assert p.propose([1, 2, 3, 1, 2], 5) == [3, 1, 2]  # fewer where the sequence ends sooner
    assert p.propose([5, 5, 5], 2) == [5]  # the overlapping occurrence one back is fine
    assert p.propose([1, 2, 3, 4], 3) == []  # nothing recurs
    assert p.propose([1, 2, 3, 4], 0) == []


def test_proposer_needs_min_n_tokens_to_match():
    assert NgramProposer(2, 4).propose([1, 2, 3, 9, 3], 2) == []  # only a 1-gram recurs
    assert NgramProposer(1, 4).propose([1, 2, 3, 9, 3], 2) == [9, 3]
    with pytest.raises(ValueError):
        NgramProposer(3, 2)


def test_config_validates_the_speculative_options():
    assert EngineConfig().speculative == "none"
    with pytest.raises(ConfigError, match="speculative"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ConfigError, match="ngram_min"):
        EngineConfig(ngram_min=5, ngram_max=3)
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        EngineConfig(num_speculative_tokens=0)


# ---- exactness -------------------------------------------------------------------------------------------
def test_greedy_output_is_unchanged_and_proposals_are_accepted(cycler, default_tokenizer):
    plain, spec = pair(cycler, default_tokenizer)
    prompts = random_prompts((5, 20, 40))
    base = random_prompts((9,), seed=3)[0]["prompt_token_ids"]
    prompts.append({"prompt_token_ids": base * 4})  # a prompt that repeats itself
    params = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True, logprobs=3)
    assert_same(plain.generate(prompts, params), spec.generate(prompts, params))
    stats = spec.stats()
    assert stats.spec_accepted_tokens > 0 and stats.spec_tokens_per_step > 1.0
    assert 0 < stats.spec_acceptance_rate <= 1.0
    assert stats.generation_tokens == plain.stats().generation_tokens == 4 * 80
    assert plain.stats().spec_runs == 0
    assert stats.step_times.count("verify") > 0 and plain.stats().step_times.count("verify") == 0
    from vriksha.server.metrics import _EngineCollector

    gauges = {
        m.name: m.samples[0].value for m in _EngineCollector(spec.stats, lambda: 0, lambda: 0).collect()
    }
    assert gauges["vriksha_spec_acceptance_rate"] == pytest.approx(stats.spec_acceptance_rate)
    assert gauges["vriksha_spec_tokens_per_step"] == pytest.approx(stats.spec_tokens_per_step)
    assert gauges["vriksha_spec_accepted_tokens"] == stats.spec_accepted_tokens
    assert_balanced(spec)


def test_prompts_that_do_not_repeat_are_unchanged(default_tokenizer):
    from tests.engine.conftest import tiny_model

    plain, spec = pair(tiny_model("llama", VOCAB), default_tokenizer, ngram_min=1)
    prompts = random_prompts((3, 17, 33), seed=7)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    assert_same(plain.generate(prompts, params), spec.generate(prompts, params))
    assert spec.stats().spec_draft_tokens > 0  # 1-grams recur, and their proposals are rejected
    assert_balanced(spec)


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.3, top_k=20, top_p=0.9, n=2)])
def test_seeded_sampling_is_unchanged(cycler, default_tokenizer, params):
    plain, spec = pair(cycler, default_tokenizer)
    prompts = random_prompts((5, 20, 40))
    sp = SamplingParams(**params, seed=11, max_tokens=60, ignore_eos=True, logprobs=1)
    assert_same(plain.generate(prompts, sp), spec.generate(prompts, sp))
    if params["temperature"] < 1.0:
        assert spec.stats().spec_accepted_tokens > 0
    assert_balanced(spec)


def run_staggered(llm, first, later, steps):
    """Add `first`, run `steps` steps, add `later` (prompt, params) pairs, run to the end; outputs by id."""
    engine = llm.engine
    done = {}
    ids = engine.add_requests([p for p, _ in first], [sp for _, sp in first])
    for _ in range(steps):
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    ids += engine.add_requests([p for p, _ in later], [sp for _, sp in later])
    while engine.has_unfinished:
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    return [done[i] for i in ids]


def test_mixed_batch_of_drafts_decodes_and_prefill_chunks(cycler, default_tokenizer):
    """Greedy and seeded requests that propose, penalised ones that may not, long prompts still in their
    chunked prefill: all in the same steps, each output as without speculation."""
    plain, spec = pair(cycler, default_tokenizer)
    kinds = []
    real_forward = spec.engine.runner.forward

    def forward(batch):
        kinds.append((bool(batch.drafts), bool(batch.decodes), bool(batch.prefills)))
        return real_forward(batch)

    spec.engine.runner.forward = forward
    prompts = random_prompts((5, 20, 40, 150, 190, 12))
    greedy = dict(temperature=0, ignore_eos=True)
    first = list(zip(prompts[:3], [
        SamplingParams(**greedy, max_tokens=80),
        SamplingParams(**greedy, max_tokens=80, presence_penalty=0.5),
        SamplingParams(temperature=0.5, seed=1, max_tokens=80, ignore_eos=True),
    ], strict=True))  # fmt: skip
    later = list(zip(prompts[3:], [
        SamplingParams(**greedy, max_tokens=40, min_tokens=30),
        SamplingParams(**greedy, max_tokens=30, logit_bias={3: 1.0}),
        SamplingParams(**greedy, max_tokens=45, repetition_penalty=1.2),
    ], strict=True))  # fmt: skip
    outs = [run_staggered(llm, first, later, steps=40) for llm in (plain, spec)]
    assert_same(*outs)
    assert (True, True, True) in kinds, "no step had draft runs, plain decodes and prefill chunks together"
    assert_balanced(spec)


# ---- stops -----------------------------------------------------------------------------------------------
def continued(cycler, tokenizer, lengths, head=40, tail=40):
    """Prompts made of a random prompt and the first `head` tokens of the model's greedy continuation (which
    has fallen into its cycle by then), with the `tail` tokens that follow: those the proposer gets right."""
    prompts = random_prompts(lengths)
    plain, _ = pair(cycler, tokenizer)
    params = SamplingParams(temperature=0, max_tokens=head + tail, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    return [
        {"prompt_token_ids": p["prompt_token_ids"] + o[:head]} for p, o in zip(prompts, outs, strict=True)
    ], [o[head:] for o in outs]


def _latest_new_token(ids: list[int]) -> int:
    """The token whose first occurrence comes last (a stop there falls where proposals are accepted)."""
    first = {}
    for i, t in enumerate(ids):
        first.setdefault(t, i)
    return max(first, key=first.get)


def record_finishes(llm) -> list[bool]:
    """For each request that finishes in a draft run: whether its last token was an accepted proposal."""
    speculator = llm.engine.scheduler.speculator
    record: list[bool] = []
    verify = speculator.verify

    def recording(runs, logits, sampler, append):
        before = {id(r.request): len(r.request.output_token_ids) for r in runs}
        finished = verify(runs, logits, sampler, append)
        for run in runs:
            req = run.request
            if req in finished:
                n = len(req.output_token_ids) - before[id(req)]
                record.append(n <= len(run.draft) and req.output_token_ids[-1] == run.draft[n - 1])
        return finished

    speculator.verify = recording
    return record


def test_max_tokens_and_the_context_limit(cycler, default_tokenizer):
    plain, spec = pair(cycler, default_tokenizer)
    prompts = random_prompts((5, 20))
    for max_tokens in (1, 2, 3, 17, 38, 39, 41):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        outs = spec.generate(prompts, params)
        assert_same(plain.generate(prompts, params), outs)
        assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
    assert spec.stats().spec_accepted_tokens > 0
    assert_balanced(spec)
    plain, spec = pair(cycler, default_tokenizer, max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    outs = spec.generate(prompts, params)
    assert_same(plain.generate(prompts, params), outs)
    assert [len(o.outputs[0].token_ids) for o in outs] == [59, 44]
    assert {o.outputs[0].finish_reason for o in outs} == {"length"}
    assert_balanced(spec)


PROMPT_LENGTHS = (5, 20, 40, 9, 27)


def test_stop_token_and_eos_inside_an_accepted_run(cycler, default_tokenizer):
    prompts, tails = continued(cycler, default_tokenizer, PROMPT_LENGTHS)
    targets = [_latest_new_token(ids) for ids in tails]
    plain, spec = pair(cycler, default_tokenizer)
    inside = record_finishes(spec)
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[t]) for t in targets
    ]
    outs = spec.generate(prompts, params)
    assert_same(plain.generate(prompts, params), outs)
    assert [(o.outputs[0].token_ids[-1], o.outputs[0].finish_reason) for o in outs] == [
        (t, "stop") for t in targets
    ]
    for llm in (plain, spec):  # the same tokens as the model's end-of-sequence
        llm.engine.eos_token_ids = frozenset(targets)
    params = SamplingParams(temperature=0, max_tokens=40)
    outs = spec.generate(prompts, params)
    assert_same(plain.generate(prompts, params), outs)
    assert all(o.outputs[0].token_ids[-1] in targets for o in outs)
    assert any(inside), "no request stopped on an accepted proposal"
    assert_balanced(spec)


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_inside_an_accepted_run(cycler, default_tokenizer, include):
    prompts, tails = continued(cycler, default_tokenizer, PROMPT_LENGTHS)
    stops = []
    for ids in tails:
        at = ids.index(_latest_new_token(ids))
        stops.append(default_tokenizer.decode(ids[at : at + 2]))
    plain, spec = pair(cycler, default_tokenizer)
    inside = record_finishes(spec)
    params = [
        SamplingParams(
            temperature=0, max_tokens=40, ignore_eos=True, stop=[s], include_stop_str_in_output=include
        )
        for s in stops
    ]
    outs = spec.generate(prompts, params)
    assert_same(plain.generate(prompts, params), outs)
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)
    assert any(inside), "no request stopped on an accepted proposal"
    assert_balanced(spec)


# ---- KV memory and the prefix cache ----------------------------------------------------------------------
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_no_slot_leaks_across_finish_abort_and_retraction(cycler, default_tokenizer, prefix_caching):
    bytes_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads, head_dim 16, fp32
    small = dict(kv_cache_memory_gb=160 * bytes_per_token / 2**30, enable_prefix_caching=prefix_caching)
    plain, spec = pair(cycler, default_tokenizer, **small)
    engine = spec.engine
    start_free = engine.allocator.num_free
    prompts = random_prompts((5, 20, 40, 12, 30))
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    assert_same(plain.generate(prompts, params), spec.generate(prompts, params))
    assert spec.stats().num_retracted > 0, "the pool was meant to be too small to run everything at once"
    assert spec.stats().spec_accepted_tokens > 0
    ids = engine.add_requests(prompts[:3], params)
    for _ in range(12):
        engine.step()
    engine.abort(ids[1])
    while engine.has_unfinished:
        engine.step()
    assert_balanced(spec)
    assert engine.allocator.num_free == start_free


def test_prefix_cache_holds_what_it_would_without_speculation(cycler, default_tokenizer):
    plain, spec = pair(cycler, default_tokenizer)
    prompts = random_prompts((5, 20))
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    outs = [llm.generate(prompts, params) for llm in (plain, spec)]
    assert_same(*outs)
    assert plain.engine.cache.total_size() == spec.engine.cache.total_size()
    # a follow-up over the first request's prompt and output reads the same cached prefix
    follow = [{"prompt_token_ids": prompts[0]["prompt_token_ids"] + outs[0][0].outputs[0].token_ids + [1, 2]}]
    again = [llm.generate(follow, params) for llm in (plain, spec)]
    assert_same(*again)
    assert again[0][0].num_cached_tokens == again[1][0].num_cached_tokens > 50


# ---- the embedded model ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_embedded_model_greedy_output_is_unchanged():
    from vriksha.loading import load_model

    loaded = load_model(None)
    code = "def area(width, height):\n    result = width * height\n    return result\n"
    messages = [
        [{"role": "user", "content": f"Rewrite this code with result renamed to total:\n\n{code}"}],
        [{"role": "user", "content": "Name a planet in our solar system."}],
    ]
    params = SamplingParams(temperature=0, max_tokens=40, logprobs=1)
    outs = []
    for spec in ("none", "ngram"):
        with LLM.from_module(loaded.model, loaded.tokenizer, kv_cache_memory_gb=0.1, speculative=spec) as llm:
            outs.append(llm.chat(messages, params))
            stats = llm.stats()
    assert_same(*outs)
    assert stats.spec_accepted_tokens > 0
