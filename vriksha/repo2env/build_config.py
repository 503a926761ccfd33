"""What a dataset build does: `vriksha repo2env`'s options, declared once with their flags (`vriksha.options`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from vriksha.options import Options, option

DEFAULT_PIPELINES = ("implement_function", "fix_bug", "commit")


@dataclass(slots=True)
class BuildConfig(Options):
    options_label: ClassVar[str] = "build"
    flag_dest_prefix: ClassVar[str] = "build_"

    pipelines: tuple[str, ...] = DEFAULT_PIPELINES  # `--pipelines NAME...`
    max_tasks: int = option(20, "stop after keeping this many tasks")
    max_candidates: int | None = option(
        None, "stop after trying this many candidates (default: until --max-tasks)"
    )
    workers: int = option(1, "candidates validated in parallel")
    seed: int = option(0, "seed for candidate order and mutation choice")
    baseline_runs: int = option(2, "baseline runs to tell flaky tests (>= 2)")
    per_function: int = option(1, "fix_bug mutations tried per function", flag="mutations-per-function")
    progress: bool = True  # `--no-progress`
    timeout_s: float = option(900.0, "seconds the whole baseline suite may take", flag="timeout")
    keep: dict = field(default_factory=dict)
    max_unpacked_mb: float = option(
        1024.0, "an sdist SOURCE that unpacks to more than this many MiB is refused"
    )
    max_unpacked_files: int = option(100_000, "an sdist SOURCE holding more entries than this is refused")

    @classmethod
    def flag_names(cls) -> list[str]:
        """The options that are flags of their own (the rest take another form or are set by code)."""
        return [f.name for _, f in cls.option_fields() if "help" in f.metadata]
