"""The default engine computes the model's own numbers, whatever else is in the batch.

`LLM()` with no option (the embedded GGUF, `dtype="auto"`, `quantization="auto"`, `packed_activations="auto"`,
native decode and every other default as a user gets them) against the dequantized model run in fp32 by
Transformers: greedy tokens equal, and the log-probs of sampled tokens and of prompt tokens within TOL nats per
token, scored as lm-eval scores a multiple-choice answer (the continuation's prompt log-probs summed), alone,
beside 15 and 63 other requests, in small prompt chunks; generated from a cached prefix. The differences that remain
are fp32 summation order (measured about 5e-5 at most); int8 activations, the old default under a measured
dtype, moved answers by up to 0.36 nats and with the batch.
"""

from __future__ import annotations

import random

import pytest
import torch

from vriksha import LLM, SamplingParams

pytestmark = pytest.mark.slow

TOL = 1e-3  # nats per token, and per answer
MAX_NEW = 24
RAW = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "Q: What is the boiling point of water?\nA:",
    "In machine learning, overfitting means",
]
CHAT = ["What is 2+3?", "Name a planet in our solar system.", "Why is the sky blue? Answer briefly."]
# (context, continuations): lm-eval's loglikelihood requests for a multiple-choice question
QUESTIONS = [
    ("Question: What is the capital of France?\nAnswer:", [" Paris", " Berlin", " Madrid"]),
    ("Question: How many legs does a spider have?\nAnswer:", [" eight", " six", " four legs"]),
    ("The opposite of hot is", [" cold", " warm", " very hot indeed"]),
    ("Water freezes at a temperature of", [" zero degrees Celsius", " 100 degrees", " 50 degrees"]),
]


@pytest.fixture(scope="module")
def user_default():
    """The suite pins dtype auto to float32 (tests/conftest.py); here the engine resolves it as a user's does."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("VRIKSHA_DTYPE", raising=False)
        yield


@pytest.fixture(scope="module")
def reference(user_default):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vriksha.loading import resolve_model_path

    path = resolve_model_path(None)  # the GGUF dequantized to fp32, as Transformers' GGUF loader writes it
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def llm(user_default):
    engine = LLM()
    assert engine.engine.dtype == torch.float32 and engine.engine.dtype_choice.requested == "auto"
    assert engine.engine.quantization.activations == "float32"
    assert "strict fp32" in engine.engine.runner.matmul_choice
    yield engine
    engine.close()


def reference_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1] log-probs of each token after the first, from one fp32 forward."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def pairs(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) as lm-eval splits them: the continuation's tokens of the whole text."""
    out = []
    for context, choices in QUESTIONS:
        ctx = tokenizer.encode(context)
        for choice in choices:
            whole = tokenizer.encode(context + choice)
            out.append((ctx, whole[len(ctx) :]))
    return out


def engine_scores(llm, requests: list[list[int]]) -> list[list[float]]:
    """Each request's prompt log-probs (one per token after the first), as the server's echo scoring asks."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in requests], params)
    return [
        [step[t] for step, t in zip(o.prompt_logprobs[1:], ids[1:], strict=True)]
        for o, ids in zip(outs, requests, strict=True)
    ]


def traffic(n: int, vocab: int, seed: int) -> list[tuple[dict, SamplingParams]]:
    """`n` other requests of assorted lengths, sampled, some asking for top log-probs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = [rng.randrange(100, vocab) for _ in range(rng.randint(4, 300))]
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=rng.randint(1, 40), logprobs=i % 3)
        out.append(({"prompt_token_ids": ids}, params))
    return out


def scored_amid(
    llm, requests: list[list[int]], others: list[tuple[dict, SamplingParams]]
) -> list[list[float]]:
    """The scoring requests' prompt log-probs when they share the engine's steps with `others`."""
    score = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    mixed = [(i, {"prompt_token_ids": ids}, score) for i, ids in enumerate(requests)]
    mixed += [(None, prompt, params) for prompt, params in others]
    random.Random(len(others)).shuffle(mixed)
    outs = llm.generate([m[1] for m in mixed], [m[2] for m in mixed])
    got: list[list[float]] = [[] for _ in requests]
    for (i, prompt, _), out in zip(mixed, outs, strict=True):
        if i is not None:
            ids = prompt["prompt_token_ids"]
            got[i] = [step[t] for step, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)]
    return got


def assert_faithful(got: list[list[float]], expected: list[torch.Tensor], what: str) -> None:
    for scores, ref in zip(got, expected, strict=True):
        diff = (torch.tensor(scores, dtype=torch.float64) - ref.double()).abs()
        assert diff.max() <= TOL, f"{what}: a token's log-prob is {diff.max():.2e} from the model's"
        answer = abs(sum(scores) - ref.double().sum().item())
        assert answer <= TOL, f"{what}: an answer's log-likelihood is {answer:.2e} from the model's"


def test_greedy_tokens_and_logprobs_are_the_models(llm, reference):
    model, tok = reference
    prompts = [tok.encode(p) for p in RAW]
    for q in CHAT:
        text = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tok.encode(text, add_special_tokens=False))
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for p, out in zip(prompts, outs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        with torch.no_grad():
            theirs = model.generate(
                torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0,
            )[0, len(p) :].tolist()  # fmt: skip
        assert tokens == theirs, f"greedy tokens differ from Transformers' for {tok.decode(p)!r}"
        expected = reference_logprobs(model, p + tokens)[len(p) - 1 :]
        diff = (torch.tensor(out.outputs[0].token_logprobs) - expected).abs().max()
        assert diff <= TOL, f"sampled tokens' log-probs {diff:.2e} from the model's"


def test_answer_scores_do_not_depend_on_the_batch(llm, reference):
    model, tok = reference
    requests = [ctx + cont for ctx, cont in pairs(tok)]
    expected = [reference_logprobs(model, ids) for ids in requests]
    alone = [engine_scores(llm, [ids])[0] for ids in requests]
    assert_faithful(alone, expected, "alone")
    llm.flush_cache()
    vocab = llm.engine.vocab_size
    for n in (16, 64):
        llm.flush_cache()
        amid = scored_amid(llm, requests, traffic(n - len(requests), vocab, seed=n))
        assert_faithful(amid, expected, f"in a batch of {n}")
        for a, b in zip(alone, amid, strict=True):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= TOL


def test_tokens_from_a_cached_prefix_are_the_models(llm, reference):
    """A prompt-scoring request computes every position (it needs their logits), so the prefix cache is
    checked on generation: the second run of each prompt reads its prefix from the cache and samples the same
    tokens with the same log-probs as the first, both the model's."""
    model, tok = reference
    prompts = [ctx for ctx, _ in pairs(tok)[::3]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.flush_cache()
    first = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for p, a, b in zip(prompts, first, again, strict=True):
        assert b.num_cached_tokens > 0 and a.outputs[0].token_ids == b.outputs[0].token_ids
        expected = reference_logprobs(model, p + list(a.outputs[0].token_ids))[len(p) - 1 :]
        for out in (a, b):
            diff = (torch.tensor(out.outputs[0].token_logprobs) - expected).abs().max()
            assert diff <= TOL, f"log-probs {diff:.2e} from the model's ({out.num_cached_tokens} cached)"


def test_answer_scores_in_small_prompt_chunks(user_default, reference):
    model, tok = reference
    requests = [ctx + cont for ctx, cont in pairs(tok)]
    expected = [reference_logprobs(model, ids) for ids in requests]
    options = dict(
        chunked_prefill_size=4, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False
    )
    with LLM(**options) as small:
        assert_faithful(engine_scores(small, requests), expected, "in chunks of 4 tokens")
