"""The rollout-mode comparison over seeds (`benchmarks/grpo_modes_seeds.py`): the spread and the paired
differences it reports are computed from each seed's own runs, and an unfinished seed is never averaged in."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grpo_modes_seeds.py"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("grpo_modes_seeds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(steps_per_hour: float, before: float, after: float) -> dict:
    return {
        "steps_per_hour": steps_per_hour,
        "total_s": 3600 * 12 / steps_per_hour,
        "staleness_mean": 0.0,
        "eval_before": before,
        "eval_after": after,
    }


def test_speed_ratio_and_learning_gap_are_paired_per_seed(report):
    per_seed = {
        0: {"sync": summary(100, 0.4, 0.9), "async": summary(50, 0.4, 0.8)},
        1: {"sync": summary(200, 0.5, 0.9), "async": summary(150, 0.5, 0.95)},
        2: {"sync": summary(150, 0.3, 0.7), "async": summary(75, 0.3, 0.6)},
    }
    sync, async_ = report.summarise(per_seed, ["sync", "async"])
    assert sync["vs_sync"]["values"] == [1.0, 1.0, 1.0]
    assert async_["vs_sync"]["values"] == pytest.approx([0.5, 0.75, 0.5])
    assert async_["vs_sync"]["std"] == pytest.approx(statistics.stdev([0.5, 0.75, 0.5]))
    assert async_["after_minus_sync"]["values"] == pytest.approx([-0.1, 0.05, -0.1])
    assert async_["gain"]["mean"] == pytest.approx(statistics.mean([0.4, 0.45, 0.3]))
    assert sync["steps_per_hour"]["mean"] == pytest.approx(150)


def test_a_seed_missing_a_mode_is_not_read(report, tmp_path):
    (tmp_path / "grpo_vs_trl.json").write_text(json.dumps({"vriksha": {"summary": summary(100, 0.4, 0.9)}}))
    assert report.read_seed(tmp_path, ["sync", "async"]) is None
    assert report.read_seed(tmp_path, ["sync"])["sync"]["steps_per_hour"] == 100
    assert report.read_seed(tmp_path / "absent", ["sync"]) is None


def test_flags_it_sets_itself_are_refused_after_the_separator(report):
    with pytest.raises(SystemExit):
        report.parse_args(["--seeds", "0,1", "--", "--seed", "3"])
    args = report.parse_args(["--seeds", "0,1", "--modes", "sync,server", "--", "--steps", "4"])
    assert args.seed_list == [0, 1] and args.mode_list == ["sync", "server"]
    assert args.passthrough == ["--steps", "4"]
