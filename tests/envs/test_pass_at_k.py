"""pass@k by the unbiased estimator, and `evaluate(..., samples=K)` through the real engine."""

from __future__ import annotations

import itertools
import math

import pytest

from vriksha.envs import Environment, Observation, StepResult
from vriksha.envs.pass_at_k import pass_at_k, report_ks, sampled_scores


def _by_enumeration(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n samples (c of them successes) holding at least one success."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_success(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_by_enumeration(n, c, k), abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_1_is_the_success_rate_and_bad_counts_are_refused():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 0, 10) == 0.0 and pass_at_k(10, 1, 10) == 1.0
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)


def test_reported_ks_and_the_averages_over_episodes():
    assert report_ks(1) == [1] and report_ks(4) == [1, 2, 4] and report_ks(6) == [1, 2, 4, 6]
    scores = sampled_scores(
        [[True, False, False, False], [False, False, False, False], [True, True, True, True]],
        [[1.0, 0.0, 0.5, 0.0], [0.0] * 4, [1.0] * 4],
        temperature=1.0,
        tokens=12,
    )
    assert scores.avg_success == pytest.approx(5 / 12)
    assert scores.avg_reward == pytest.approx(5.5 / 12)
    assert scores.pass_at[1] == pytest.approx((1 / 4 + 0 + 1) / 3)
    assert scores.pass_at[2] == pytest.approx((0.5 + 0 + 1) / 3)
    assert scores.pass_at[4] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="same number"):
        sampled_scores([[True], [True, False]], [[1.0], [1.0, 0.0]], 1.0, 0)


class EvenLengthEnv(Environment):
    """One turn, a success when the completion's length is even: sampled completions differ in it."""

    name = "test_even_length"
    max_turns = 1

    def _reset(self, seed, options):
        text = f"Say something about {seed}."
        return Observation(text=text, messages=[{"role": "user", "content": text}])

    def _step(self, action):
        even = len(action.text) % 2 == 0
        return StepResult(observation=Observation(), reward=float(even), terminated=True, success=even)


@pytest.fixture(scope="module")
def tiny_llm():
    llm_mod = pytest.importorskip("vriksha.engine.core.llm")
    from tests.tiny_llama import embedded_tokenizer, tiny_llama

    tok = embedded_tokenizer()
    model = tiny_llama(tok, max_position_embeddings=2048, bos_token_id=tok.bos_token_id)
    return llm_mod.LLM.from_module(model.eval(), tok)


def test_evaluate_reports_pass_at_k_beside_greedy(tiny_llm):
    from vriksha.envs.eval import evaluate

    run = dict(episodes=6, max_tokens=5, progress=False, seed=7)
    greedy = evaluate(EvenLengthEnv, tiny_llm, **run)
    res = evaluate(EvenLengthEnv, tiny_llm, samples=4, **run)
    assert greedy.sampled is None
    assert [r.completions for r in res.records] == [r.completions for r in greedy.records]  # greedy unchanged
    s = res.sampled
    assert s is not None and s.samples == 4 and list(s.pass_at) == [1, 2, 4]
    assert 0.0 < s.avg_success < 1.0, "the samples should differ in success"
    assert s.pass_at[1] == pytest.approx(s.avg_success)  # pass@1 estimates one sample's success
    assert s.pass_at[1] <= s.pass_at[2] <= s.pass_at[4]
    assert s.avg_reward == pytest.approx(s.avg_success) and s.generated_tokens > 0
    again = evaluate(EvenLengthEnv, tiny_llm, samples=4, **run)
    assert again.sampled == s  # seeded samples repeat
    with pytest.raises(ValueError, match="temperature > 0"):
        evaluate(EvenLengthEnv, tiny_llm, samples=4, sample_temperature=0.0, **run)
