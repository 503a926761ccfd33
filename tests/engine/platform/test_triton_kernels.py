"""The Triton kernel set: where the registry offers it, and its kernels against torch through Triton's
interpreter (TRITON_INTERPRET=1, CPU tensors), in a child process so that the interpreter is chosen before
triton is imported and never leaks into the rest of the suite. The cases are tests/engine/platform/triton_cases.py;
on a GPU, benchmarks/gpu_check.sh runs them compiled.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from vriksha.engine.platform import kernel_sets
from vriksha.errors import ConfigError

if importlib.util.find_spec("triton") is None:
    pytest.skip(
        "triton is not installed: the Triton kernel set is untested (pip install 'vriksha[gpu]')",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[3]
CASES = "tests/engine/platform/triton_cases.py"
HOST = torch.empty(0).device
CHILD_TIMEOUT_S = 600


def test_registry_offers_triton_only_where_it_compiles(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "triton" in kernel_sets.names()
    assert "triton" not in kernel_sets.available(HOST, torch.float32)
    assert "triton" not in kernel_sets.available("meta", torch.float32)
    with pytest.raises(ConfigError, match="kernel set 'triton' does not run"):
        kernel_sets.select("triton", HOST, torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter runs it on the CPU, by name only
    assert "triton" in kernel_sets.available(HOST, torch.bfloat16)
    assert "triton" not in kernel_sets.available(HOST, torch.float64)
    assert kernel_sets.select("auto", HOST, torch.float16).name == "torch"
    assert kernel_sets.select("auto", HOST, torch.float32).name != "triton"


@pytest.fixture(scope="module")
def interpreted_cases(tmp_path_factory) -> dict[str, str]:
    """Run the cases once under the interpreter; {case id: "passed" or its failure text}."""
    report = tmp_path_factory.mktemp("triton") / "cases.xml"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "pytest", CASES, "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    cmd += [f"--basetemp={tmp_path_factory.mktemp('child')}"]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:  # run() has killed the child
        pytest.fail(f"the interpreted triton cases ran past {CHILD_TIMEOUT_S} s")
    if not report.exists():
        pytest.fail(
            f"the interpreted triton cases did not run:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            results[case.get("name")] = (failure.get("message") or "") + "\n" + (failure.text or "")
        elif skipped is not None:
            results[case.get("name")] = "skipped: " + (skipped.get("message") or "")
        else:
            results[case.get("name")] = "passed"
    return results


GROUPS = ("decode_attention", "rms_norm", "silu_gating", "rotary_embedding", "falls_back", "engine_greedy")


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS)
def test_interpreted_kernels_match_torch(interpreted_cases, group):
    cases = {name: result for name, result in interpreted_cases.items() if group in name}
    assert cases, f"no interpreted case named {group!r} ran:\n" + "\n".join(
        f"{name}: {result}" for name, result in interpreted_cases.items()
    )
    failed = {name: result for name, result in cases.items() if result != "passed"}
    assert not failed, "\n\n".join(f"{name}: {result}" for name, result in failed.items())
