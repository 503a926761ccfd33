"""Shared pieces of the built-in environments: held-out splits, answer parsing, answer rubrics."""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Callable
from typing import Any, TypeVar

from vriksha.envs.rubrics import Criterion, Gate, Rubric, WeightedSum

T = TypeVar("T")

TEST_FRACTION = 0.2
MAX_ANSWER_CHARS = 4000

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_ANSWER_LINE_RE = re.compile(r"(?im)^[ \t*#>]*(?:final[ \t]+)?answer[ \t]*[:=][ \t]*(.*?)[ \t*.]*$")
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


def split_of(key: str, test_fraction: float = TEST_FRACTION) -> str:
    """Deterministic split of a problem by its content: the same problem is always in one split."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return "test" if h < test_fraction else "train"


def sample_in_split(
    rng: random.Random,
    split: str,
    make: Callable[[random.Random], T],
    key: Callable[[T], str],
    tries: int = 10_000,
) -> T:
    """Draw problems from `make` until one lands in `split` (and passes `make`'s own checks)."""
    for _ in range(tries):
        item = make(rng)
        if item is not None and split_of(key(item)) == split:
            return item
    raise RuntimeError(f"no problem in split {split!r} after {tries} draws; the generator is too narrow")


def _to_number(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def numbers_in(text: str) -> list[float]:
    return [x for x in (_to_number(m) for m in _NUMBER_RE.findall(text)) if x is not None]


def parse_answer(text: str) -> float | None:
    """The answer in free text: the `Answer: N` line (or `\\boxed{N}`) if there is one, else the last
    number. Marked answers that hold several numbers or disagree with each other are no answer."""
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    marked = _ANSWER_LINE_RE.findall(text) + _BOXED_RE.findall(text)
    if marked:
        values = set()
        for m in marked:
            nums = _NUMBER_RE.findall(m)
            if len(nums) != 1:
                return None
            values.add(_to_number(nums[0]))
        return values.pop() if len(values) == 1 else None  # several different marked answers: a hedge
    nums = numbers_in(text)
    return nums[-1] if nums else None


def has_answer_format(text: str) -> bool:
    """Exactly one `Answer: N` line (or one `\\boxed{N}`) with a single number."""
    if not isinstance(text, str):
        return False
    marked = _ANSWER_LINE_RE.findall(text) + _BOXED_RE.findall(text)
    return (
        len(marked) == 1
        and len(_NUMBER_RE.findall(marked[0])) == 1
        and bool(re.fullmatch(rf"\s*{_NUMBER}\s*", marked[0]))
    )


def same_number(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def answer_rubric(get_answer: Callable[[Any], float], max_chars: int = MAX_ANSWER_CHARS) -> Rubric:
    """length gate -> correctness gate -> 0.9 correct + 0.1 format: a wrong answer scores 0 whatever its
    format; a right one earns the format bonus when it is stated as `Answer: N`."""
    length_ok = Criterion("length_ok", lambda ep, text: isinstance(text, str) and 0 < len(text) <= max_chars)
    correct = Criterion("correct", lambda ep, text: same_number(parse_answer(text), get_answer(ep)))
    fmt = Criterion("format", lambda ep, text: has_answer_format(text))
    return Gate(
        length_ok,
        Gate(correct, WeightedSum({"correct": (correct, 0.9), "format": (fmt, 0.1)}, success="correct")),
    )


def chat(system: str, user: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
