"""implement_function: remove the body of a function that tests exercise; keep signature and docstring."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from vriksha.repo2env.pipelines.base import (
    BuildContext,
    Candidate,
    FunctionInfo,
    Pipeline,
    docstring_node,
    project_functions,
    span,
)
from vriksha.repo2env.testrun import TestRun

__all__ = ["ImplementFunctionPipeline", "remove_body"]

STUB = 'raise NotImplementedError("implement this function")'
MIN_BODY_STATEMENTS = 1


def remove_body(fn: FunctionInfo) -> tuple[str, str] | None:
    """(new file text, removed body text) or None when there is nothing worth removing."""
    node, text = fn.node, fn.source
    doc = docstring_node(node)
    body = node.body[1:] if doc is not None else node.body
    if not body or (len(body) == 1 and isinstance(body[0], (ast.Pass, ast.Raise))):
        return None
    if len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return None  # `...`
    start, _ = span(text, body[0])
    _, end = span(text, body[-1])
    removed = text[start:end]
    if len(removed.strip()) < 8:
        return None
    return text[:start] + STUB + text[end:], removed


def signature_of(fn: FunctionInfo) -> str:
    node, text = fn.node, fn.source
    start, _ = span(text, node)
    body_start, _ = span(text, node.body[0])
    head = text[start:body_start].rstrip()
    return head


class ImplementFunctionPipeline(Pipeline):
    name = "implement_function"

    def candidates(self, ctx: BuildContext) -> Iterator[Candidate]:
        root = ctx.project.root
        test_texts: dict[str, str] = {}
        for fn in project_functions(root):
            if fn.node.name.startswith("__") and fn.node.name not in ("__init__", "__call__"):
                continue
            removed = remove_body(fn)
            if removed is None:
                continue
            new_text, body = removed
            reaching = ctx.baseline.tests_reaching(fn.key)
            covering = reaching & ctx.baseline.stable_pass
            # test files that name the function are withheld too: they may show its expected results
            hidden_extra = set()
            pattern = re.compile(rf"\b{re.escape(fn.node.name)}\b")
            for nid in ctx.baseline.durations:
                rel = nid.split("::", 1)[0]
                if rel not in test_texts and (root / rel).is_file():
                    test_texts[rel] = (root / rel).read_text(errors="replace")
                if rel in test_texts and pattern.search(test_texts[rel]) and rel.endswith(".py"):
                    hidden_extra.add(rel)
            yield Candidate(
                pipeline=self.name,
                target=fn.key,
                broken={fn.rel: new_text},
                solution={fn.rel: fn.source},
                covering=covering,
                covering_any=reaching,
                hidden_extra=hidden_extra,
                secrets=[body],
                info={
                    "file": fn.rel,
                    "qualname": fn.qualname,
                    "name": fn.node.name,
                    "signature": signature_of(fn),
                    "docstring": ast.get_docstring(fn.node) or "",
                },
            )

    def instruction(self, cand: Candidate, broken_run: TestRun, fail_to_pass: list[str]) -> str:
        i = cand.info
        parts = [
            f"Implement the function `{i['qualname']}` in `{i['file']}`. Its body has been replaced by "
            "`raise NotImplementedError`; write a body that makes it behave as the rest of the project expects.",
            "",
            "Signature:",
            "```python",
            i["signature"],
            "```",
        ]
        if i["docstring"]:
            parts += ["", "Docstring:", '"""', i["docstring"], '"""']
        usage = i.get("usage") or []
        if usage:
            parts += ["", "How it is used elsewhere in the project:", "```python", *usage, "```"]
        parts += [
            "",
            f"{len(fail_to_pass)} hidden test(s) check it when you submit; the visible tests can be run "
            "with the run_tests tool.",
        ]
        return "\n".join(parts) + "\n"
