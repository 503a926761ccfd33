"""A step's metrics: each rank's share is a typed record; the shares combine across ranks by name and kind
(sums, maxima, minima), as tensors in a process group and by `StepMetrics.merge` for given shares."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from vriksha.train.losses import DAPOLoss
from vriksha.train.rollout import Episode
from vriksha.train.step_metrics import StepMetrics
from vriksha.train.update import UpdateResult

ROOT = Path(__file__).resolve().parents[2]


def _part(
    sums: dict[str, float], tokens: float, rewards: list[float], extra_component: bool = False
) -> StepMetrics:
    episodes = [
        Episode(
            group=0,
            member=m,
            seed=0,
            prompt_ids=[1],
            completion_ids=[2, 3, 4, 5],
            loss_mask=[1, 1, 1, 1],
            reward=r,
            components={"correct": r, **({"format": 0.5} if extra_component else {})},
            success=r > 0.5,
            turns=1,
        )
        for m, r in enumerate(rewards)
    ]
    update = UpdateResult(loss=0.25, tokens=tokens, metrics=dict(sums), entropy_sum=3.0)
    return StepMetrics.of_rank(
        episodes,
        [0.5, -0.5],
        update,
        groups=1,
        zero_variance_groups=0,
        played_groups=3,
        played_with_signal=1,
        seconds=(0.1, 0.2, 0.3),
        memory={"peak_rss_gb": 1.0},
    )


def _metrics(clipped: float, kl: float, ratio: float, weight: float, gap: float) -> dict[str, float]:
    values = (clipped, kl, ratio, weight, gap)
    return dict(zip(DAPOLoss.metric_names, values, strict=True))


A = _metrics(clipped=1, kl=2, ratio=10, weight=9, gap=0.5)
B = _metrics(clipped=3, kl=2, ratio=30, weight=31, gap=1.5)


def test_reduce_sums_loss_stats_by_name_across_ranks():
    total = StepMetrics.merge([_part(A, 10, [1.0, 0.0]), _part(B, 30, [1.0, 1.0])])
    row = total.row(1, grad_norm=0.7, lr=0.1, step_s=2.0)
    assert row["clip_fraction"] == pytest.approx(4 / 40)
    assert row["kl"] == pytest.approx(4 / 40)
    assert row["ratio/mean"] == pytest.approx(1.0)
    assert row["importance_weight/mean"] == pytest.approx(40 / 40)
    assert row["logprob_gap/mean"] == pytest.approx(2 / 40)
    assert row["entropy"] == pytest.approx(6 / 40)
    assert row["reward/mean"] == pytest.approx(0.75) and row["success_rate"] == pytest.approx(0.75)
    assert row["loss"] == pytest.approx(0.5) and row["memory/rank1_peak_rss_gb"] == 1.0
    assert row["groups/total"] == 2 and row["groups/played"] == 6 and row["groups/played_with_signal"] == 2


def test_row_reports_spread_extremes_and_counts_as_before():
    row = StepMetrics.merge([_part(A, 10, [1.0, 0.0]), _part(B, 30, [1.0, 1.0])]).row(1, 0.7, 0.1, 2.0)
    assert row["reward/std"] == pytest.approx(0.4330127, rel=1e-6)  # population std of 1, 0, 1, 1
    assert row["advantage/min"] == -0.5 and row["advantage/max"] == 0.5 and row["advantage/std"] == 0.5
    assert row["completion_tokens/max"] == 4 and isinstance(row["completion_tokens/max"], int)
    assert row["time/rollout_s"] == 0.2 and row["reward/correct"] == pytest.approx(0.75)
    nothing = StepMetrics.of_rank(
        [Episode(0, 0, 0, [1], [2], loss_mask=[1])],
        [],
        UpdateResult(metrics=dict.fromkeys(DAPOLoss.metric_names, 0.0)),
        groups=1,
        zero_variance_groups=1,
        played_groups=1,
        played_with_signal=0,
        seconds=(0.0, 0.0, 0.0),
        memory={},
    )
    row = nothing.row(1, 0.0, 0.1, 1.0)  # no group with signal: zeros, and every loss metric still named
    assert row["advantage/min"] == row["advantage/max"] == row["advantage/mean"] == 0.0
    assert all(row[name] == 0.0 for name in DAPOLoss.metric_names)


def _rank(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    part = _part(A, 10, [1.0, 0.0]) if rank == 0 else _part(B, 30, [1.0, 1.0], extra_component=True)
    if rank == 1:
        part.advantages, part.advantage_sum, part.advantage_squares = 0, 0.0, 0.0
        part.advantage_max, part.advantage_min = float("-inf"), float("inf")
    row = part.reduce().row(1, 0.7, 0.1, 2.0)
    Path(out, f"{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_reduce_as_tensors_to_what_merge_gives(tmp_path):
    """Rank 1 has a reward component rank 0 lacks and no advantages: names are aligned, extremes kept."""
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, str(ROOT))
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    a, b = _part(A, 10, [1.0, 0.0]), _part(B, 30, [1.0, 1.0], extra_component=True)
    b.advantages, b.advantage_sum, b.advantage_squares = 0, 0.0, 0.0
    b.advantage_max, b.advantage_min = float("-inf"), float("inf")
    expected = json.loads(json.dumps(StepMetrics.merge([a, b]).row(1, 0.7, 0.1, 2.0)))
    rows = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert rows[0] == rows[1] == expected
    assert expected["reward/format"] == pytest.approx(0.25) and expected["advantage/min"] == -0.5
