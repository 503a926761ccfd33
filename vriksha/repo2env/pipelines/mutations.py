"""Small semantic AST mutations for fix_bug: each names its kind and rewrites one node's source text."""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import dataclass

from vriksha.repo2env.pipelines.base import span

__all__ = ["Mutation", "mutations_in", "KINDS"]

KINDS = (
    "comparison_flip",
    "off_by_one",
    "swapped_operands",
    "dropped_branch",
    "wrong_return",
    "boolean_flip",
)

_FLIP = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)


@dataclass(slots=True)
class Mutation:
    kind: str
    start: int  # character offsets in the file text
    end: int
    replacement: str
    line: int

    def apply(self, text: str) -> str:
        return text[: self.start] + self.replacement + text[self.end :]


def _indent_of(text: str, start: int) -> str:
    line_start = text.rfind("\n", 0, start) + 1
    prefix = text[line_start:start]
    return prefix if not prefix.strip() else ""


def mutations_in(text: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[Mutation]:
    """Every mutation site inside `fn` (nested functions included), in source order."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            new = copy.deepcopy(node)
            new.ops = [_FLIP[type(node.ops[0])]()]
            yield _replace(text, node, "comparison_flip", ast.unparse(new))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.Add, ast.Sub))
            and isinstance(node.right, ast.Constant)
            and type(node.right.value) is int
        ):
            new = copy.deepcopy(node)
            new.right = ast.Constant(node.right.value + 1)
            yield _replace(text, node, "off_by_one", ast.unparse(new))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, _NON_COMMUTATIVE):
            if ast.unparse(node.left) != ast.unparse(node.right):
                new = copy.deepcopy(node)
                new.left, new.right = node.right, node.left
                yield _replace(text, node, "swapped_operands", ast.unparse(new))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            for part in ("lower", "upper"):
                bound = getattr(node.slice, part)
                if isinstance(bound, ast.Constant) and type(bound.value) is int:
                    yield _replace(text, bound, "off_by_one", repr(bound.value + 1))
        elif isinstance(node, ast.BoolOp):
            new = copy.deepcopy(node)
            new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            yield _replace(text, node, "boolean_flip", f"({ast.unparse(new)})")
        elif isinstance(node, ast.Return) and node.value is not None:
            v = node.value
            if isinstance(v, ast.Constant) and isinstance(v.value, bool):
                yield _replace(text, v, "wrong_return", repr(not v.value))
            elif not (isinstance(v, ast.Constant) and v.value is None):
                yield _replace(text, node, "wrong_return", "return None")
        if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.For, ast.While, ast.If, ast.With, ast.Try)
        ):
            body = getattr(node, "body", [])
            for stmt in body:
                if isinstance(stmt, ast.If) and not stmt.orelse and len(body) > 1:
                    start, end = span(text, stmt)
                    yield Mutation("dropped_branch", start, end, "pass", stmt.lineno)
            if (
                isinstance(node, ast.If)
                and node.orelse
                and not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If))
            ):
                start, _ = span(text, node.orelse[0])
                _, end = span(text, node.orelse[-1])
                yield Mutation("dropped_branch", start, end, "pass", node.orelse[0].lineno)


def _replace(text: str, node: ast.AST, kind: str, replacement: str) -> Mutation:
    start, end = span(text, node)
    original = text[start:end]
    if "\n" in original and not (original.startswith("(") and original.endswith(")")):
        replacement = f"({replacement})"  # a multi-line expression may rely on brackets elsewhere
    return Mutation(kind, start, end, replacement, node.lineno)
