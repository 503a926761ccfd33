"""The trainer's per-step row sums the ranks' loss statistics by name."""

import types

import pytest
import torch

from vriksha.train.config import OptimConfig
from vriksha.train.grpo import LossStats
from vriksha.train.trainer import GRPOTrainer, build_scheduler


def _part(stats: LossStats, rewards: list[float]) -> dict:
    n = len(rewards)
    return {
        "rewards": rewards,
        "success": [r > 0.5 for r in rewards],
        "lengths": [4] * n,
        "turns": [1] * n,
        "tool_calls": [0] * n,
        "truncated": [False] * n,
        "components": [{"correct": r} for r in rewards],
        "adv": [0.5, -0.5],
        "groups": 1,
        "zero_var": 0,
        "played": 3,
        "played_signal": 1,
        "loss": 0.25,
        "stats": stats,
        "entropy": 3.0,
        "times": (0.1, 0.2, 0.3),
        "memory": {"peak_rss_gb": 1.0},
    }


def test_reduce_sums_loss_stats_by_name_across_ranks():
    param = torch.nn.Parameter(torch.zeros(1))
    owner = types.SimpleNamespace(
        scheduler=build_scheduler(torch.optim.SGD([param], lr=0.1), OptimConfig(), 1)
    )
    a = LossStats(tokens=10, clipped=1, kl=2, ratio=10, importance_weight=9, logprob_gap=0.5)
    b = LossStats(tokens=30, clipped=3, kl=2, ratio=30, importance_weight=31, logprob_gap=1.5)
    row = GRPOTrainer._reduce(owner, 1, [_part(a, [1.0, 0.0]), _part(b, [1.0, 1.0])], 0.7, 2.0)
    assert row["clip_fraction"] == pytest.approx(4 / 40)
    assert row["kl"] == pytest.approx(4 / 40)
    assert row["ratio/mean"] == pytest.approx(1.0)
    assert row["importance_weight/mean"] == pytest.approx(40 / 40)
    assert row["logprob_gap/mean"] == pytest.approx(2 / 40)
    assert row["entropy"] == pytest.approx(6 / 40)
    assert row["reward/mean"] == pytest.approx(0.75) and row["success_rate"] == pytest.approx(0.75)
    assert row["loss"] == pytest.approx(0.5) and row["memory/rank1_peak_rss_gb"] == 1.0
    assert row["groups/total"] == 2 and row["groups/played"] == 6 and row["groups/played_with_signal"] == 2
