"""pass@k and avg@k of an evaluation that samples each episode K times (`vriksha env eval --samples K`).

pass@k is the chance that at least one of k completions drawn (without replacement) from an episode's K
succeeds, averaged over episodes, by the unbiased estimator of Chen et al. (2021, "Evaluating Large
Language Models Trained on Code"): with c successes among K samples,

    pass@k = 1 - C(K - c, k) / C(K, k)

(1 when K - c < k). avg@K is the mean success (and reward) over all K samples of every episode, the
expected score of one sampled completion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SampledScores", "pass_at_k", "report_ks", "sampled_scores"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with `c` successes among `n` samples (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 - prod_{i = n-c+1}^{n} (1 - k / i): the ratio of binomials without their large factorials
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def report_ks(samples: int) -> list[int]:
    """The k reported for K samples: 1, 2, 4, ... below K, and K."""
    ks = [k for k in (2**i for i in range(samples.bit_length())) if k < samples]
    return [*ks, samples]


@dataclass(slots=True)
class SampledScores:
    samples: int  # K completions per episode
    temperature: float
    pass_at: dict[int, float]  # k -> pass@k
    avg_success: float  # avg@K of the success
    avg_reward: float  # avg@K of the reward
    generated_tokens: int


def sampled_scores(
    successes: Sequence[Sequence[bool]], rewards: Sequence[Sequence[float]], temperature: float, tokens: int
) -> SampledScores:
    """The scores of episodes sampled K times each: `successes[i][j]` of episode i's sample j."""
    k_max = len(successes[0]) if successes else 0
    if any(len(row) != k_max for row in successes) or k_max < 1:
        raise ValueError("every episode needs the same number (>= 1) of samples")
    counts = [sum(row) for row in successes]
    n = len(counts)
    return SampledScores(
        samples=k_max,
        temperature=temperature,
        pass_at={k: sum(pass_at_k(k_max, c, k) for c in counts) / n for k in report_ks(k_max)},
        avg_success=sum(counts) / (n * k_max),
        avg_reward=sum(sum(row) for row in rewards) / (n * k_max),
        generated_tokens=tokens,
    )
