from __future__ import annotations

import asyncio
import timeit

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from vriksha.profiling import phase, profiler_active
from vriksha.profiling.annotate import native_call
from vriksha.profiling.operators import is_compute_op
from vriksha.profiling.trace import HOST_OP, load_trace


def _annotations(prof: profile) -> list[str]:
    return [e.name for e in prof.events() if e.name.startswith(("engine.", "train."))]


def test_phase_is_recorded_while_a_profiler_runs():
    @phase("train.backward")
    def backward(x):
        return (x * 2).sum()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert profiler_active()
        with phase("engine.forward"):
            torch.ones(4) + 1
        backward(torch.ones(3))
    names = _annotations(prof)
    assert names.count("engine.forward") == 1
    assert names.count("train.backward") == 1


def test_phase_is_a_shared_no_op_without_a_profiler():
    assert not profiler_active()
    a, b = phase("engine.sample"), phase("engine.sample")
    assert a is b  # no allocation per use when idle
    with a as entered:
        assert entered is a


def test_decorated_before_profiling_is_traced_when_profiling_starts():
    @phase("engine.schedule")
    def schedule():
        return torch.zeros(2).add_(1)

    schedule()  # no profiler: plain call
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = schedule()
    assert out.tolist() == [1.0, 1.0]
    assert _annotations(prof) == ["engine.schedule"]


def test_phase_closes_its_region_when_the_body_raises():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with pytest.raises(ValueError):
            with phase("engine.forward"):
                raise ValueError("boom")
        with phase("engine.sample"):
            pass
    assert _annotations(prof) == ["engine.forward", "engine.sample"]


def test_idle_phase_costs_about_a_microsecond_or_less():
    def use():
        with phase("engine.forward"):
            pass

    n = 20000
    per_call = min(timeit.repeat(use, number=n, repeat=3)) / n
    assert per_call < 5e-6  # ~0.3-0.5 µs here; generous bound for a loaded CI machine


def test_decorated_coroutine_is_annotated_for_its_whole_run():
    @phase("server.parse")
    async def parse():
        await asyncio.sleep(0)
        return torch.ones(2).sum().item()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert asyncio.run(parse()) == 2.0
    [region] = [e for e in prof.events() if e.name == "server.parse"]
    ops = [e for e in prof.events() if e.name == "aten::sum"]
    assert (
        ops
        and region.time_range.start
        <= ops[0].time_range.start
        <= ops[0].time_range.end
        <= region.time_range.end
    )


def test_native_call_is_the_kernel_itself_without_a_profiler():
    def kernel(a, b):
        return a + b

    assert not profiler_active()
    assert native_call(kernel, "linear") is kernel


def test_native_call_is_recorded_as_a_compute_operator(tmp_path):
    def kernel(a, b):
        return a + b

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert native_call(kernel, "decode_layers")(2, 3) == 5
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    ops = [e for e in load_trace(path).events if e.name == "vriksha::decode_layers"]
    assert len(ops) == 1
    assert ops[0].cat == HOST_OP and is_compute_op(ops[0].name)
