"""`python_functions`: write a function from a description; hidden tests run in the sandbox.

The model's code and the hidden test *inputs* go into the sandbox; a small harness imports the
code, calls the function on each input and writes what came back (JSON, plain types only). The
expected outputs never leave this process, and comparison is strict about types (True is not 1,
an object that claims to equal everything is not a list), so the code cannot talk its way to a
pass. Reward = fraction of hidden tests passed; success = all passed.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from vriksha.envs.builtin.common import chat, sample_in_split
from vriksha.envs.builtin.function_tasks import FunctionTask, draw_task
from vriksha.envs.core import Environment, Observation, State, StepResult, TextAction
from vriksha.envs.registry import register_env
from vriksha.envs.rubrics import Criterion, Sequence
from vriksha.envs.sandbox import require_sandbox, run_sandboxed, sandbox_python
from vriksha.envs.secret import salted_rng

SYSTEM = "You write correct, self-contained Python 3 functions. Reply with one ```python code block."
MAX_CODE_CHARS = 20_000

HARNESS = r"""
import json, signal, sys
def _alarm(*_): raise TimeoutError("test took too long")
signal.signal(signal.SIGALRM, _alarm)
def plain(x, depth=0):
    t = type(x)
    if depth > 20: raise TypeError("too deep")
    if x is None or t in (bool, int, str): return x
    if t is float: return x if x == x and abs(x) != float("inf") else repr(x)
    if t in (list, tuple): return [plain(v, depth + 1) for v in x]
    if t is dict: return {"__dict__": [[plain(k, depth + 1), plain(v, depth + 1)] for k, v in x.items()]}
    raise TypeError("unsupported return type " + t.__name__)
out = open("results.jsonl", "w")
name, per_call = sys.argv[1], float(sys.argv[2])
inputs = json.load(open("inputs.json"))
ns = {"__name__": "solution"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
    fn = ns[name]
except BaseException as e:
    out.write(json.dumps({"load_error": type(e).__name__ + ": " + str(e)[:200]}) + "\n"); out.flush()
    raise SystemExit(1)
for i, args in enumerate(inputs):
    try:
        signal.setitimer(signal.ITIMER_REAL, per_call)
        got = fn(*args)
        signal.setitimer(signal.ITIMER_REAL, 0)
        line = json.dumps({"i": i, "out": plain(got)})
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        line = json.dumps({"i": i, "error": type(e).__name__})
    out.write(line + "\n"); out.flush()
"""


def _plain(x: Any) -> Any:
    """The parent-side twin of the harness's `plain`, applied to the reference outputs."""
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is float:
        return x if math.isfinite(x) else repr(x)
    if type(x) in (list, tuple):
        return [_plain(v) for v in x]
    if type(x) is dict:
        return {"__dict__": [[_plain(k), _plain(v)] for k, v in x.items()]}
    raise TypeError(f"reference returned {type(x).__name__}")


def same_value(got: Any, want: Any) -> bool:
    if type(got) is not type(want):
        return (
            isinstance(got, int | float)
            and isinstance(want, float)
            and not isinstance(got, bool)
            and (math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9))
        )
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(want, list):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict):
        return same_value(got.get("__dict__"), want.get("__dict__"))
    return got == want


def _distinct_inputs(task: FunctionTask, rng: random.Random, n: int, seen: set[str]) -> list[tuple]:
    out: list[tuple] = []
    for _ in range(200):
        if len(out) == n:
            break
        args = task.inputs(rng)
        k = json.dumps(args)
        if k not in seen:
            seen.add(k)
            out.append(args)
    return out


_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block, or the whole text when it is bare code with a `def`."""
    blocks = _CODE_BLOCK.findall(text or "")
    if blocks:
        return blocks[-1]
    return text if re.search(r"^\s*def\s+\w+\s*\(", text or "", re.MULTILINE) else ""


@dataclass(slots=True)
class Episode:
    task: FunctionTask
    hidden_inputs: list[tuple]
    expected: list[Any]
    results: list[bool] = field(default_factory=list)
    sandbox: dict[str, Any] = field(default_factory=dict)


class PythonFunctionsState(State):
    function_name: str = ""
    num_hidden_tests: int = 0


@register_env
class PythonFunctionsEnv(Environment):
    """Write a Python function from a description; hidden tests decide."""

    name = "python_functions"
    action_type = TextAction
    state_type = PythonFunctionsState
    max_turns = 1
    runs_untrusted_code = True

    def __init__(
        self, num_tests: int = 8, per_test_s: float = 1.0, timeout_s: float = 10.0, memory_mb: int = 512
    ):
        super().__init__()
        # self-test at start-up: a sandbox that cannot run (or cannot isolate) fails here, loudly
        self.sandbox_report = require_sandbox(what="python_functions' hidden tests")
        self.num_tests, self.per_test_s, self.timeout_s, self.memory_mb = (
            num_tests,
            per_test_s,
            timeout_s,
            memory_mb,
        )
        self._episode: Episode | None = None
        tests = Criterion("tests_passed", lambda ep, code: self._run_tests(ep, code))
        defines = Criterion(
            "defines_function", lambda ep, code: bool(re.search(rf"def\s+{ep.task.name}\s*\(", code))
        )
        # the tests run only when the function is defined at all
        self._rubric = Sequence([(defines, 0.0, 1.0), (tests, 1.0, 0.0)])

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        rng = random.Random(seed)
        task = sample_in_split(rng, self.state.split, draw_task, key=lambda t: t.key)
        examples = _distinct_inputs(task, rng, 2, set())
        # hidden inputs: salted with the server's secret, so the seed and this source do not reveal them
        hidden = _distinct_inputs(
            task, salted_rng(seed, self.name, task.key), self.num_tests, {json.dumps(a) for a in examples}
        )
        self._episode = Episode(task, hidden, [_plain(task.reference(*a)) for a in hidden])
        self.state.function_name = task.name
        self.state.num_hidden_tests = len(hidden)
        shown = "\n".join(
            f"    {task.name}({', '.join(map(repr, a))}) == {task.reference(*a)!r}" for a in examples
        )
        text = (
            f"Write a Python function `{task.signature}`.\n{task.description}\nExamples:\n{shown}\n"
            "Reply with the complete function in one ```python code block; it may use only the standard library."
        )
        return Observation(text=text, messages=chat(SYSTEM, text), metadata={"function_name": task.name})

    def _run_tests(self, ep: Episode, code: str) -> float:
        files = {"solution.py": code, "inputs.json": json.dumps(ep.hidden_inputs), "harness.py": HARNESS}
        res = run_sandboxed(
            [sandbox_python(), "-I", "-S", "harness.py", ep.task.name, str(self.per_test_s)],
            files=files,
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_procs=16,
            collect=["results.jsonl"],
        )
        passed = [False] * len(ep.expected)
        for line in res.files.get("results.jsonl", b"").decode("utf-8", "replace").splitlines():
            try:
                rec = json.loads(line)
                i = rec.get("i")
                if isinstance(i, int) and 0 <= i < len(passed) and "out" in rec:
                    passed[i] = same_value(rec["out"], ep.expected[i])
            except (json.JSONDecodeError, AttributeError):
                continue
        ep.results = passed
        ep.sandbox = {
            "exit_code": res.exit_code,
            "timed_out": res.timed_out,
            "limit_hit": res.limit_hit,
            "network_isolated": res.network_isolated,
            "missing_protections": res.missing,
            "duration_s": round(res.duration_s, 3),
            "stderr_tail": res.stderr[-500:],
        }
        return sum(passed) / len(passed) if passed else 0.0

    def _step(self, action: TextAction) -> StepResult:
        code = extract_code(action.text) if len(action.text) <= MAX_CODE_CHARS else ""
        ep = self._episode
        score = self._rubric(ep, code)
        info = {"tests": {"passed": sum(ep.results), "total": len(ep.expected)}, "sandbox": ep.sandbox}
        return score.result(Observation(text=""), info=info)

    # hooks for `vriksha env validate` (private: never exposed to the agent)
    def _validation_ground_truth(self) -> list[str]:
        return [s for s in (json.dumps(list(a)) for a in self._episode.hidden_inputs) if len(s) >= 6]

    def _validation_exploits(self, observation: Observation) -> list[list[dict[str, Any]]]:
        name = self._episode.task.name
        forge = "\n".join(
            f'{{"i": {i}, "passed": true, "out": "PASS"}}' for i in range(len(self._episode.expected))
        )
        return [
            [{"text": f"```python\n{code}\n```"}]
            for code in (
                f"import os\nos._exit(0)\ndef {name}(*a): pass",
                f"import sys\nsys.exit(0)\ndef {name}(*a): pass",
                f"class Any(list):\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\ndef {name}(*a): return Any()",
                f"open('results.jsonl', 'w').write({forge!r})\nimport os\nos._exit(0)\ndef {name}(*a): pass",
                f"import json\ndef {name}(*a):\n    return json.load(open('inputs.json'))",
                f"def {name}(*a):\n    raise SystemExit(0)",
                f"import socket\ndef {name}(*a):\n    return socket.create_connection(('127.0.0.1', 80), timeout=1)",
            )
        ]
