"""The `repo` environment: registry, tools, the oracle scores 1.0 and the untouched workspace 0."""

from __future__ import annotations

import difflib

import pytest

from vriksha.envs.core import ToolError
from vriksha.envs.registry import list_envs, make_env
from vriksha.repo2env.dataset import Dataset

pytestmark = pytest.mark.slow


def _first(out, prefix):
    return next(t for t in Dataset(out).task_ids if t.startswith(prefix))


def test_registered_and_serves_a_task(tiny_dataset):
    _, _, out = tiny_dataset
    assert "repo" in list_envs()
    env = make_env("repo", dataset=str(out), sandbox=False)
    res = env.reset(seed=3)
    names = {t.name for t in res.observation.tools}
    assert {"list_files", "read_file", "write_file", "apply_patch", "run_tests", "submit"} <= names
    assert res.observation.metadata["task_id"] in Dataset(out).task_ids
    files = env.call_tool("list_files", {}).splitlines()
    assert "tinyproj/mathx.py" in files
    assert "outside the project" in env.call_tool("read_file", {"path": "../../etc/passwd"})
    assert "outside the project" in env.call_tool("write_file", {"path": "/tmp/x.py", "content": ""})
    assert "not a file" in env.call_tool("read_file", {"path": "nope.py"})
    with pytest.raises(ToolError):  # argument validation stays an error of the call itself
        env.call_tool("read_file", {})
    env.close()


def test_untouched_workspace_scores_zero_and_oracle_one_in_the_sandbox(tiny_dataset):
    _, _, out = tiny_dataset
    ds = Dataset(out)
    tid = _first(out, "implement_function")
    task = ds.task(tid)
    env = make_env("repo", dataset=out, sandbox=True)
    env.reset(seed=0, options={"task_id": tid})
    res = env.step({"tool": "submit"})
    assert res.terminated and res.reward == 0.0
    assert res.components["resolved"] == 0.0
    assert res.components["fail_to_pass"] == 0.0
    assert res.components["pass_to_pass"] == 1.0
    env.reset(seed=0, options={"task_id": tid})
    for rel, data in task.solution.items():
        env.step({"tool": "write_file", "arguments": {"path": rel, "content": data.decode()}})
    res = env.step({"tool": "submit"})
    assert res.reward == 1.0 and res.success is True
    assert res.components == {"fail_to_pass": 1.0, "pass_to_pass": 1.0, "resolved": 1.0}
    env.close()


def test_apply_patch_and_run_tests(tiny_dataset):
    _, _, out = tiny_dataset
    ds = Dataset(out)
    tid = _first(out, "fix_bug")
    task = ds.task(tid)
    env = make_env("repo", dataset=out, sandbox=False)
    env.reset(seed=0, options={"task_id": tid})
    rel, fixed = next(iter(task.solution.items()))
    broken = env.call_tool("read_file", {"path": rel})
    patch = "".join(
        difflib.unified_diff(broken.splitlines(True), fixed.decode().splitlines(True), f"a/{rel}", f"b/{rel}")
    )
    assert patch
    assert env.step(
        {"tool": "apply_patch", "arguments": {"patch": "--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-x\n+y\n"}}
    ).observation.text.startswith("error:")
    assert env.call_tool("apply_patch", {"patch": patch}) == "patch applied"
    assert env.call_tool("read_file", {"path": rel}) == fixed.decode()
    visible = env.call_tool("run_tests", {})
    one = env.call_tool(
        "run_tests", {"tests": "tests/test_describe.py::test_describe_does_not_crash_the_caller"}
    )
    assert "1 passed" in one, one
    assert "passed" in visible or "no visible tests" in visible
    res = env.step({"tool": "submit"})
    assert res.reward == 1.0
    env.close()


def test_wrong_fix_is_not_resolved(tiny_dataset):
    _, _, out = tiny_dataset
    tid = _first(out, "implement_function")
    task = Dataset(out).task(tid)
    env = make_env("repo", dataset=out, sandbox=False)
    env.reset(seed=0, options={"task_id": tid})
    rel = next(iter(task.solution))
    text = env.call_tool("read_file", {"path": rel}).replace(
        'raise NotImplementedError("implement this function")', "return 0"
    )
    env.call_tool("write_file", {"path": rel, "content": text})
    res = env.step({"tool": "submit"})
    assert res.reward == 0.0 and res.components["resolved"] == 0.0
    env.close()


@pytest.mark.parametrize("path", ["conftest.py", "tests/conftest.py", "sitecustomize.py"])
def test_judge_tampering_scores_zero(tiny_dataset, path, monkeypatch):
    """A conftest that forces every report to pass (or a sitecustomize that exits 0) would resolve the
    task if it reached the verifier; submit removes it first."""
    import vriksha.repo2env.grading as verify_mod
    from vriksha.repo2env.environment import EXPLOITS

    _, _, out = tiny_dataset
    tid = _first(out, "implement_function")
    env = make_env("repo", dataset=out, sandbox=False)
    env.reset(seed=0, options={"task_id": tid})
    env.call_tool("write_file", {"path": path, "content": EXPLOITS[path]})
    res = env.step({"tool": "submit"})
    assert res.reward == 0.0
    if path.endswith("conftest.py"):  # the same attack with the protection switched off does fool pytest
        env.reset(seed=0, options={"task_id": tid})
        env.call_tool("write_file", {"path": path, "content": EXPLOITS[path]})
        monkeypatch.setattr(verify_mod, "protect", lambda tree, task: None)
        assert env.step({"tool": "submit"}).reward == 1.0
    env.close()


def test_env_validator_contract(tiny_dataset):
    from vriksha.envs.validate import validate_env

    _, _, out = tiny_dataset
    report = validate_env(
        "repo", seeds=2, adversarial_episodes=1, env_kwargs={"dataset": str(out), "sandbox": False}
    )
    bad = {c.name: c.detail for c in report.checks if not c.ok}
    assert not bad, bad
