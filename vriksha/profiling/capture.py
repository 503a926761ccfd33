"""Step-scheduled trace capture: `--profile` flags, `ProfileConfig`, and `StepProfiler`."""

from __future__ import annotations

import argparse
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from vriksha.errors import ConfigError
from vriksha.options import Options, option

logger = logging.getLogger(__name__)

TRACE_SUFFIX = ".pt.trace.json.gz"

# Each scheduled cycle is exported on its own, so events being cleared between cycles is what we want.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")


@dataclass(slots=True)
class ProfileConfig(Options):
    """What to record and when; steps are engine or trainer steps (one `StepProfiler.step()` each)."""

    options_label: ClassVar[str] = "profiling"
    flag_dest_prefix: ClassVar[str] = "profile_"

    enabled: bool = option(False, "record gzip'd Chrome/Perfetto traces of a few steps", flag="profile")
    dir: Path = option(Path("profiles"), "directory for trace files", flag="profile-dir")
    skip: int = option(0, "steps ignored once at the start", flag="profile-skip")
    wait: int = option(1, "idle steps at the start of each cycle", flag="profile-wait")
    warmup: int = option(1, "traced-but-discarded steps per cycle", flag="profile-warmup")
    active: int = option(3, "recorded steps per cycle", flag="profile-active")
    repeat: int = option(1, "number of cycles, 0 = until stopped", flag="profile-repeat")
    memory: bool = option(False, "also record tensor allocations (memory timeline)", flag="profile-memory")
    shapes: bool = option(False, "also record operator input shapes", flag="profile-shapes")

    def __post_init__(self) -> None:
        self.dir = Path(self.dir)
        for name in ("skip", "wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--profile-{name} must be >= 0, got {getattr(self, name)}; pass 0 or more")
        if self.active < 1:
            raise ConfigError(f"--profile-active must be >= 1, got {self.active}; record at least one step")

    @property
    def steps_needed(self) -> int:
        """Steps after which every scheduled cycle has been recorded (0 when repeat is 0: forever)."""
        return self.skip + self.repeat * (self.wait + self.warmup + self.active)


def add_profile_args(parser: argparse.ArgumentParser) -> None:
    """Add --profile and its schedule/options to a subcommand's parser."""
    ProfileConfig.add_arguments(
        parser, title="profiling: record torch.profiler traces; read them with `vriksha profile report`"
    )


def all_threads_config() -> object | None:
    """Record every thread (the engine may step in its own thread), where this torch supports it."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):
        return None


def trace_path(directory: Path, name: str, rank: int, step: int) -> Path:
    return Path(directory) / f"{name}_rank{rank}_step{step}{TRACE_SUFFIX}"


class StepProfiler:
    """Wraps `torch.profiler.profile` with the config's schedule; a no-op when `cfg.enabled` is False.

    `start()`, then `step()` once per engine/trainer step, then `stop()`, which returns the trace files
    written: `<dir>/<name>_rank<rank>_step<N>.pt.trace.json.gz`, N being the
    number of steps done when the window closed.
    With `use_schedule=False` (the server's /start_profile../stop_profile) everything between start and
    stop is recorded and written at stop. Step numbers keep counting across start/stop pairs, so a later
    capture never overwrites an earlier one. Also usable as a context manager.
    """

    def __init__(
        self, cfg: ProfileConfig, rank: int = 0, name: str = "vriksha", *, use_schedule: bool = True
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.name = name
        self.use_schedule = use_schedule
        self.traces: list[Path] = []
        self._prof: profile | None = None
        self._base = 0
        self._session: list[Path] = []

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    @property
    def running(self) -> bool:
        return self._prof is not None

    def _activities(self) -> list[ProfilerActivity]:
        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        return acts

    def _on_trace_ready(self, prof: profile) -> None:
        path = trace_path(self.cfg.dir, self.name, self.rank, self._base + prof.step_num)
        prof.export_chrome_trace(str(path))
        self._session.append(path)
        self.traces.append(path)
        logger.info("wrote profiler trace %s", path)

    def start(self) -> None:
        if not self.cfg.enabled or self._prof is not None:
            return
        c = self.cfg
        try:
            c.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"--profile-dir {c.dir} cannot be created ({exc.strerror}); pass a writable directory"
            ) from exc
        sched = (
            schedule(skip_first=c.skip, wait=c.wait, warmup=c.warmup, active=c.active, repeat=c.repeat)
            if self.use_schedule
            else None
        )
        self._session = []
        extra = {}
        all_threads = all_threads_config()
        if all_threads is not None:
            extra["experimental_config"] = all_threads
        self._prof = profile(
            activities=self._activities(),
            schedule=sched,
            on_trace_ready=self._on_trace_ready if self.use_schedule else None,
            record_shapes=c.shapes,
            profile_memory=c.memory,
            **extra,
        )
        self._prof.start()
        logger.info(
            "profiler started for %s rank %d (%s)",
            self.name,
            self.rank,
            "scheduled" if self.use_schedule else "unscheduled",
        )

    def step(self) -> None:
        prof = self._prof
        if prof is not None:
            prof.step()

    def stop(self) -> list[Path]:
        """Stop recording, flush a partly recorded window, and return the files written since `start()`."""
        prof = self._prof
        if prof is None:
            return []
        self._prof = None
        prof.stop()
        if not self.use_schedule:
            self._on_trace_ready(prof)
        self._base += prof.step_num
        return list(self._session)

    def __enter__(self) -> StepProfiler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
