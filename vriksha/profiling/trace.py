"""Reading Chrome/Perfetto trace files written by torch.profiler (ours or any other program's)."""

from __future__ import annotations

import gzip
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vriksha.errors import VrikshaError
from vriksha.profiling.operators import NATIVE_PREFIX

logger = logging.getLogger(__name__)

# Older Kineto versions used capitalised categories; map them onto today's names.
_CATEGORY_ALIASES = {
    "operator": "cpu_op",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
}
HOST_OP = "cpu_op"
USER_ANNOTATION = "user_annotation"
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "privateuse1_runtime", "xpu_runtime"})
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
STEP_PREFIX = "ProfilerStep#"
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


class TraceError(VrikshaError):
    """A trace file is missing, unreadable, or not a torch.profiler Chrome trace."""


@dataclass(slots=True)
class Event:
    """One complete ('X') event; times in microseconds as in the trace."""

    name: str
    cat: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def correlation(self) -> int | None:
        c = self.args.get("correlation")
        return c if isinstance(c, int) else None


@dataclass(slots=True)
class Trace:
    path: Path
    rank: int
    events: list[Event]

    @property
    def label(self) -> str:
        return f"rank {self.rank} ({self.path.name})"

    def of(self, *cats: str) -> list[Event]:
        return [e for e in self.events if e.cat in cats]

    @property
    def has_device(self) -> bool:
        return any(e.cat in DEVICE_CATEGORIES for e in self.events)


def _read_json(path: Path) -> Any:
    if not path.exists():
        raise TraceError(
            f"{path}: no such trace file; pass the path of a .json or .json.gz torch.profiler trace"
        )
    if path.is_dir():
        raise TraceError(f"{path}: is a directory; pass the trace files inside it (e.g. {path}/*.json.gz)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(
            f"{path}: cannot be read ({exc.strerror}); check the path and its permissions"
        ) from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceError(
                f"{path}: is gzip'd but does not decompress ({exc}); the file is truncated or corrupt"
            ) from exc
    try:
        return json.loads(raw)
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{path}: is not text JSON ({exc.reason}); expected a Chrome trace (.json or .json.gz)"
        ) from exc
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path}: is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "expected a Chrome trace written by torch.profiler (export_chrome_trace or tensorboard_trace_handler)"
        ) from exc


def _rank_of(path: Path, doc: dict[str, Any], fallback: int) -> int:
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else fallback


def _event(raw: Any) -> Event | None:
    if not isinstance(raw, dict) or raw.get("ph") != "X":
        return None
    ts, dur = raw.get("ts"), raw.get("dur", 0)
    if not isinstance(ts, int | float) or not isinstance(dur, int | float):
        return None
    cat = str(raw.get("cat", "")).lower()
    cat = _CATEGORY_ALIASES.get(cat, cat)
    name = str(raw.get("name", ""))
    if cat == USER_ANNOTATION and name.startswith(NATIVE_PREFIX):
        cat = HOST_OP  # a native kernel's call (`annotate.native_call`): an operator, not a phase
    args = raw.get("args")
    return Event(
        name=name,
        cat=cat,
        ts=float(ts),
        dur=max(float(dur), 0.0),
        pid=raw.get("pid"),
        tid=raw.get("tid"),
        args=args if isinstance(args, dict) else {},
    )


def load_trace(path: str | Path, fallback_rank: int = 0) -> Trace:
    """Load one trace; the rank comes from `distributedInfo`, else `rankN` in the file name, else `fallback_rank`."""
    path = Path(path)
    doc = _read_json(path)
    if isinstance(doc, list):  # the JSON Array Format of the Chrome trace spec
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(
            f"{path}: is JSON but not a Chrome trace (no 'traceEvents' list); "
            "pass a file written by torch.profiler's export_chrome_trace"
        )
    events = [e for e in map(_event, doc["traceEvents"]) if e is not None]
    if not any(e.cat in (HOST_OP, USER_ANNOTATION) or e.cat in DEVICE_CATEGORIES for e in events):
        raise TraceError(
            f"{path}: is a Chrome trace but holds no torch.profiler operator, annotation or kernel events; "
            "was the profiler stopped before any step ran? Profile more steps (--profile-active)"
        )
    rank = _rank_of(path, doc, fallback_rank)
    logger.debug("loaded %s: rank %d, %d events", path, rank, len(events))
    return Trace(path=path, rank=rank, events=events)


def load_traces(paths: list[str | Path]) -> list[Trace]:
    if not paths:
        raise TraceError("no trace files given; pass one or more .json/.json.gz torch.profiler traces")
    return [load_trace(p, fallback_rank=i) for i, p in enumerate(paths)]
