"""The engine's measured choices (the dtype, the linear paths, the packed kernels, native decode) are timed once
per machine and kept in the cache dir; a timing is only as good as the quiet it was taken in.

Each record is kept with when it was measured and the machine's load meanwhile (`MachineLoad`): the share of
the CPUs this process may run on that other processes used while it timed (from /proc/stat, less this
process's own CPU time; elsewhere the 1-minute load average less this process, over the CPU count), the load
average and the CPU count. A record timed while other work used more than `$VRIKSHA_TIMING_MAX_LOAD` of the
CPUs (default 0.25; 1 accepts any load) serves the run that took it, with a warning, and is timed again on the
next load; so is one kept before loads were recorded. `vriksha tune` times every choice again on demand
(`remeasuring()`), and `vriksha generate --verbose` lists when each record in use was measured and under what
load (`report()`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)

ENV_MAX_LOAD = "VRIKSHA_TIMING_MAX_LOAD"
DEFAULT_MAX_LOAD = 0.25
MIN_WINDOW_S = 0.5  # a shorter timing is judged by the load average: /proc/stat counts in 10 ms ticks


def max_load() -> float:
    """The share of the CPUs other work may use while the engine times its choices (`$VRIKSHA_TIMING_MAX_LOAD`)."""
    raw = os.environ.get(ENV_MAX_LOAD, "").strip()
    if not raw:
        return DEFAULT_MAX_LOAD
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise ConfigError(
            f"{ENV_MAX_LOAD}={raw!r}: set it to the share of the CPUs other work may use while the engine times "
            "its choices, in (0, 1] (1 accepts any load), or unset it for 0.25"
        )
    return value


@dataclass(frozen=True, slots=True)
class MachineLoad:
    """The machine's load while a timing ran."""

    others: float | None  # share of this process's CPUs' time other processes used (None: not measured)
    loadavg_1m: float | None
    cpus: int

    def share(self) -> float:
        """The share of the CPUs other work used: measured, else the load average less this process."""
        if self.others is not None:
            return self.others
        if self.loadavg_1m is None:
            return 0.0
        return min(max(self.loadavg_1m - 1.0, 0.0) / max(self.cpus, 1), 1.0)

    def busy(self) -> bool:
        return self.share() > max_load()

    def describe(self) -> str:
        measured = "measured" if self.others is not None else "from the load average"
        avg = f", 1-min load average {self.loadavg_1m:.2f}" if self.loadavg_1m is not None else ""
        return f"other work used {self.share():.0%} of {self.cpus} CPUs ({measured}{avg})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> MachineLoad | None:
        if not isinstance(raw, dict) or not isinstance(raw.get("cpus"), int):
            return None
        others, avg = raw.get("others"), raw.get("loadavg_1m")
        if not all(v is None or isinstance(v, int | float) for v in (others, avg)):
            return None
        return cls(others, avg, raw["cpus"])


def _allowed_cpus() -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _cpu_seconds(cpus: list[int]) -> tuple[float, float] | None:
    """(busy, total) seconds of `cpus` since boot, from /proc/stat; None where it cannot be read."""
    wanted = {f"cpu{i}" for i in cpus}
    busy = total = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name not in wanted:
                    continue
                user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
                work = user + nice + system + irq + softirq + steal  # guest time is inside user
                busy += work
                total += work + idle + iowait
    except (OSError, ValueError):
        return None
    if total == 0:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, total / tick


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class LoadWatch:
    """Started as a timing starts; `load()` after it: the machine's load meanwhile."""

    def __init__(self) -> None:
        self.cpus = _allowed_cpus()
        self.started = time.monotonic()
        self.own = _own_seconds()
        self.stat = _cpu_seconds(self.cpus) if self.cpus else None

    def load(self) -> MachineLoad:
        count = len(self.cpus) if self.cpus else (os.cpu_count() or 1)
        try:
            avg: float | None = os.getloadavg()[0]
        except (AttributeError, OSError):
            avg = None
        others = None
        now = _cpu_seconds(self.cpus) if self.cpus else None
        if self.stat is not None and now is not None and time.monotonic() - self.started >= MIN_WINDOW_S:
            busy, total = now[0] - self.stat[0], now[1] - self.stat[1]
            if total > 0:
                others = min(max((busy - (_own_seconds() - self.own)) / total, 0.0), 1.0)
        return MachineLoad(others, avg, count)


# what this process used or measured, for `report()`: (what) -> {key: record}
_used: dict[str, dict[str, dict[str, Any]]] = {}
_fresh: set[tuple[str, str]] = set()  # (what, key) measured in this process
_warned: set[tuple[str, str]] = set()
_remeasure = False


@contextlib.contextmanager
def remeasuring() -> Iterator[None]:
    """Inside this block every cached timing is measured again (once per process), as `vriksha tune` asks."""
    global _remeasure
    previous, _remeasure = _remeasure, True
    try:
        yield
    finally:
        _remeasure = previous


def _warn_once(what: str, reason: str, message: str, *args: Any) -> None:
    if (what, reason) not in _warned:
        _warned.add((what, reason))
        logger.warning(message, *args)


def usable(what: str, key: str, record: Any) -> bool:
    """Whether a kept record of `what` may serve this process: not when `vriksha tune` times again, not when it
    was timed under load or before loads were recorded (both with a warning, once per `what`)."""
    if record is None or (_remeasure and (what, key) not in _fresh):
        return False
    load = MachineLoad.from_dict(record.get("load")) if isinstance(record, dict) else None
    if load is None:
        _warn_once(
            what,
            "unrecorded",
            "the cached %s timings carry no machine load (kept before it was recorded): timing them again",
            what,
        )
        return False
    if load.busy() and (what, key) not in _fresh:
        _warn_once(
            what,
            "busy",
            "the cached %s timings were taken while %s (limit %.0f%%, $%s): timing them again",
            what,
            load.describe(),
            max_load() * 100,
            ENV_MAX_LOAD,
        )
        return False
    if (what, key) not in _fresh:  # a record measured in this process stays listed as measured
        _used.setdefault(what, {})[key] = {**record, "how": "cached"}
    return True


def stamped(what: str, key: str, record: dict[str, Any], watch: LoadWatch) -> dict[str, Any]:
    """`record` as kept: with when it was measured and the load meanwhile; warns when that load was too high."""
    load = watch.load()
    out = {**record, "measured_at": time.time(), "load": load.to_dict()}
    _fresh.add((what, key))
    _used.setdefault(what, {})[key] = {**out, "how": "measured"}
    if load.busy():
        _warn_once(
            what,
            "measured busy",
            "timed the %s while %s (limit %.0f%%, $%s): the timings serve this run and are taken again on "
            "the next load; run `vriksha tune` on a quiet machine to keep good ones",
            what,
            load.describe(),
            max_load() * 100,
            ENV_MAX_LOAD,
        )
    return out


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def report() -> list[str]:
    """One line per kind of timing this process used: how many records, when measured, under what load."""
    lines = []
    for what, records in sorted(_used.items()):
        times = sorted(
            r["measured_at"] for r in records.values() if isinstance(r.get("measured_at"), int | float)
        )
        loads = [load for r in records.values() if (load := MachineLoad.from_dict(r.get("load"))) is not None]
        measured = sum(r["how"] == "measured" for r in records.values())
        how = "cached" if not measured else "measured in this run"
        if 0 < measured < len(records):
            how = f"{measured} measured in this run, {len(records) - measured} cached"
        when = (
            ""
            if not times
            else f", measured {_when(times[0])}"
            + (f" to {_when(times[-1])}" if _when(times[-1]) != _when(times[0]) else "")
        )
        worst = max(loads, key=MachineLoad.share).describe() if loads else "load not recorded"
        if len(loads) > 1:
            worst = "at most: " + worst
        lines.append(f"{what}: {len(records)} record(s) ({how}){when}; {worst}")
    return lines


def busy_records() -> list[str]:
    """The kinds of timing this process measured under load (for `vriksha tune`)."""
    out = []
    for what, records in sorted(_used.items()):
        if any(
            r["how"] == "measured"
            and (load := MachineLoad.from_dict(r.get("load"))) is not None
            and load.busy()
            for r in records.values()
        ):
            out.append(what)
    return out
