"""`arithmetic`: compute an expression; the answer is parsed from free text.

Levels (options={"level": N}; by default the seed picks one):
1. one-digit a + b or a - b          4. two-digit operands, mixed + - *
2. one-digit a + b, a - b, a * b     5. three operands, mixed + - * with precedence
3. two-digit a + b or a - b          6. four operands with parentheses and exact division

Reward: 0.9 for the right number (+0.1 when stated as `Answer: N`); a wrong, missing, hedged or
overlong answer scores 0. Problems whose answer appears in the prompt are never drawn, so echoing
the question cannot score. Splits are a hash of the expression: test problems never occur in train.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from vriksha.envs.builtin.common import answer_rubric, chat, numbers_in, same_number, sample_in_split
from vriksha.envs.core import Environment, Observation, State, StepResult, TextAction
from vriksha.envs.registry import register_env

LEVELS = (1, 2, 3, 4, 5, 6)
SYSTEM = "You are a careful calculator. Solve the problem, then give the final answer on its own line as `Answer: <number>`."


@dataclass(slots=True)
class Problem:
    expression: str
    answer: int
    level: int


def _operand(rng: random.Random, level: int) -> int:
    return rng.randint(0, 9) if level <= 2 else rng.randint(10, 99)


def _binary(rng: random.Random, level: int, ops: str) -> str:
    a, b, op = _operand(rng, level), _operand(rng, level), rng.choice(ops)
    if op == "-" and level <= 3 and a < b:
        a, b = b, a
    return f"{a} {op} {b}"


def _make(level: int):
    def make(rng: random.Random) -> Problem | None:
        if level == 1:
            expr = _binary(rng, 1, "+-")
        elif level == 2:
            expr = _binary(rng, 2, "+-*")
        elif level == 3:
            expr = _binary(rng, 3, "+-")
        elif level == 4:
            expr = _binary(rng, 4, "+-*")
        elif level == 5:
            a, b, c = (rng.randint(2, 99) for _ in range(3))
            expr = f"{a} {rng.choice('+-*')} {b} {rng.choice('+-*')} {c}"
        else:
            q, d = rng.randint(2, 20), rng.randint(2, 12)
            a, b = rng.randint(2, 60), rng.randint(2, 60)
            expr = f"({a} {rng.choice('+-')} {b}) * {rng.randint(2, 9)} - {q * d} / {d}"
        answer = eval(expr, {"__builtins__": {}})  # our own generated expression, never model text
        if answer != int(answer):
            return None
        answer = int(answer)
        if any(same_number(x, answer) for x in numbers_in(expr)):
            return None  # echoing the question must not score
        return Problem(expr, answer, level)

    return make


class ArithmeticState(State):
    level: int = 1


@register_env
class ArithmeticEnv(Environment):
    """Compute an arithmetic expression; the answer is parsed from free text."""

    name = "arithmetic"
    action_type = TextAction
    state_type = ArithmeticState
    max_turns = 1

    def __init__(self, level: int | None = None, max_chars: int = 4000) -> None:
        super().__init__()
        if level is not None and level not in LEVELS:
            raise ValueError(f"arithmetic: level must be one of {LEVELS}, got {level!r}")
        self.level = level
        self._problem: Problem | None = None
        self._rubric = answer_rubric(lambda ep: ep.answer, max_chars=max_chars)

    def _reset(self, seed: int, options: dict[str, Any]) -> Observation:
        rng = random.Random(seed)
        level = options.get("level", self.level) or rng.choice(LEVELS)
        if level not in LEVELS:
            raise ValueError(f"arithmetic: level must be one of {LEVELS}, got {level!r}")
        self._problem = sample_in_split(rng, self.state.split, _make(level), key=lambda p: p.expression)
        self.state.level = level
        text = f"Compute {self._problem.expression}."
        return Observation(
            text=f"{text} Give the final answer on its own line as `Answer: <number>`.",
            messages=chat(SYSTEM, text),
            metadata={"level": level},
        )

    def _step(self, action: TextAction) -> StepResult:
        score = self._rubric(self._problem, action.text)
        return score.result(Observation(text="", metadata={"level": self.state.level}))

    # hooks for `vriksha env validate` (private: never exposed to the agent)
    def _validation_ground_truth(self) -> list[str]:
        return [str(self._problem.answer)]

    def _validation_solution(self) -> list[dict[str, Any]]:
        return [{"text": f"Working it out step by step.\nAnswer: {self._problem.answer}"}]

    def _validation_exploits(self, observation: Observation) -> list[list[dict[str, Any]]]:
        spread = "\n".join(f"Answer: {i}" for i in range(-100, 10_000))
        return [[{"text": spread}], [{"text": f"\\boxed{{{self._problem.expression}}}"}]]
