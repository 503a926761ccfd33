"""Greedy output of the embedded model equals Transformers' generate(), token for token.

Where a sequence diverges, the diverging step must be a numerical near-tie in Transformers' own
distribution (top-2 log-prob gap < 1e-3); any other divergence fails.
"""

import pytest
import torch

from vriksha import LLM, SamplingParams
from vriksha.loading import load_model

pytestmark = pytest.mark.slow

RAW = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "The quick brown fox",
    "import numpy as np\n\n# compute the mean of an array\n",
    "Q: What is the boiling point of water?\nA:",
    "Roses are red,",
    "In machine learning, overfitting means",
    "The three primary colours are",
]
CHAT = [
    "What is 2+3?",
    "Name a planet in our solar system.",
    "Write one sentence about the sea.",
    "Translate 'hello' into Spanish.",
    "What is the square root of 81?",
    "Give me a synonym for happy.",
    "Why is the sky blue? Answer briefly.",
    "List two fruits.",
]
LONG_SYSTEM = ("You are a careful assistant. " * 30).strip()
MAX_NEW = 16


@pytest.fixture(scope="module")
def reference():
    return load_model(None)


@pytest.fixture(scope="module")
def prompts(reference):
    tok = reference.tokenizer
    ids = [tok.encode(p, add_special_tokens=False) for p in RAW]
    for q in CHAT:
        text = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        ids.append(tok.encode(text, add_special_tokens=False))
    for q in ("What is 7 times 6?", "Say something kind."):  # longer than the chunk size below
        msgs = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": q}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids.append(tok.encode(text, add_special_tokens=False))
    assert len(ids) >= 20 and max(len(p) for p in ids) > 128
    return ids


@pytest.fixture(scope="module")
def hf_outputs(reference, prompts):
    outs = []
    with torch.no_grad():
        for p in prompts:
            gen = reference.model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs


def assert_same_or_near_tie(model, prompt, ours, theirs):
    if ours == theirs:
        return
    step = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + theirs[:step]])).logits[0, -1]
    top2 = torch.log_softmax(logits.float(), -1).topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap < 1e-3, f"diverged at step {step} where the top-2 log-prob gap is {gap:.2e} (not a near-tie)"


@pytest.mark.parametrize(
    "config",
    [
        dict(enable_prefix_caching=True, chunked_prefill_size=512),
        dict(enable_prefix_caching=True, chunked_prefill_size=64, max_num_batched_tokens=256),
        dict(enable_prefix_caching=False, chunked_prefill_size=64, max_num_batched_tokens=256),
    ],
    ids=["cache", "cache-chunked", "nocache-chunked"],
)
def test_greedy_equals_generate(config, reference, prompts, hf_outputs):
    model = load_model(None).model
    llm = LLM.from_module(model, reference.tokenizer, kv_cache_memory_gb=0.5, **config)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for p, out, theirs in zip(prompts, outs, hf_outputs, strict=True):
        assert_same_or_near_tie(reference.model, p, out.outputs[0].token_ids, theirs)
    if config["enable_prefix_caching"]:
        again = llm.generate([{"prompt_token_ids": prompts[-1]}], params)[0]
        assert again.num_cached_tokens == len(prompts[-1]) - 1


def test_logprobs_match_a_plain_forward(reference, prompts):
    llm = LLM.from_module(load_model(None).model, reference.tokenizer, kv_cache_memory_gb=0.5)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True, logprobs=2)
    chosen = [prompts[0], prompts[12], prompts[-1]]
    outs = llm.generate([{"prompt_token_ids": p} for p in chosen], params)
    for p, out in zip(chosen, outs, strict=True):
        comp = out.outputs[0]
        full = torch.tensor([p + comp.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(reference.model(full).logits[0].float(), -1)
        expected = lp[len(p) - 1 : -1].gather(1, torch.tensor(comp.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(comp.token_logprobs), expected, atol=1e-4), (
            (torch.tensor(comp.token_logprobs) - expected).abs().max()
        )
        assert len(comp.logprobs) == 12 and all(len(step) >= 2 for step in comp.logprobs)
