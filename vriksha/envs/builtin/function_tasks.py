"""Task families for `python_functions`: a description, a reference solution and an input generator.

Each family is parameterised (a divisor, a shift, a base...), so a seed draws one of many distinct
tasks; the hidden tests are the reference applied to seeded inputs. References run only in the
trusted parent process; the sandbox never sees them or their outputs.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class FunctionTask:
    family: str
    name: str
    signature: str
    description: str
    reference: Callable[..., Any]
    inputs: Callable[[random.Random], tuple]

    @property
    def key(self) -> str:
        return f"{self.family}|{self.description}"


def _ints(rng: random.Random, lo=-50, hi=50, n=(0, 12)) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


def _word(rng: random.Random, n=(1, 8)) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(*n)))


def _sentence(rng: random.Random) -> str:
    return " ".join(_word(rng) for _ in range(rng.randint(0, 6)))


def _sum_divisible(rng):
    k = rng.randint(2, 9)
    return FunctionTask(
        "sum_divisible",
        "sum_divisible",
        "def sum_divisible(xs: list[int]) -> int",
        f"Return the sum of the elements of xs that are divisible by {k} (0 for none).",
        lambda xs: sum(x for x in xs if x % k == 0),
        lambda r: (_ints(r),),
    )


def _count_above(rng):
    t = rng.randint(-20, 20)
    return FunctionTask(
        "count_above",
        "count_above",
        "def count_above(xs: list[int]) -> int",
        f"Return how many elements of xs are strictly greater than {t}.",
        lambda xs: sum(1 for x in xs if x > t),
        lambda r: (_ints(r),),
    )


def _rotate(rng):
    k = rng.randint(1, 5)
    direction = rng.choice(["left", "right"])

    def ref(xs):
        if not xs:
            return []
        s = (k if direction == "left" else -k) % len(xs)
        return xs[s:] + xs[:s]

    return FunctionTask(
        "rotate",
        "rotate",
        "def rotate(xs: list[int]) -> list[int]",
        f"Return a new list: xs rotated {direction} by {k} positions (an empty list stays empty).",
        ref,
        lambda r: (_ints(r),),
    )


def _caesar(rng):
    k = rng.randint(1, 25)

    def ref(s):
        return "".join(chr((ord(c) - 97 + k) % 26 + 97) if "a" <= c <= "z" else c for c in s)

    return FunctionTask(
        "caesar",
        "shift_letters",
        "def shift_letters(s: str) -> str",
        f"Shift every lowercase letter a-z in s forward by {k} places in the alphabet, wrapping "
        "around from z to a; leave every other character unchanged.",
        ref,
        lambda r: (_sentence(r),),
    )


def _digit_sum(rng):
    b = rng.choice([2, 3, 5, 7, 8, 10, 16])

    def ref(n):
        s = 0
        while n:
            s, n = s + n % b, n // b
        return s

    return FunctionTask(
        "digit_sum",
        "digit_sum",
        "def digit_sum(n: int) -> int",
        f"Return the sum of the digits of the non-negative integer n written in base {b}.",
        ref,
        lambda r: (r.randint(0, 10**6),),
    )


def _fib_mod(rng):
    m = rng.randint(5, 1000)

    def ref(n):
        a, b = 0, 1
        for _ in range(n):
            a, b = b, (a + b) % m
        return a % m

    return FunctionTask(
        "fib_mod",
        "fib_mod",
        "def fib_mod(n: int) -> int",
        f"Return F(n) modulo {m}, where F(0)=0, F(1)=1 and F(n)=F(n-1)+F(n-2).",
        ref,
        lambda r: (r.randint(0, 300),),
    )


def _vowels(rng):
    extra = rng.choice(["", "y"])
    vowels = "aeiou" + extra
    desc = "a, e, i, o, u" + (" and y" if extra else "")
    return FunctionTask(
        "count_vowels",
        "count_vowels",
        "def count_vowels(s: str) -> int",
        f"Return how many characters of s are vowels ({desc}), ignoring case.",
        lambda s: sum(1 for c in s.lower() if c in vowels),
        lambda r: (_sentence(r).upper() if r.random() < 0.3 else _sentence(r),),
    )


def _dedupe(rng):
    keep = rng.choice(["first", "last"])

    def ref(xs):
        ordered = xs if keep == "first" else list(reversed(xs))
        kept = list(dict.fromkeys(ordered))
        return kept if keep == "first" else list(reversed(kept))

    return FunctionTask(
        "dedupe",
        "dedupe",
        "def dedupe(xs: list[int]) -> list[int]",
        f"Remove duplicates from xs keeping the {keep} occurrence of each value, preserving the "
        "order of the kept elements.",
        ref,
        lambda r: (_ints(r, 0, 6),),
    )


def _running(rng):
    op = rng.choice(["max", "min", "sum"])
    fn = {"max": max, "min": min, "sum": lambda a, b: a + b}[op]

    def ref(xs):
        out = []
        for x in xs:
            out.append(x if not out else fn(out[-1], x))
        return out

    return FunctionTask(
        "running",
        f"running_{op}",
        f"def running_{op}(xs: list[int]) -> list[int]",
        f"Return the list whose i-th element is the {op} of xs[0..i] (inclusive).",
        ref,
        lambda r: (_ints(r),),
    )


def _rle(rng):
    sep = rng.choice(["", ":"])

    def ref(s):
        out, i = [], 0
        while i < len(s):
            j = i
            while j < len(s) and s[j] == s[i]:
                j += 1
            out.append(f"{s[i]}{sep}{j - i}")
            i = j
        return "".join(out)

    return FunctionTask(
        "rle",
        "run_length",
        "def run_length(s: str) -> str",
        f"Run-length encode s: each maximal run of one character c of length n becomes "
        f"'c{sep}n' (e.g. 'aab' -> 'a{sep}2b{sep}1'); the empty string stays empty.",
        ref,
        lambda r: ("".join(r.choice("abc") * r.randint(1, 4) for _ in range(r.randint(0, 5))),),
    )


def _second_largest(rng):
    default = rng.choice([-1, 0, None])

    def ref(xs):
        d = sorted(set(xs), reverse=True)
        return d[1] if len(d) >= 2 else default

    return FunctionTask(
        "second_largest",
        "second_largest",
        "def second_largest(xs: list[int]) -> int | None",
        f"Return the second largest distinct value in xs, or {default!r} if there are fewer "
        "than two distinct values.",
        ref,
        lambda r: (_ints(r, -9, 9),),
    )


def _poly(rng):
    coeffs = [rng.randint(-5, 5) for _ in range(rng.randint(2, 4))]
    terms = " + ".join(f"({c})*x**{i}" for i, c in enumerate(coeffs))
    return FunctionTask(
        "poly",
        "poly",
        "def poly(x: int) -> int",
        f"Return the value of {terms}.",
        lambda x: sum(c * x**i for i, c in enumerate(coeffs)),
        lambda r: (r.randint(-20, 20),),
    )


def _word_lengths(rng):
    order = rng.choice(["ascending", "descending"])

    def ref(s):
        words = s.split()
        return sorted(words, key=len, reverse=order == "descending")

    return FunctionTask(
        "sort_words",
        "sort_words",
        "def sort_words(s: str) -> list[str]",
        f"Split s on whitespace and return the words sorted by length in {order} order; words "
        "of equal length keep their original order.",
        ref,
        lambda r: (_sentence(r),),
    )


def _clamp_sum(rng):
    lo, hi = sorted(rng.sample(range(-30, 30), 2))
    return FunctionTask(
        "clamp_sum",
        "clamp_sum",
        "def clamp_sum(xs: list[int]) -> int",
        f"Clamp each element of xs into the range [{lo}, {hi}] and return the sum of the results.",
        lambda xs: sum(min(max(x, lo), hi) for x in xs),
        lambda r: (_ints(r),),
    )


def _palindrome(rng):
    case = rng.choice([True, False])

    def ref(s):
        t = [c.lower() if case else c for c in s if c.isalnum()]
        return t == t[::-1]

    def inputs(r):
        w = _word(r, (0, 5))
        s = w + r.choice(["", "x", "A"]) + w[::-1]
        return (s.upper() if r.random() < 0.3 else s if r.random() < 0.6 else _sentence(r),)

    return FunctionTask(
        "palindrome",
        "is_palindrome",
        "def is_palindrome(s: str) -> bool",
        "Return True if s reads the same forwards and backwards when only its letters and digits "
        f"are kept{', ignoring case' if case else ' (case matters)'}, else False.",
        ref,
        inputs,
    )


def _gcd_list(rng):
    scale = rng.randint(1, 12)

    def ref(xs):
        import math

        g = 0
        for x in xs:
            g = math.gcd(g, x)
        return g

    return FunctionTask(
        "gcd_list",
        "gcd_all",
        "def gcd_all(xs: list[int]) -> int",
        "Return the greatest common divisor of all elements of xs (non-negative integers); "
        "return 0 for an empty list.",
        ref,
        lambda r: ([scale * r.randint(0, 30) for _ in range(r.randint(0, 6))],),
    )


FAMILIES: tuple[Callable[[random.Random], FunctionTask], ...] = (
    _sum_divisible,
    _count_above,
    _rotate,
    _caesar,
    _digit_sum,
    _fib_mod,
    _vowels,
    _dedupe,
    _running,
    _rle,
    _second_largest,
    _poly,
    _word_lengths,
    _clamp_sum,
    _palindrome,
    _gcd_list,
)


def draw_task(rng: random.Random) -> FunctionTask:
    return rng.choice(FAMILIES)(rng)
