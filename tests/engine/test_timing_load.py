"""The engine's kept timings carry the machine's load when they were measured; one taken under load is timed
again on the next load (with a warning), `vriksha tune` times them all again, `generate --verbose` says when
and under what load each was measured."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from tests.server.conftest import REPO, build_tiny_model, child_env
from vriksha import fast_dtype, timing_load
from vriksha.device import host
from vriksha.errors import ConfigError
from vriksha.net.launch import vriksha_command
from vriksha.timing_load import LoadWatch, MachineLoad

QUIET = MachineLoad(others=0.02, loadavg_1m=0.3, cpus=2)
BUSY = MachineLoad(others=0.8, loadavg_1m=6.0, cpus=2)


@pytest.fixture
def fresh_process(monkeypatch, tmp_path):
    """A cache dir and timing state of their own, as a new process would have; the default load limit."""
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    monkeypatch.delenv("VRIKSHA_TIMING_MAX_LOAD", raising=False)
    monkeypatch.delenv("VRIKSHA_DTYPE", raising=False)
    for name, value in (("_used", {}), ("_fresh", set()), ("_warned", set()), ("_remeasure", False)):
        monkeypatch.setattr(timing_load, name, value)
    return tmp_path


def _new_process(monkeypatch) -> None:
    """Forget what this process measured, as the next engine load in a new process would."""
    for name, value in (("_used", {}), ("_fresh", set()), ("_warned", set())):
        monkeypatch.setattr(timing_load, name, value)


def test_the_load_limit_is_a_share_of_the_cpus(monkeypatch):
    monkeypatch.delenv("VRIKSHA_TIMING_MAX_LOAD", raising=False)
    assert timing_load.max_load() == timing_load.DEFAULT_MAX_LOAD
    assert not QUIET.busy() and BUSY.busy()
    assert "80% of 2 CPUs" in BUSY.describe() and "load average 6.00" in BUSY.describe()
    assert MachineLoad.from_dict(BUSY.to_dict()) == BUSY and MachineLoad.from_dict({"x": 1}) is None
    # without a measured share, the load average less this process, over the CPUs
    assert MachineLoad(None, 1.2, 4).share() == pytest.approx(0.05)
    monkeypatch.setenv("VRIKSHA_TIMING_MAX_LOAD", "1")
    assert not BUSY.busy()
    for bad in ("0", "1.5", "lots"):
        monkeypatch.setenv("VRIKSHA_TIMING_MAX_LOAD", bad)
        with pytest.raises(ConfigError, match="VRIKSHA_TIMING_MAX_LOAD"):
            timing_load.max_load()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/stat"), reason="Linux")
def test_a_watch_sees_other_work_on_its_cpus():
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spin = "\n".join(
        [
            "import os, time",
            f"os.sched_setaffinity(0, {{{cpu}}})",
            "end = time.time() + 3",
            "while time.time() < end: pass",
        ]
    )
    child = subprocess.Popen([sys.executable, "-c", spin])
    os.sched_setaffinity(0, {cpu})  # this thread (the watch reads its own CPUs) shares the spinning one's CPU
    try:
        time.sleep(0.5)
        watch = LoadWatch()
        time.sleep(1.0)  # the "timing": this thread idle, the other process busy on the same CPU
        load = watch.load()
    finally:
        os.sched_setaffinity(0, before)
        child.wait()
    assert load.cpus == 1 and load.others is not None and load.others > 0.5, load


def _dtype_record(cache, load: MachineLoad | None) -> str:
    """Set the kept dtype record's load (None: as kept before loads were recorded); returns its key."""
    known = json.loads((cache / fast_dtype.CACHE_FILE).read_text())
    (key,) = known
    if load is None:
        known[key].pop("load")
    else:
        known[key]["load"] = load.to_dict()
    (cache / fast_dtype.CACHE_FILE).write_text(json.dumps(known))
    return key


SHAPES = [fast_dtype.LinearShape(64, 64, count=2)]


def test_a_timing_kept_quiet_is_reused_one_kept_busy_is_timed_again(fresh_process, monkeypatch, caplog):
    first = fast_dtype.choose_dtype(SHAPES, host())
    stored = json.loads((fresh_process / fast_dtype.CACHE_FILE).read_text())
    (record,) = stored.values()
    assert first.how == "measured" and MachineLoad.from_dict(record["load"]) is not None
    assert record["measured_at"] <= time.time()

    _dtype_record(fresh_process, QUIET)
    _new_process(monkeypatch)
    assert fast_dtype.choose_dtype(SHAPES, host()).how == "cached"

    for kept, warning in ((BUSY, "were taken while other work used 80%"), (None, "carry no machine load")):
        _dtype_record(fresh_process, kept)
        _new_process(monkeypatch)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vriksha.timing_load"):
            again = fast_dtype.choose_dtype(SHAPES, host())
        assert again.how == "measured"
        assert any(warning in r.getMessage() for r in caplog.records), caplog.text


def test_a_timing_measured_under_load_serves_its_run_then_is_timed_again(fresh_process, monkeypatch, caplog):
    monkeypatch.setattr(LoadWatch, "load", lambda self: BUSY)
    with caplog.at_level(logging.WARNING, logger="vriksha.timing_load"):
        first = fast_dtype.choose_dtype(SHAPES, host())
    assert first.how == "measured"
    assert any("timed the dtype while other work used 80%" in r.getMessage() for r in caplog.records)
    assert fast_dtype.choose_dtype(SHAPES, host()).how == "cached"  # the run that took it uses it
    assert timing_load.busy_records() == ["dtype"]
    _new_process(monkeypatch)
    assert fast_dtype.choose_dtype(SHAPES, host()).how == "measured"  # the next load times it again


def test_remeasuring_times_a_quiet_record_again_once(fresh_process, monkeypatch):
    fast_dtype.choose_dtype(SHAPES, host())
    _dtype_record(fresh_process, QUIET)
    _new_process(monkeypatch)
    with timing_load.remeasuring():
        assert fast_dtype.choose_dtype(SHAPES, host()).how == "measured"
        assert fast_dtype.choose_dtype(SHAPES, host()).how == "cached"  # measured in this process already
    (line,) = timing_load.report()
    assert line.startswith("dtype: 1 record(s) (measured in this run), measured 2")


@pytest.mark.slow
def test_tune_times_every_choice_again_and_generate_verbose_says_when(tmp_path, tmp_path_factory):
    tiny_model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    env = {**child_env(), "VRIKSHA_CACHE": str(tmp_path), "VRIKSHA_TIMING_MAX_LOAD": "1"}
    env.pop("VRIKSHA_DTYPE", None)

    def vriksha(*args: str) -> subprocess.CompletedProcess:
        cmd = vriksha_command(*args, "--model", str(tiny_model_dir), log_level="WARNING")
        done = subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def stamps() -> dict[str, float]:
        out = {}
        for name in ("dtype_choice.json", "fast_linear.json", "native_decode.json"):
            for key, entry in json.loads((tmp_path / name).read_text()).items():
                assert MachineLoad.from_dict(entry["load"]) is not None, (name, key)
                out[f"{name}:{key}"] = entry["measured_at"]
        return out

    tuned = vriksha("tune")
    kinds = {line.split(":")[0] for line in tuned.stdout.splitlines()}
    assert {"dtype", "linear-path plan", "native decode"} <= kinds, tuned.stdout
    assert all("(measured in this run)" in line for line in tuned.stdout.splitlines()), tuned.stdout
    first = stamps()
    vriksha("tune")
    again = stamps()
    assert first.keys() == again.keys() and all(again[k] > first[k] for k in first)

    shown = vriksha("generate", "--prompt", "hi", "--max-tokens", "2", "--dtype", "fastest", "--verbose")
    lines = [line for line in shown.stderr.splitlines() if line.startswith("engine: timings: ")]
    assert {line.split(":")[2].strip() for line in lines} >= {"dtype", "linear-path plan", "native decode"}
    assert all("(cached), measured 2" in line and "CPUs" in line for line in lines), lines


def test_a_router_record_kept_before_loads_were_recorded_is_timed_again(fresh_process, caplog):
    import torch

    from vriksha.engine import fast_linear
    from vriksha.engine.installation import ModuleInstallation

    model = torch.nn.Sequential(torch.nn.Linear(32, 48))
    probe = fast_linear.FastLinear.__new__(fast_linear.FastLinear)
    probe.native, probe.bf16 = None, False
    key = probe.key(model[0])
    old = {key: ["linear"] * len(fast_linear.BUCKETS)}  # the format before loads were recorded
    (fresh_process / "fast_linear.json").write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING, logger="vriksha.timing_load"):
        fast_linear.FastLinear(model, ModuleInstallation(model), None)
    assert any("linear-path plan timings carry no machine load" in r.getMessage() for r in caplog.records)
    entry = json.loads((fresh_process / "fast_linear.json").read_text())[key]
    assert MachineLoad.from_dict(entry["load"]) is not None and len(entry["timing"]) == len(
        fast_linear.BUCKETS
    )
