from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest
import torch

from vriksha.errors import ConfigError
from vriksha.profiling import ProfileConfig, StepProfiler, add_profile_args, phase
from vriksha.profiling.report import build
from vriksha.profiling.trace import load_trace


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_profile_args(p)
    return p.parse_args(argv)


def test_flags_round_trip_into_the_config(tmp_path):
    args = _parse(
        ["--profile", "--profile-dir", str(tmp_path), "--profile-skip", "2", "--profile-wait", "0"]
        + [
            "--profile-warmup",
            "2",
            "--profile-active",
            "4",
            "--profile-repeat",
            "3",
            "--profile-memory",
            "--profile-shapes",
        ]
    )
    cfg = ProfileConfig.from_args(args)
    assert cfg == ProfileConfig(True, tmp_path, 2, 0, 2, 4, 3, True, True)
    assert cfg.steps_needed == 2 + 3 * (0 + 2 + 4)
    assert ProfileConfig.from_args(_parse([])).enabled is False
    assert ProfileConfig.from_args(argparse.Namespace()) == ProfileConfig()


@pytest.mark.parametrize("field,value", [("active", 0), ("wait", -1), ("skip", -2), ("repeat", -1)])
def test_bad_schedule_values_are_refused_with_the_flag_named(field, value):
    with pytest.raises(ConfigError, match=f"--profile-{field}"):
        ProfileConfig(enabled=True, **{field: value})


def _run(prof: StepProfiler, steps: int) -> list[Path]:
    prof.start()
    for _ in range(steps):
        with phase("engine.schedule"):
            pass
        with phase("engine.forward"):
            torch.ones(8, 8) @ torch.ones(8, 8)
        prof.step()
    return prof.stop()


def test_schedule_writes_one_trace_per_cycle_named_by_rank_and_step(tmp_path):
    cfg = ProfileConfig(enabled=True, dir=tmp_path, skip=1, wait=1, warmup=1, active=2, repeat=2)
    files = _run(StepProfiler(cfg, rank=3, name="generate"), steps=12)
    # step 0 skipped; cycle = wait 1 + warmup 1 + active 2 -> windows close after steps 5 and 9
    assert [f.name for f in files] == [
        "generate_rank3_step5.pt.trace.json.gz",
        "generate_rank3_step9.pt.trace.json.gz",
    ]
    assert sorted(tmp_path.iterdir()) == files
    for f in files:
        trace = load_trace(f)
        assert trace.rank == 3
        names = [e.name for e in trace.events if e.cat == "user_annotation"]
        assert names.count("engine.forward") == 2  # exactly the two active steps
        assert names.count("engine.schedule") == 2
        assert sum(n.startswith("ProfilerStep#") for n in names) == 2
    report = build(files)  # both cycles read together by the report
    assert [s.step for s in report.steps] == ["3", "4", "7", "8"]
    assert {p.name: p.calls for p in report.phases} == {"engine.forward": 4, "engine.schedule": 4}


def test_stop_inside_an_active_window_flushes_it(tmp_path):
    cfg = ProfileConfig(enabled=True, dir=tmp_path, wait=0, warmup=1, active=5, repeat=1)
    files = _run(StepProfiler(cfg, rank=0, name="train"), steps=3)
    assert [f.name for f in files] == ["train_rank0_step3.pt.trace.json.gz"]
    names = [e.name for e in load_trace(files[0]).events if e.cat == "user_annotation"]
    assert names.count("engine.forward") == 2


def test_unscheduled_captures_keep_counting_steps_and_never_overwrite(tmp_path):
    cfg = ProfileConfig(enabled=True, dir=tmp_path)
    prof = StepProfiler(cfg, rank=1, name="serve", use_schedule=False)
    first = _run(prof, steps=2)
    second = _run(prof, steps=3)
    assert [f.name for f in first] == ["serve_rank1_step2.pt.trace.json.gz"]
    assert [f.name for f in second] == ["serve_rank1_step5.pt.trace.json.gz"]
    names = [e.name for e in load_trace(second[0]).events if e.cat == "user_annotation"]
    assert names.count("engine.forward") == 3
    assert prof.traces == first + second


def test_disabled_profiler_is_a_no_op(tmp_path):
    prof = StepProfiler(ProfileConfig(enabled=False, dir=tmp_path / "never"), rank=0, name="generate")
    with prof:
        prof.step()
        assert not prof.running
    assert prof.stop() == []
    assert not (tmp_path / "never").exists()


def test_phases_in_other_threads_are_captured(tmp_path):
    cfg = ProfileConfig(enabled=True, dir=tmp_path, wait=0, warmup=0, active=1, repeat=1)
    prof = StepProfiler(cfg, rank=0, name="serve")
    prof.start()

    def engine_loop():
        with phase("engine.forward"):
            torch.ones(4) * 2

    worker = threading.Thread(target=engine_loop)
    worker.start()
    worker.join()
    prof.step()
    [trace] = prof.stop()
    assert "engine.forward" in [e.name for e in load_trace(trace).events if e.cat == "user_annotation"]


def test_unwritable_profile_dir_is_a_clear_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    prof = StepProfiler(ProfileConfig(enabled=True, dir=blocker / "traces"), rank=0, name="train")
    with pytest.raises(ConfigError, match="--profile-dir .* cannot be created"):
        prof.start()
    assert not prof.running
