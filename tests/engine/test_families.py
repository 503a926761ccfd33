"""Every tested decoder family through the engine: greedy tokens equal Transformers' generate(), sampled log-probs
equal Transformers' log-softmax, with the prefix cache on and off, prompts chunked and not."""

import copy
import inspect

import pytest
import torch

from tests.engine.conftest import tiny_model
from tests.engine.families import FAMILY_CONFIGS, MOE_FAMILIES, REFUSED_CONFIGS, VOCAB
from vriksha import LLM, SamplingParams
from vriksha.engine.runner.lean_forward import LeanForward
from vriksha.errors import ModelLoadError

FAMILIES = sorted(FAMILY_CONFIGS)
LEAN_FORWARD_FAMILIES = ["llama", "qwen2", "qwen3"]  # the engine's lean forward covers these layer classes
FORWARDS = [(f, "transformers") for f in FAMILIES] + [(f, "lean") for f in LEAN_FORWARD_FAMILIES]
CHUNKED = dict(chunked_prefill_size=8, max_num_batched_tokens=24)
UNCHUNKED = dict(chunked_prefill_size=512, max_num_batched_tokens=512)


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()


def hf_token_logprobs(model, prompt_ids: list[int], new_ids: list[int]) -> list[float]:
    ids = torch.tensor([prompt_ids + new_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    return logprobs.gather(1, torch.tensor(new_ids)[:, None])[:, 0].tolist()


def engine_over(reference, tokenizer, forward: str = "lean", **options) -> LLM:
    """An engine over a copy of `reference`; forward="transformers" keeps the model's own forward everywhere."""
    llm = LLM.from_module(
        copy.deepcopy(reference),
        tokenizer,
        kv_cache_memory_gb=0.01,
        max_model_len=256,
        fast_forward=forward == "lean",
        **options,
    )
    assert (llm.engine.runner.path(LeanForward) is not None) == (
        forward == "lean" and reference.config.model_type in LEAN_FORWARD_FAMILIES
    )
    return llm


def test_the_suite_covers_what_it_claims():
    assert len(FAMILIES) >= 14
    assert {"gemma2", "gpt_neox"} <= set(FAMILIES) and len(set(MOE_FAMILIES) & set(FAMILIES)) >= 3


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ["cached-chunked", "uncached-unchunked"])
def test_greedy_matches_transformers(family, layout, default_tokenizer):
    prefix_caching = layout == "cached-chunked"
    reference = tiny_model(family, VOCAB)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, VOCAB, (20,), generator=g).tolist()
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (1, 5, 17, 40)]
    prompts += [shared + [7, 8, 9], shared + [10], shared + list(range(30))]
    llm = engine_over(
        reference,
        default_tokenizer,
        enable_prefix_caching=prefix_caching,
        **(CHUNKED if prefix_caching else UNCHUNKED),
    )
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, 12), (
            f"diverged on prompt of {len(prompt)}"
        )
    if prefix_caching:
        again = llm.generate([{"prompt_token_ids": shared + [7, 8, 9]}], params)[0]
        assert again.num_cached_tokens == len(shared) + 2
        assert again.outputs[0].token_ids == outs[4].outputs[0].token_ids


@pytest.mark.parametrize(("family", "forward"), FORWARDS)
def test_sampled_logprobs_match_transformers(family, forward, default_tokenizer):
    reference = tiny_model(family, VOCAB)
    llm = engine_over(reference, default_tokenizer, forward, **CHUNKED)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3, 26)]
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=7, logprobs=0)
    for prompt, out in zip(
        prompts, llm.generate([{"prompt_token_ids": p} for p in prompts], params), strict=True
    ):
        sample = out.outputs[0]
        expected = hf_token_logprobs(reference, prompt, sample.token_ids)
        assert sample.token_logprobs == pytest.approx(expected, abs=1e-4)


def routes_through_attention_interface(model) -> bool:
    """Whether the installed Transformers writes this family's attention through AttentionInterface."""
    return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(inspect.getmodule(type(model)))


@pytest.mark.parametrize("family", sorted(REFUSED_CONFIGS))
def test_family_with_its_own_attention_code_is_refused_by_name(family, default_tokenizer):
    """Refused by name while Transformers computes its attention in the family's own code; served, greedy
    tokens equal to generate(), from the Transformers release that moves it onto the interface."""
    reference = tiny_model(family, VOCAB)
    if not routes_through_attention_interface(reference):
        with pytest.raises(ModelLoadError, match="AttentionInterface"):
            engine_over(reference, default_tokenizer)
        return
    llm = engine_over(reference, default_tokenizer, **CHUNKED)
    prompt = torch.randint(0, VOCAB, (17,), generator=torch.Generator().manual_seed(2)).tolist()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], params)[0]
    assert out.outputs[0].token_ids == hf_greedy(reference, prompt, 8)


@pytest.mark.parametrize(("family", "forward"), FORWARDS)
def test_bf16_logprobs_close_to_transformers_bf16(family, forward, default_tokenizer):
    """bf16 weights and KV: sampled log-probs within bf16's rounding of Transformers' own bf16 forward."""
    reference = tiny_model(family, VOCAB).to(torch.bfloat16)
    llm = engine_over(reference, default_tokenizer, forward, **CHUNKED)
    prompt = torch.randint(0, VOCAB, (19,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=11, logprobs=0)
    sample = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0]
    expected = hf_token_logprobs(reference, prompt, sample.token_ids)
    assert sample.token_logprobs == pytest.approx(expected, abs=0.08)


def test_docs_name_exactly_the_tested_families():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    matrix = (root / "docs" / "models.md").read_text().split("## Parity matrix", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `") for line in matrix.splitlines() if line.startswith("| `")}
    assert rows == set(FAMILIES), (
        f"docs/models.md's parity matrix differs from the tests: {rows ^ set(FAMILIES)}"
    )
    overview = (root / "docs" / "overview.md").read_text().splitlines()
    line = next(line for line in overview if line.startswith("Tested families"))
    listed = {name.strip(" `.") for name in line.split(":", 1)[1].split(",")}
    assert listed == set(FAMILIES), (
        f"docs/overview.md's tested-families line differs from the tests: {listed ^ set(FAMILIES)}"
    )
