"""`benchmarks/grpo_losses.py`: its variants are valid training configs, and what it reads back from a run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from vriksha.train.config import TrainConfig, parse_override

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("grpo_losses", ROOT / "benchmarks" / "grpo_losses.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_variant_is_a_valid_config_of_the_hard_arithmetic_run(bench):
    base = yaml.safe_load((ROOT / "configs" / "grpo_arithmetic_hard.yaml").read_text())
    for name, overrides in bench.VARIANTS.items():
        data = json.loads(json.dumps(base))
        for item in overrides:
            keys, value = parse_override(item)
            section = data
            for key in keys[:-1]:
                section = section.setdefault(key, {})
            section[keys[-1]] = value
        cfg = TrainConfig.from_dict(data)
        if name.startswith(("is_", "off_policy")):
            assert cfg.rollout.max_staleness == 1, name
    assert {"grpo", "dr_grpo", "dapo", "bnpo", "gspo", "cispo"} <= set(bench.VARIANTS)


def test_seconds_per_step_is_the_mean_of_each_seeds_median(bench, tmp_path):
    for seed, times in {0: [1.0, 9.0, 2.0], 1: [4.0, 4.0]}.items():
        (tmp_path / f"seed{seed}").mkdir()
        rows = [json.dumps({"step": i, "time/step_s": t}) for i, t in enumerate(times)]
        (tmp_path / f"seed{seed}" / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    assert bench.seconds_per_step(tmp_path) == pytest.approx((2.0 + 4.0) / 2)


def test_unknown_variants_are_refused(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "dapo,ppo"])
    assert bench.parse_args(["--variants", "dapo,gspo"]).variant_list == ["dapo", "gspo"]
