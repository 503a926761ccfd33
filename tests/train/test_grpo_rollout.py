"""Rollouts capture exactly the engine's tokens, single-turn and multi-turn (tool calls)."""

import re

import pytest

from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
from vriksha.train.config import EnvConfig, RolloutConfig
from vriksha.train.rollout import RolloutWorker


@pytest.fixture(scope="module")
def tokenizer():
    from vriksha.loading import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(None))


class ScriptedLLM:
    """Answers each request with `script(prompt_text, index)`; records every request it saw."""

    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.script = script
        self.requests = []
        self.eos_token_ids = frozenset({tokenizer.eos_token_id})

    def generate(self, prompts, params, use_tqdm=False):
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            ids = p["prompt_token_ids"]
            self.requests.append((list(ids), sp))
            text = self.tokenizer.decode(ids)
            comps = []
            for i in range(sp.n):
                tok = self.tokenizer(self.script(text, i), add_special_tokens=False)["input_ids"]
                tok = tok + [self.tokenizer.eos_token_id]
                lps = [-0.01 * (k + 1) for k in range(len(tok))]
                comps.append(CompletionOutput(i, self.script(text, i), tok, lps, None, "stop"))
            outs.append(RequestOutput(str(len(self.requests)), None, list(ids), comps, True))
        return outs


def _last_user_expression(text):
    return re.findall(r"Compute (.+?)\.", text)[-1]


def test_single_turn_group_is_one_request_and_token_faithful(tokenizer):
    def script(text, i):
        answer = eval(_last_user_expression(text))
        return f"Answer: {answer}" if i % 2 == 0 else "Answer: 1000"

    llm = ScriptedLLM(tokenizer, script)
    worker = RolloutWorker(
        llm, tokenizer, EnvConfig(name="arithmetic", options={"level": 1}), RolloutConfig()
    )
    groups = worker.play([11, 12], "train", 4, sampling_seeds=[5, 6])
    assert len(llm.requests) == 2  # one request per group: the engine shares the prompt
    assert [sp.n for _, sp in llm.requests] == [4, 4]
    assert [sp.seed for _, sp in llm.requests] == [5, 6]
    for g, (prompt, _) in zip(groups, llm.requests, strict=True):
        assert len(g) == 4
        for e in g:
            assert e.prompt_ids == prompt
            assert e.loss_mask == [1] * len(e.completion_ids)
            assert e.engine_logprobs == pytest.approx([-0.01 * (k + 1) for k in range(len(e.completion_ids))])
            assert e.completion_ids[-1] == tokenizer.eos_token_id
            assert e.turns == 1
        assert [e.reward for e in g] == pytest.approx([1.0, 0.0, 1.0, 0.0])
        assert [e.success for e in g] == [True, False, True, False]
        assert "correct" in g[0].components


def test_multi_turn_tool_calls_keep_exact_token_history(tokenizer):
    def script(text, i):
        if "Calculator result:" not in text:
            return "<calculator>6*7</calculator>"
        return "Answer: 42"

    llm = ScriptedLLM(tokenizer, script)
    worker = RolloutWorker(llm, tokenizer, EnvConfig(name="calculator_tools"), RolloutConfig(max_turns=4))
    (group,) = worker.play([3], "train", 2, sampling_seeds=[9])
    assert len(llm.requests) == 3  # turn 1 for the group (n=2), then one continuation each
    first_prompt = llm.requests[0][0]
    for e, (second_prompt, sp) in zip(group, llm.requests[1:], strict=True):
        assert sp.n == 1
        assert e.turns == 2 and e.tool_calls == 1
        # the second request continues the exact token ids: prompt + generated + environment reply
        assert second_prompt == e.prompt_ids + e.completion_ids[: len(second_prompt) - len(first_prompt)]
        masked = [t for t, m in zip(e.completion_ids, e.loss_mask, strict=True) if m == 0]
        assert "Calculator result: 42" in tokenizer.decode(masked)
        gen = [t for t, m in zip(e.completion_ids, e.loss_mask, strict=True) if m == 1]
        assert tokenizer.decode(gen, skip_special_tokens=True) == "<calculator>6*7</calculator>Answer: 42"
        assert all(lp == 0.0 for lp, m in zip(e.engine_logprobs, e.loss_mask, strict=True) if m == 0)
        assert e.done
