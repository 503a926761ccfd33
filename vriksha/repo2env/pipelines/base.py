"""What every pipeline produces: a `Candidate` (a broken tree and its fix), described for the agent."""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from vriksha.repo2env.baseline import Baseline
from vriksha.repo2env.layout import is_source_file
from vriksha.repo2env.source import Project, iter_files
from vriksha.repo2env.testrun import TestRun

__all__ = ["Candidate", "BuildContext", "Pipeline", "FunctionInfo", "project_functions"]


@dataclass(slots=True)
class BuildContext:
    project: Project
    python: Path
    baseline: Baseline
    seed: int = 0
    per_function: int = 1  # fix_bug mutations tried per function

    def rng(self, salt: str) -> random.Random:
        return random.Random(f"{self.seed}:{salt}")


@dataclass(slots=True)
class Candidate:
    pipeline: str
    target: str  # "relpath::qualname" or a commit id
    broken: dict[str, str | None]  # relpath -> text of the broken tree (None: the file is absent)
    solution: dict[str, str | None]  # relpath -> text of the fixed tree (None: absent)
    covering: set[str] = field(default_factory=set)  # stable tests expected to notice the change
    covering_any: set[str] = field(default_factory=set)  # every test reaching the target (flaky ones too)
    hidden_extra: set[str] = field(default_factory=set)  # test files to withhold besides the F2P files
    secrets: list[str] = field(default_factory=list)  # text that must not appear anywhere in the workspace
    info: dict = field(default_factory=dict)
    base: Path | None = None  # another base tree (commit pipeline); default: the project root
    baseline: Baseline | None = None  # the base tree's baseline when it differs from the project's

    @property
    def cid(self) -> str:
        import hashlib

        h = hashlib.sha256(self.pipeline.encode() + self.target.encode())
        for rel in sorted(self.broken):
            h.update(rel.encode() + (self.broken[rel] or "").encode())
        return h.hexdigest()[:12]


class Pipeline:
    name: ClassVar[str] = ""

    def candidates(self, ctx: BuildContext) -> Iterator[Candidate]:
        raise NotImplementedError

    def instruction(self, cand: Candidate, broken_run: TestRun, fail_to_pass: list[str]) -> str:
        raise NotImplementedError


@dataclass(slots=True)
class FunctionInfo:
    rel: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    source: str  # the whole file

    @property
    def key(self) -> str:
        return f"{self.rel}::{self.qualname}"


def project_functions(root: Path) -> list[FunctionInfo]:
    """Top-level functions and methods of top-level classes in the library's source files."""
    out: list[FunctionInfo] = []
    for rel_path in iter_files(root):
        rel = rel_path.as_posix()
        if not is_source_file(rel):
            continue
        text = (root / rel_path).read_text(errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        seen: dict[str, int] = {}
        found: list[FunctionInfo] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(FunctionInfo(rel, node.name, node, text))
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.append(FunctionInfo(rel, f"{node.name}.{sub.name}", sub, text))
        for f in found:
            seen[f.qualname] = seen.get(f.qualname, 0) + 1
        out += [
            f for f in found if seen[f.qualname] == 1
        ]  # redefinitions (overloads, properties) are ambiguous
    return out


def line_offsets(text: str) -> list[int]:
    offs, pos = [0], 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        offs.append(pos)
    return offs


def span(text: str, node: ast.AST) -> tuple[int, int]:
    """Character offsets of an AST node (lineno/col are 1-based lines, utf-8 byte columns)."""
    lines = text.splitlines(keepends=True)
    offs = line_offsets(text)

    def at(lineno: int, col: int) -> int:
        line = lines[lineno - 1]
        return offs[lineno - 1] + len(line.encode()[:col].decode(errors="replace"))

    return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


def docstring_node(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Expr | None:
    first = fn.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first
    return None
