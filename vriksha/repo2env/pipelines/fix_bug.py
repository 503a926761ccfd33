"""fix_bug: a small semantic mutation in a function that tests exercise; the agent sees only the failures."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from vriksha.repo2env.pipelines.base import BuildContext, Candidate, Pipeline, project_functions
from vriksha.repo2env.pipelines.mutations import mutations_in
from vriksha.repo2env.testrun import TestRun

__all__ = ["FixBugPipeline"]

MAX_SHOWN_TESTS = 3
MAX_OUTPUT_CHARS = 1500


class FixBugPipeline(Pipeline):
    name = "fix_bug"

    def candidates(self, ctx: BuildContext) -> Iterator[Candidate]:
        for fn in project_functions(ctx.project.root):
            reaching = ctx.baseline.tests_reaching(fn.key)
            sites = list(mutations_in(fn.source, fn.node))
            if not sites:
                continue
            rng = ctx.rng(fn.key)
            rng.shuffle(sites)
            made = 0
            for mut in sites:
                if made >= ctx.per_function:
                    break
                new_text = mut.apply(fn.source)
                if new_text == fn.source:
                    continue
                try:
                    ast.parse(new_text)
                except SyntaxError:
                    continue
                made += 1
                yield Candidate(
                    pipeline=self.name,
                    target=f"{fn.key}@{mut.line}:{mut.kind}",
                    broken={fn.rel: new_text},
                    solution={fn.rel: fn.source},
                    covering=reaching & ctx.baseline.stable_pass,
                    covering_any=reaching,
                    info={"file": fn.rel, "qualname": fn.qualname, "kind": mut.kind, "line": mut.line},
                )

    def instruction(self, cand: Candidate, broken_run: TestRun, fail_to_pass: list[str]) -> str:
        parts = [
            "A bug has been introduced in this project's library code (not in its tests). "
            f"These {len(fail_to_pass)} test(s) fail because of it:",
            "",
            *(f"- {nid}" for nid in fail_to_pass[:20]),
        ]
        if len(fail_to_pass) > 20:
            parts.append(f"- ... and {len(fail_to_pass) - 20} more")
        shown = [nid for nid in fail_to_pass if nid in broken_run.results][:MAX_SHOWN_TESTS]
        for nid in shown:
            msg = broken_run.results[nid].message.strip()
            if msg:
                parts += ["", f"Output of {nid}:", "```", msg[-MAX_OUTPUT_CHARS:], "```"]
        parts += [
            "",
            "Find and fix the bug in the library code. The failing tests are hidden and run when you "
            "submit; the visible tests can be run with the run_tests tool.",
        ]
        return "\n".join(parts) + "\n"
