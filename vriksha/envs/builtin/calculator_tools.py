"""`calculator_tools`: multi-turn word problems the model must solve by calling a `calculator` tool.

Each turn the model either calls the tool, as a `ToolCallAction` (tool="calculator",
arguments={"expression": ...}) or inside its text as `<calculator>EXPR</calculator>` (or a
`<tool_call>{"name": "calculator", "arguments": {...}}</tool_call>` block), and sees the result; or it
answers (`Answer: N`), which ends the episode. Reward: the arithmetic answer rubric, gated on at
least one calculator call (answers without the tool score 0). At most `max_turns` turns.

The calculator evaluates arithmetic only (numbers, + - * / // % ** with bounded exponents,
parentheses) through the AST, never `eval` of model text; it knows nothing of the problem.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import model_validator

from vriksha.envs import tool_calls
from vriksha.envs.builtin.common import answer_rubric, chat, numbers_in, same_number, sample_in_split
from vriksha.envs.core import (
    Action,
    Environment,
    Observation,
    State,
    StepResult,
    StopConditions,
    Tool,
    ToolError,
    ToolResult,
)
from vriksha.envs.registry import register_env
from vriksha.envs.rubrics import Criterion, TrajectoryRubric

MAX_EXPRESSION_CHARS = 200


class CalculatorAction(Action):
    """Either free text (`text`, possibly holding a tool call) or a structured tool call."""

    text: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] = {}

    @model_validator(mode="after")
    def _one_of(self) -> CalculatorAction:
        if (self.text is None) == (self.tool is None):
            raise ValueError(
                "give exactly one of `text` (an answer or a call in text) or `tool` (+ `arguments`)"
            )
        return self


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression safely; errors come back as text the model can read."""
    if not isinstance(expression, str) or not expression.strip() or len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: give an arithmetic expression of 1 to {MAX_EXPRESSION_CHARS} characters"
    try:
        value = _eval(ast.parse(expression.replace("^", "**").replace(",", ""), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError) as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(round(value, 10) if isinstance(value, float) else value)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 1e6):
            raise ValueError("exponent too large")
        out = _OPS[type(node.op)](a, b)
        if abs(out) > 1e18:
            raise ValueError("result too large")
        return out
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


@dataclass(slots=True)
class Problem:
    text: str
    answer: int


def _make(rng: random.Random) -> Problem | None:
    kind = rng.randrange(6)
    if kind == 0:
        n, p, paid = rng.randint(12, 95), rng.randint(13, 99), 0
        paid = (n * p // 1000 + 1) * 1000 + rng.choice([0, 1000])
        text = f"A shop sells pencils at {p} cents each. Maya buys {n} pencils and pays with {paid} cents. How much change, in cents, does she get?"
        ans = paid - n * p
    elif kind == 1:
        rows, cols, broken = rng.randint(12, 60), rng.randint(12, 60), rng.randint(3, 40)
        text = f"A theatre has {rows} rows of {cols} seats. {broken} seats are broken. How many seats can be used?"
        ans = rows * cols - broken
    elif kind == 2:
        speed, hours, mins = rng.randint(41, 97), rng.randint(2, 9), rng.choice([15, 30, 45])
        text = f"A train travels at {speed} km per hour for {hours} hours and {mins} minutes. How many kilometres does it travel? (Give a whole number if it is one, otherwise a decimal.)"
        ans = speed * (hours * 60 + mins) / 60
        if ans != int(ans):
            return None
    elif kind == 3:
        boxes, per, eaten, friends = (
            rng.randint(11, 48),
            rng.randint(12, 36),
            rng.randint(5, 60),
            rng.randint(3, 9),
        )
        total = boxes * per - eaten
        if total % friends:
            return None
        text = f"Ravi has {boxes} boxes with {per} cookies each. He eats {eaten} cookies and shares the rest equally among {friends} friends. How many cookies does each friend get?"
        ans = total // friends
    elif kind == 4:
        a, b, c = rng.randint(101, 999), rng.randint(101, 999), rng.randint(11, 99)
        text = f"A warehouse holds {a} crates. It receives {b} more, then ships {c} crates on each of 3 days. How many crates are left?"
        ans = a + b - 3 * c
    else:
        price, qty, pct = rng.randint(120, 980), rng.randint(3, 24), rng.choice([10, 20, 25, 50])
        text = f"A jacket costs {price} rupees. A school buys {qty} jackets with a {pct}% discount on the total. How much does it pay?"
        ans = price * qty * (100 - pct) / 100
        if ans != int(ans):
            return None
    ans = int(ans)
    if ans < 0 or any(same_number(x, ans) for x in numbers_in(text)):
        return None
    return Problem(text, ans)


_TAG_CALL = re.compile(r"<calculator>(.*?)(?:</calculator>|$)", re.DOTALL)  # a stop string may cut the tag
STOP = StopConditions(strings=["</calculator>"])  # one call per reply: generation stops after the closing tag


def find_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """A tool call written inside free text, if any (the first one): this environment's own
    `<calculator>EXPR</calculator>` tag, else a `<tool_call>` block (an unreadable one calls no tool)."""
    if m := _TAG_CALL.search(text):
        return "calculator", {"expression": m.group(1).strip()}
    if call := tool_calls.find_tool_call(text):
        return call.name, dict(call.arguments)
    if tool_calls.MARKER in text:
        return "", {}
    return None


@dataclass(slots=True)
class Episode:
    problem: Problem
    calls: list[tuple[str, str]] = field(default_factory=list)  # (expression, result)
    messages: list[dict[str, Any]] = field(default_factory=list)


class CalculatorState(State):
    tool_calls: int = 0


SYSTEM = (
    "Solve the word problem. You must use the calculator: write <calculator>EXPRESSION</calculator> "
    "(one call per reply) and wait for the result. When you know the result, reply with "
    "`Answer: <number>` on its own line."
)


@register_env
class CalculatorToolsEnv(Environment):
    """Multi-turn word problems solved by calling a calculator tool."""

    name = "calculator_tools"
    action_type = CalculatorAction
    state_type = CalculatorState
    max_turns = 6

    def __init__(self, max_turns: int = 6) -> None:
        super().__init__()
        self.max_turns = max_turns
        self._episode: Episode | None = None
        used = Criterion(
            "used_calculator", lambda ep, traj: len([c for c in ep.calls if not c[1].startswith("error")]) > 0
        )
        self._rubric = TrajectoryRubric(
            final=answer_rubric(lambda ep: ep.answer),
            shaping={"used_calculator": (used, 0.0)},
            gate="used_calculator",
        )

    def tools(self) -> list[Tool]:
        return [
            Tool(
                name="calculator",
                description="Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).",
                parameters={
                    "type": "object",
                    "properties": {"expression": {"type": "string", "description": "e.g. (37 * 24) - 150"}},
                    "required": ["expression"],
                    "additionalProperties": False,
                },
                fn=calculate,
            )
        ]

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        rng = random.Random(seed)
        problem = sample_in_split(rng, self.state.split, _make, key=lambda p: p.text)
        self._episode = Episode(problem, messages=chat(SYSTEM, problem.text))
        return Observation(
            text=f"{SYSTEM}\n\n{problem.text}", messages=list(self._episode.messages), stop=STOP.model_copy()
        )

    def _step(self, action: CalculatorAction) -> StepResult:
        ep = self._episode
        call = (action.tool, action.arguments) if action.tool is not None else find_tool_call(action.text)
        if action.text is not None:
            ep.messages.append({"role": "assistant", "content": action.text})
        if call is not None:
            name, args = call
            error = False
            try:
                result = self.call_tool(name, args)
            except ToolError as exc:
                result, error = f"error: {exc}", True
            called = ToolResult(name=name, arguments=dict(args), output=result, error=error)
            ep.calls.append((str(args.get("expression", "")), result))
            self.state.tool_calls = len(ep.calls)
            if action.text is None:
                ep.messages.append(
                    {"role": "assistant", "content": f"<calculator>{args.get('expression', '')}</calculator>"}
                )
            feedback = f"Calculator result: {result}"
            ep.messages.append({"role": "user", "content": feedback})
            if self.state.step_count >= self.max_turns:
                score = self._rubric(_Scored(ep), [""])
                return StepResult(
                    observation=Observation(text=feedback, messages=list(ep.messages), tool_results=[called]),
                    reward=0.0,
                    truncated=True,
                    components=dict(score.components),
                    success=False,
                )
            return StepResult(
                observation=Observation(
                    text=feedback, messages=list(ep.messages), stop=STOP.model_copy(), tool_results=[called]
                ),
            )
        score = self._rubric(_Scored(ep), [action.text])
        return score.result(Observation(text="", messages=list(ep.messages)))

    # hooks for `vriksha env validate` (private: never exposed to the agent)
    def _validation_ground_truth(self) -> list[str]:
        return [str(self._episode.problem.answer)]

    def _validation_solution(self) -> list[dict[str, Any]]:
        return [
            {"text": "<calculator>2 * 3</calculator>"},
            {"text": f"Answer: {self._episode.problem.answer}"},
        ]

    def _validation_exploits(self, observation: Observation) -> list[list[dict[str, Any]]]:
        ans = self._episode.problem.answer
        return [
            [{"tool": "calculator", "arguments": {"expression": "1 + 1"}}],  # calls until the turn limit
            [{"text": f"Answer: {ans}"}],  # right, but without the tool it does not count
            [
                {"tool": "calculator", "arguments": {"expression": "__import__('os').getcwd()"}},
                {"text": f"Answer: {ans}"},
            ],
            [{"tool": "no_such_tool", "arguments": {}}, {"text": f"Answer: {ans}"}],
            [
                {"text": "<calculator>1+1</calculator>"},
                {"text": "Answer: " + " ".join(map(str, range(2000)))},
            ],
        ]


@dataclass(slots=True)
class _Scored:
    """What the rubric sees: the answer plus the calls made (private to this process)."""

    episode: Episode

    @property
    def answer(self) -> int:
        return self.episode.problem.answer

    @property
    def calls(self) -> list[tuple[str, str]]:
        return self.episode.calls
