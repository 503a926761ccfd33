"""The per-shape matmul router gives F.linear's results on every path it picks, and follows weights changed in place."""

import json

import pytest
import torch
import torch.nn.functional as F

from vriksha.engine import fast_linear
from vriksha.engine.installation import ModuleInstallation
from vriksha.engine.native import kernels


@pytest.mark.parametrize("use_native", [True, False])
def test_routed_linears_equal_f_linear_and_follow_weight_updates(monkeypatch, tmp_path, use_native):
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 48, bias=False))
    native = kernels() if use_native else None
    installation = ModuleInstallation(model)
    router = fast_linear.FastLinear(model, installation, native)
    plan = {
        key: entry["timing"] for key, entry in json.loads((tmp_path / "fast_linear.json").read_text()).items()
    }
    assert len(plan) == 2
    for choice in plan.values():
        assert len(choice) == len(fast_linear.BUCKETS) and set(choice) <= set(fast_linear.PATHS)
        assert use_native or "native" not in choice

    def check() -> None:
        with router.engaged(), torch.inference_mode():
            for rows in (1, 3, 20, 70):
                x = torch.randn(rows, 32)
                want = F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight)
                torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-4)
        assert not router.active

    check()
    with torch.no_grad():
        for layer in model:
            layer.weight.mul_(-2.0)
    router.refresh()
    check()
    installation.undo()
    assert all("forward" not in vars(layer) for layer in model)
    assert all(layer.forward.__func__ is torch.nn.Linear.forward for layer in model)


def test_derived_copies_are_made_on_first_use_and_dropped_by_refresh():
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 48)
    paths = {"transposed"} | ({"mkldnn"} if fast_linear._mkldnn_available(torch.float32) else set())
    layouts = fast_linear._Layouts(linear, paths)
    assert layouts.nbytes() == 0
    x = torch.randn(5, 32)
    with torch.inference_mode():
        for path in paths:
            torch.testing.assert_close(layouts.run(path, x), F.linear(x, linear.weight, linear.bias))
    assert layouts.nbytes() >= len(paths) * linear.weight.numel() * 4
    assert not layouts.transposed.is_inference()  # usable outside inference mode too
    layouts.refresh()
    assert layouts.nbytes() == 0


def test_large_buckets_are_extrapolated_not_timed(monkeypatch):
    """The output head's buckets whose one call would exceed MAX_TIMED_MACS are not timed: they take the last
    timed bucket's path (bf16 arithmetic where the CPU only emulates it took seconds a call on the head)."""
    import vriksha.engine.measured_router as mr

    monkeypatch.setattr(mr, "MAX_TIMED_MACS", 48 * 32 * 4)  # rows above 4 are not timed
    calls = []
    run = fast_linear._Layouts.run
    monkeypatch.setattr(
        fast_linear._Layouts, "run", lambda self, p, x: calls.append(x.shape[0]) or run(self, p, x)
    )
    plan = fast_linear._choose(48, 32, torch.float32, True, None, head=True)
    assert max(calls) == 4
    last_timed = fast_linear.BUCKETS.index(4)
    assert plan[last_timed + 1 :] == [plan[last_timed]] * (len(fast_linear.BUCKETS) - last_timed - 1)
    calls.clear()
    fast_linear._choose(48, 32, torch.float32, True, None)  # a body layer: its prefill buckets are timed
    assert max(calls) == fast_linear.BUCKETS[-1]


def test_extrapolated_timings_scale_with_rows():
    from vriksha.engine.measured_router import extrapolated, timed_buckets

    assert timed_buckets((1, 2, 4), 1 << 40) == 1  # the first bucket is always timed
    out = extrapolated([{"a": 1.0, "b": 2.0}, {"a": 2.0, "b": 3.0}], (1, 2, 8))
    assert out[2] == {"a": 8.0, "b": 12.0}
