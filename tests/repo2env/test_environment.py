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
    with pytest.raises(ToolError):
        env.call_tool("read_file", {"path": "../../etc/passwd"})
    with pytest.raises(ToolError):
        env.call_tool("write_file", {"path": "/tmp/x.py", "content": ""})
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
    assert res.info["reward_components"]["resolved"] == 0.0
    assert res.info["reward_components"]["fail_to_pass"] == 0.0
    assert res.info["reward_components"]["pass_to_pass"] == 1.0
    env.reset(seed=0, options={"task_id": tid})
    for rel, data in task.solution.items():
        env.step({"tool": "write_file", "arguments": {"path": rel, "content": data.decode()}})
    res = env.step({"tool": "submit"})
    assert res.reward == 1.0 and res.info["success"] is True
    assert res.info["reward_components"] == {"fail_to_pass": 1.0, "pass_to_pass": 1.0, "resolved": 1.0}
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
    assert res.reward == 0.0 and res.info["reward_components"]["resolved"] == 0.0
    env.close()
