from __future__ import annotations

import gzip
import json

import pytest

from vriksha.cli import main
from vriksha.profiling.report import build, format_report
from vriksha.profiling.trace import TraceError, load_trace


def test_plain_torch_profiler_trace_is_parsed(matmul_trace):
    a = build([matmul_trace])
    assert [s.step for s in a.steps] == ["2", "3", "4", "5", "6"]  # the five active ProfilerStep# windows
    forward = next(p for p in a.phases if p.name == "engine.forward")
    assert forward.calls == 5
    assert a.ops[0].name in ("aten::bmm", "aten::mm") and a.ops[0].compute
    assert a.ops[0].calls == 10
    text = format_report(a)
    assert "engine.forward" in text and "aten::bmm" in text


def test_verdict_flips_between_tiny_decode_and_batched_matmul(tiny_trace, matmul_trace):
    tiny, big = build([tiny_trace]), build([matmul_trace])
    assert tiny.verdict == "overhead-bound", format_report(tiny)
    assert big.verdict == "compute-bound", format_report(big)
    assert tiny.compute_share < 0.5 < big.compute_share
    assert big.compute_share > 0.8
    # the threshold is the knob: a tiny one calls even the decode loop compute-bound
    assert build([tiny_trace], threshold=tiny.compute_share / 2).verdict == "compute-bound"
    assert "threshold is 50%" in format_report(tiny)


def test_several_rank_files_are_read_together(tmp_path, tiny_trace, matmul_trace):
    r0 = tmp_path / "train_rank0_step4.pt.trace.json"
    r1 = tmp_path / "train_rank1_step4.pt.trace.json.gz"
    r0.write_bytes(tiny_trace.read_bytes())
    r1.write_bytes(matmul_trace.read_bytes())
    a = build([r0, r1])
    assert sorted({s.rank for s in a.steps}) == [0, 1]
    assert len(a.steps) == 10
    assert next(p for p in a.phases if p.name == "engine.forward").calls == 10
    text = format_report(a)
    assert "rank 0 (train_rank0_step4.pt.trace.json)" in text
    assert "overhead-bound" in text and "compute-bound" in text  # per-rank verdicts differ


def test_cli_prints_report_and_writes_chart_and_json(tmp_path, capsys, tiny_trace):
    png, js = tmp_path / "chart.png", tmp_path / "report.json"
    rc = main(
        ["profile", "report", str(tiny_trace), "--out", str(png), "--json", str(js), "--threshold", "0.6"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "Verdict: OVERHEAD-BOUND" in out and "threshold is 60%" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(js.read_text())
    assert data["verdict"] == "overhead-bound" and data["threshold"] == 0.6


def test_bad_threshold_is_refused(capsys, tiny_trace):
    assert main(["profile", "report", str(tiny_trace), "--threshold", "50"]) == 1
    assert "--threshold must be a fraction" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content,expected",
    [
        (None, "no such trace file"),
        (b"not json at all", "is not valid JSON"),
        (b"\x1f\x8b\x08\x00garbage", "does not decompress"),
        (b"\xff\xfe\x00\x01", "is not"),
        (json.dumps({"hello": 1}).encode(), "not a Chrome trace"),
        (
            json.dumps({"traceEvents": [{"ph": "M", "name": "process_name"}]}).encode(),
            "holds no torch.profiler",
        ),
    ],
)
def test_bad_files_get_a_clear_error_naming_the_file(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TraceError, match=expected) as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_cli_reports_bad_files_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "x.json.gz"
    bad.write_bytes(gzip.compress(b"[1, 2"))
    assert main(["profile", "report", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(bad) in err and "not valid JSON" in err


def _x(name, cat, ts, dur, **kw):
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "ts": ts,
        "dur": dur,
        "pid": kw.pop("pid", 1),
        "tid": kw.pop("tid", 1),
        "args": kw,
    }


def test_device_idle_gaps_are_classified_like_hta(tmp_path, write_trace):
    # one step; aten::mm launches k1, k2 and k3, aten::copy_ launches a copy late (the device waits on the host)
    events = [
        _x("ProfilerStep#7", "user_annotation", 0, 100),
        _x("aten::mm", "cpu_op", 1, 4),
        _x("cudaLaunchKernel", "cuda_runtime", 2, 1, correlation=1),
        _x("cudaLaunchKernel", "cuda_runtime", 3, 1, correlation=2),
        _x("aten::copy_", "cpu_op", 60, 5),
        _x("cudaMemcpyAsync", "cuda_runtime", 61, 1, correlation=3),
        _x("aten::mm", "cpu_op", 50, 2),
        _x("cudaLaunchKernel", "cuda_runtime", 50.5, 1, correlation=4),
        # device stream 7
        _x("gemm_k1", "kernel", 10, 20, pid=0, tid=7, stream=7, correlation=1),
        # 10 ns after k1 ends, launched long before: kernel wait
        _x("gemm_k2", "kernel", 30.01, 9.99, pid=0, tid=7, stream=7, correlation=2),
        # launched at 61, after k2 ended at 40: host wait (22 us)
        _x("Memcpy DtoH", "gpu_memcpy", 62, 3, pid=0, tid=7, stream=7, correlation=3),
        # launched at 50.5, before the copy ended at 65: other (15 us)
        _x("gemm_k3", "kernel", 80, 10, pid=0, tid=7, stream=7, correlation=4),
    ]
    path = write_trace(tmp_path / "gpu_rank2.json", events)
    a = build([path])
    assert a.device
    [idle] = a.idle
    assert idle.rank == 2 and idle.gaps == 3
    assert idle.kernel_wait_us == pytest.approx(0.01)
    assert idle.host_wait_us == pytest.approx(22)
    assert idle.other_us == pytest.approx(15)
    [step] = a.steps
    assert step.step == "7" and step.wall_us == 100
    assert step.compute_us == pytest.approx(39.99)  # k1 + k2 + k3; the memcpy is not compute
    assert step.other_busy_us == pytest.approx(3)
    assert a.verdict == "overhead-bound"
    text = format_report(a)
    assert "host wait" in text and "gemm_k1" in text


def test_old_kineto_categories_and_array_format_are_understood(tmp_path):
    events = [_x("aten::addmm", "Operator", 0, 90), _x("aten::copy_", "Operator", 90, 10)]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(events))
    a = build([path])
    assert a.compute_share == pytest.approx(0.9)
    assert a.verdict == "compute-bound"


def test_unscheduled_capture_is_split_at_long_silences(tmp_path, write_trace):
    # two bursts of work 500 ms apart, as a /start_profile../stop_profile capture of an idle server would have
    events = [
        _x("engine.forward", "user_annotation", 0, 1000),
        _x("aten::mm", "cpu_op", 0, 800),
        _x("engine.forward", "user_annotation", 501_000, 1000),
        _x("aten::mm", "cpu_op", 501_000, 900),
    ]
    path = write_trace(tmp_path / "server_rank0.json", events)
    a = build([path])
    assert [(s.step, s.wall_us) for s in a.steps] == [("busy0", 1000), ("busy1", 1000)]
    assert a.compute_share == pytest.approx(0.85)  # the silence is waiting for work, not overhead
    assert "busy windows" in format_report(a)
    whole = build([path], idle_gap_ms=1000)
    assert [s.step for s in whole.steps] == ["all"] and whole.verdict == "overhead-bound"
    by_phase = build([path], step_phase="engine.forward")
    assert [s.step for s in by_phase.steps] == ["0", "1"]
    assert all(p.name != "engine.forward" for p in by_phase.phases)


def test_cpu_trace_of_tiny_calls_gets_the_dispatch_note(tmp_path, write_trace):
    # 100 compute calls of 8 us each back to back: 100% "compute", but every call is dispatch-sized
    events = [_x("aten::add", "cpu_op", 10 * i, 8) for i in range(100)]
    a = build([write_trace(tmp_path / "adds.json", events)])
    assert a.tiny_compute_fraction == 1.0
    assert "calls shorter than 20 µs" in format_report(a)
    big = build([write_trace(tmp_path / "mm.json", [_x("aten::mm", "cpu_op", 0, 5000)])])
    assert "calls shorter than" not in format_report(big)


def test_steps_spent_in_native_kernels_read_as_compute(native_trace):
    """torch's profiler sees no operator inside a ctypes call: the engine's kernels record themselves as
    `vriksha::<kernel>` and the report counts them as compute, else a native decode step reads as overhead."""
    a = build([native_trace])
    linear = next(o for o in a.ops if o.name == "vriksha::linear")
    assert linear.compute and linear.calls == 4 * 5
    assert a.verdict == "compute-bound", format_report(a)
    assert a.compute_share > 0.8
    forward = next(p for p in a.phases if p.name == "engine.forward")
    assert forward.compute_share > 0.8  # the phase holds the kernel's time as compute
    assert all(p.name != "vriksha::linear" for p in a.phases)  # an operator, not a phase
