"""Tiny projects the repo2env tests write themselves."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

MATHX = '''\
"""Small math helpers."""


def clamp(x, lo, hi):
    """Return x limited to the closed range [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(xs):
    """Sum the numbers in xs."""
    s = 0
    for x in xs:
        s = s + x
    return s


def describe(x):
    """Format x for a log line; nobody checks the result."""
    message = "value=%r" % (x,)
    return message


def never_called(a, b):
    """No test reaches this."""
    result = a * b + 1
    return result
'''

STRINGS = '''\
def shout(s):
    """Upper-case s and add an exclamation mark."""
    text = s.upper()
    return text + "!"
'''

FLAKY = '''\
def coin(state):
    """True on every other call across processes (the state lives in a file)."""
    flipped = not state
    return flipped
'''

TEST_MATHX = """\
from tinyproj.mathx import clamp, total


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_total():
    assert total([1, 2, 3]) == 6
    assert total([]) == 0
"""

TEST_DESCRIBE = """\
from tinyproj.mathx import describe


def test_describe_does_not_crash_the_caller():
    try:
        describe(3)
    except Exception:
        pass
"""

TEST_STRINGS = """\
from tinyproj.strings import shout


def test_shout():
    assert shout("hi") == "HI!"


def test_plain_arithmetic():
    assert 2 + 2 == 4
"""

TEST_FLAKY = """\
import os

from tinyproj.flaky import coin


def test_coin_alternates():
    # its outcome differs between runs: the first baseline run is traced, the later ones are not
    # (nothing written in one sandboxed run survives into the next)
    assert coin("VRIKSHA_R2E_TRACE" in os.environ)
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text) if not text.startswith(('"""', "def", "from", "import")) else text)
    return root


def tiny_project(root: Path) -> Path:
    return write(
        root,
        {
            "pyproject.toml": '[project]\nname = "tinyproj"\nversion = "0.1"\ndependencies = []\n',
            "tinyproj/__init__.py": "",
            "tinyproj/mathx.py": MATHX,
            "tinyproj/strings.py": STRINGS,
            "tinyproj/flaky.py": FLAKY,
            "tests/test_mathx.py": TEST_MATHX,
            "tests/test_describe.py": TEST_DESCRIBE,
            "tests/test_strings.py": TEST_STRINGS,
            "tests/test_flaky.py": TEST_FLAKY,
        },
    )


def single_test_project(root: Path) -> Path:
    return write(
        root,
        {
            "pyproject.toml": '[project]\nname = "oneproj"\nversion = "0.1"\n',
            "oneproj.py": 'def double(x):\n    """Twice x."""\n    y = x * 2\n    return y\n',
            "test_oneproj.py": "from oneproj import double\n\n\ndef test_double():\n    assert double(4) == 8\n",
        },
    )


def git(root: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "PATH": "/usr/bin:/bin",
        "HOME": str(root),
    }
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


def git_project(root: Path) -> Path:
    """Two commits: the second fixes `is_even` and adds the test that shows it."""
    write(
        root,
        {
            "pyproject.toml": '[project]\nname = "gitproj"\nversion = "0.1"\n',
            "gitproj/__init__.py": "",
            "gitproj/numbers.py": "def is_even(n):\n    return n % 2 == 1\n\n\ndef inc(n):\n    return n + 1\n",
            "tests/test_inc.py": "from gitproj.numbers import inc\n\n\ndef test_inc():\n    assert inc(1) == 2\n",
        },
    )
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "Start the numbers module")
    write(
        root,
        {
            "gitproj/numbers.py": "def is_even(n):\n    return n % 2 == 0\n\n\ndef inc(n):\n    return n + 1\n",
            "tests/test_even.py": "from gitproj.numbers import is_even\n\n\ndef test_is_even():\n"
            "    assert is_even(4)\n    assert not is_even(3)\n",
        },
    )
    git(root, "add", "-A")
    git(
        root,
        "commit",
        "-q",
        "-m",
        "Fix is_even returning the wrong parity\n\n`is_even(4)` was False; see #12.",
    )
    return root
