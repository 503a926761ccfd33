"""Task pipelines: each turns a bootstrapped project into candidate tasks (validated elsewhere)."""

from vriksha.repo2env.pipelines.base import BuildContext, Candidate, Pipeline
from vriksha.repo2env.pipelines.commit import CommitPipeline
from vriksha.repo2env.pipelines.fix_bug import FixBugPipeline
from vriksha.repo2env.pipelines.implement_function import ImplementFunctionPipeline

PIPELINES: dict[str, type[Pipeline]] = {
    "implement_function": ImplementFunctionPipeline,
    "fix_bug": FixBugPipeline,
    "commit": CommitPipeline,
}

__all__ = ["Candidate", "BuildContext", "Pipeline", "PIPELINES"]
