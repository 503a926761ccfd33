"""The `repo` environment: an agent edits a task's workspace with tools and submits; hidden tests decide.

Tools: list_files, read_file, write_file, apply_patch (unified diff), run_tests (the visible tests, in the
sandbox) and submit (copies the workspace into a sandbox, adds the hidden tests, runs fail-to-pass and
pass-to-pass). Reward components: `fail_to_pass` (rate), `pass_to_pass` (rate), `resolved` (both complete);
the reward is `resolved`. The task directory (solution, hidden tests) never enters the workspace.

Options: `dataset` (a directory made by `vriksha repo2env`, default `$VRIKSHA_REPO2ENV_DATASET`),
`max_turns`, `test_timeout_s`; `sandbox` is accepted so older configs load, and changes nothing: every test
run is sandboxed. `reset(options={"task_id": ...})` picks a task;
otherwise the seed picks one of the split (one task in ten by id hash, at least one, is in `test`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from vriksha.envs.core import Action, Environment, Observation, StepResult, Tool, ToolError, ToolResult
from vriksha.envs.registry import register_env
from vriksha.envs.rubrics import RubricScore
from vriksha.profiling import phase
from vriksha.repo2env.dataset import Dataset
from vriksha.repo2env.errors import Repo2EnvError
from vriksha.repo2env.grading import Verdict, materialize, verify
from vriksha.repo2env.layout import is_test_file
from vriksha.repo2env.task import TaskFiles

logger = logging.getLogger(__name__)

__all__ = ["RepoEnv", "RepoAction", "score_verdict", "EXPLOITS"]

MAX_READ = 20_000

_FORCE_PASS = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)
EXPLOITS = {  # reward hacks a submission might try: each is undone before the hidden tests run
    "conftest.py": _FORCE_PASS,
    "tests/conftest.py": _FORCE_PASS,
    "sitecustomize.py": "import os\nos._exit(0)\n",
}


class RepoAction(Action):
    """A tool call (`tool` + `arguments`), or free `text`: a text answer ends the episode and the
    workspace is judged as it stands (the same as `submit`)."""

    text: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_of(self) -> RepoAction:
        if (self.text is None) == (self.tool is None):
            raise ValueError(
                "give exactly one of `tool` (+ `arguments`) or `text` (a final answer that submits)"
            )
        return self


def score_verdict(v: Verdict) -> RubricScore:
    comps = {"fail_to_pass": v.f2p_rate, "pass_to_pass": v.p2p_rate, "resolved": float(v.resolved)}
    return RubricScore(total=comps["resolved"], components=comps, success=v.resolved)


def _answer_errors(fn: Callable[..., str]) -> Callable[..., str]:
    """A tool's own failures (no such file, a patch that does not apply) are answers, not exceptions."""

    def call(**kwargs: Any) -> str:
        try:
            return fn(**kwargs)
        except ToolError as exc:
            return f"error: {exc}"

    return call


def split_tasks(task_ids: list[str]) -> dict[str, list[str]]:
    """A fixed, disjoint split: one task in ten (at least one once there are two) is `test`, by id hash."""
    ranked = sorted(task_ids, key=lambda t: hashlib.sha256(t.encode()).hexdigest())
    n_test = max(1, len(ranked) // 10) if len(ranked) >= 2 else 0
    return {"test": sorted(ranked[:n_test]), "train": sorted(ranked[n_test:]) or sorted(ranked)}


@register_env
class RepoEnv(Environment):
    """Repository tasks made by repo2env: edit the workspace with tools, then submit."""

    name = "repo"
    action_type = RepoAction
    max_turns = 40
    runs_untrusted_code = True

    def __init__(
        self,
        dataset: str | Path | None = None,
        max_turns: int = 40,
        sandbox: bool = True,
        test_timeout_s: float = 120.0,
    ) -> None:
        super().__init__()
        from vriksha.envs.sandbox import require_sandbox

        # the self-test: a sandbox that cannot run fails here, at start-up, not in every episode
        require_sandbox(what="submitted code and the hidden tests")
        root = dataset or os.environ.get("VRIKSHA_REPO2ENV_DATASET")
        if not root:
            raise Repo2EnvError(
                "the repo environment needs a dataset: make_env('repo', dataset=DIR) "
                "or set VRIKSHA_REPO2ENV_DATASET to a directory made by `vriksha repo2env`"
            )
        self.dataset = Dataset(root)
        if not self.dataset.task_ids:
            raise Repo2EnvError(
                f"{root} holds no tasks; build some with `vriksha repo2env SOURCE --out {root}`"
            )
        self.max_turns = max_turns
        self.sandbox = sandbox
        self.test_timeout_s = test_timeout_s
        self._task: TaskFiles | None = None
        self._venv: Path | None = None
        self._ws: Path | None = None

    # -- episode ---------------------------------------------------------

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        self._cleanup()
        tid = options.get("task_id")
        if tid is None:
            split = options.get("split", "train")
            ids = split_tasks(self.dataset.task_ids)[split] or self.dataset.task_ids
            tid = random.Random(seed).choice(ids)
        self._task = self.dataset.task(tid)
        self._venv = self.dataset.venv(self._task.meta.venv_key)
        self._ws = Path(tempfile.mkdtemp(prefix="vriksha-repo-ws-"))
        materialize(self._ws, self._task.workspace)
        text = (
            f"{self._task.instruction}\n"
            "You work in the project's directory through tools: list_files, read_file, write_file, apply_patch "
            "(a unified diff), run_tests (the visible tests) and submit (the hidden tests decide; ends the episode)."
        )
        return Observation(
            text=text,
            metadata={"task_id": tid, "repo": self._task.meta.repo, "pipeline": self._task.meta.pipeline},
        )

    def _step(self, action: RepoAction) -> StepResult:  # type: ignore[override]
        if action.tool == "submit" or action.tool is None:
            with phase("env.reward"):
                verdict = self.submit()
            score = score_verdict(verdict)
            text = (
                f"fail-to-pass {len(verdict.f2p_passed)}/{len(verdict.f2p_passed) + len(verdict.f2p_failed)}, "
                f"pass-to-pass {len(verdict.p2p_passed)}/{len(verdict.p2p_passed) + len(verdict.p2p_failed)}"
                + (", resolved" if verdict.resolved else ", not resolved")
            )
            return score.result(Observation(text=text))
        error = False
        try:
            text = self.call_tool(action.tool, action.arguments)
        except ToolError as exc:
            text, error = f"error: {exc}", True
        called = ToolResult(name=action.tool, arguments=dict(action.arguments), output=text, error=error)
        # a tool step is unscored; should the turn limit end the episode here, it ends unsuccessful
        return StepResult(observation=Observation(text=text, tool_results=[called]), success=False)

    def close(self) -> None:
        self._cleanup()
        super().close()

    def _cleanup(self) -> None:
        if self._ws is not None:
            shutil.rmtree(self._ws, ignore_errors=True)
            self._ws = None

    # -- hooks for `vriksha env validate` (private: the agent never sees them) ----

    def _validation_ground_truth(self) -> list[str]:
        """The solution's lines that the workspace lacks: never visible to the agent."""
        assert self._task is not None
        out = []
        for rel, data in self._task.solution.items():
            have = {
                ln.strip()
                for ln in self._task.workspace.get(rel, b"").decode("utf-8", "replace").splitlines()
            }
            out += [
                ln.strip()
                for ln in data.decode("utf-8", "replace").splitlines()
                if len(ln.strip()) >= 12 and ln.strip() not in have
            ]
        return out

    def _validation_solution(self) -> list[dict[str, Any]]:
        assert self._task is not None
        writes = [
            {"tool": "write_file", "arguments": {"path": rel, "content": data.decode()}}
            for rel, data in self._task.solution.items()
        ]
        return [*writes, {"tool": "submit"}]

    def _validation_exploits(self, observation: Observation) -> list[list[dict[str, Any]]]:
        """Submissions that attack the judge instead of fixing the code; each must score 0."""
        return [
            [{"tool": "write_file", "arguments": {"path": path, "content": content}}, {"tool": "submit"}]
            for path, content in EXPLOITS.items()
        ]

    # -- tools -------------------------------------------------------------

    def tools(self) -> list[Tool]:
        s = {"type": "string"}
        tools = [
            Tool(
                "list_files",
                "List the files under a directory of the project (default: all).",
                {"type": "object", "properties": {"path": s}, "additionalProperties": False},
                self.list_files,
            ),
            Tool(
                "read_file",
                "Read a text file of the project.",
                {
                    "type": "object",
                    "properties": {"path": s},
                    "required": ["path"],
                    "additionalProperties": False,
                },
                self.read_file,
            ),
            Tool(
                "write_file",
                "Create or overwrite a file of the project with `content`.",
                {
                    "type": "object",
                    "properties": {"path": s, "content": s},
                    "required": ["path", "content"],
                    "additionalProperties": False,
                },
                self.write_file,
            ),
            Tool(
                "apply_patch",
                "Apply a unified diff (paths relative to the project root, a/ b/ prefixes allowed).",
                {
                    "type": "object",
                    "properties": {"patch": s},
                    "required": ["patch"],
                    "additionalProperties": False,
                },
                self.apply_patch,
            ),
            Tool(
                "run_tests",
                "Run the visible tests (or the given test files / node ids, space-separated) and show "
                "pytest's output.",
                {
                    "type": "object",
                    "properties": {"tests": s},
                    "additionalProperties": False,
                },
                self.run_tests,
            ),
            Tool(
                "submit",
                "Submit the workspace: the hidden tests run and the episode ends.",
                {"type": "object", "properties": {}, "additionalProperties": False},
                lambda: "use step() to submit",
            ),
        ]
        for tool in tools:
            tool.fn = _answer_errors(tool.fn)
        return tools

    def _path(self, rel: str) -> Path:
        if self._ws is None:
            raise ToolError("no episode: call reset() first")
        p = (self._ws / rel).resolve()
        if Path(rel).is_absolute() or not p.is_relative_to(self._ws.resolve()):
            raise ToolError(f"path {rel!r} is outside the project; use a path relative to its root")
        return p

    def list_files(self, path: str = ".") -> str:
        base = self._path(path)
        if not base.exists():
            raise ToolError(f"{path!r} does not exist")
        files = sorted(p.relative_to(self._ws).as_posix() for p in base.rglob("*") if p.is_file())
        return "\n".join(files) or "(no files)"

    def read_file(self, path: str) -> str:
        p = self._path(path)
        if not p.is_file():
            raise ToolError(f"{path!r} is not a file; list_files shows what exists")
        text = p.read_text(errors="replace")
        return (
            text
            if len(text) <= MAX_READ
            else text[:MAX_READ] + f"\n...[{len(text) - MAX_READ} more characters]"
        )

    def write_file(self, path: str, content: str) -> str:
        p = self._path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return f"wrote {len(content)} characters to {path}"

    def apply_patch(self, patch: str) -> str:
        assert self._ws is not None
        if not patch.endswith("\n"):
            patch += "\n"
        last = ""
        for strip in ("-p1", "-p0"):
            proc = subprocess.run(
                ["git", "apply", strip, "--recount", "--whitespace=nowarn", "-"],
                cwd=self._ws,
                input=patch,
                capture_output=True,
                text=True,
                timeout=30,
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_CONFIG_NOSYSTEM": "1",
                    "HOME": str(self._ws),
                },
            )
            if proc.returncode == 0:
                return "patch applied"
            last = proc.stderr.strip()
        raise ToolError(f"the patch does not apply: {last[-800:]}")

    def run_tests(self, tests: str | list[str] | None = None) -> str:
        assert self._ws is not None and self._venv is not None and self._task is not None
        if isinstance(tests, str):
            tests = tests.split()
        if tests:
            for t in tests:
                self._path(t.split("::", 1)[0])
            paths = list(tests)
        else:
            paths = sorted(rel for rel in self._visible_test_files())
            if not paths:
                return "no visible tests in this project; submit runs the hidden ones"
        extra = self._task.meta.pytest_extra_args
        from vriksha.repo2env.testrun import run_tests

        run = run_tests(  # always inside the sandbox
            self._venv / "bin" / "python",
            self._ws,
            paths=paths,
            timeout_s=self.test_timeout_s,
            extra_args=extra,
        )
        note = "\n[timed out]" if run.timed_out else ""
        return run.output[-8000:] + note

    def _visible_test_files(self) -> list[str]:
        assert self._ws is not None
        out = []
        for p in self._ws.rglob("*.py"):
            rel = p.relative_to(self._ws).as_posix()
            if is_test_file(rel) and not rel.endswith("conftest.py"):
                out.append(rel)
        return out

    def submit(self) -> Verdict:
        assert self._task is not None and self._venv is not None and self._ws is not None
        return verify(self._task, self._venv, self._ws)
