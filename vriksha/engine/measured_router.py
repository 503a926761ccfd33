"""The base of the engine's linear-layer routers: route a layer's calls while the engine is engaged, choosing
a path per shape and batch-size bucket by measurement, the measurements cached in a JSON under the cache dir.

`FastLinear` (fp32/bf16 paths) and `QuantLinear` (packed weights) share the pieces here: `engaged()`, the
installed `forward` that sends a call to its bucket's runner or back to the layer's own forward, the timing
of a candidate on weights out of cache (as a decode step streams the whole model), and the measure-once
cache. Each subclass names its cache file and says what one layer's key, measurement and valid record are.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import torch

from vriksha import timing_load
from vriksha.cache import announce_first_load, read_json, write_json

logger = logging.getLogger(__name__)

COLD_BYTES = 96 << 20  # timing cycles through copies of a weight until they exceed the last-level cache

Runner = Callable[[torch.Tensor], torch.Tensor]  # [rows, in] -> [rows, out]


def cold_copies(weight_bytes: int) -> int:
    """How many copies of a weight of this size the timing cycles through to keep it out of cache."""
    return max(1, min(64, COLD_BYTES // max(weight_bytes, 1)))


def time_cold(
    fn: Callable[[int], torch.Tensor], copies: int, min_seconds: float = 0.05, max_reps: int = 30
) -> float:
    """Best time of `fn(copy)` over repetitions, each on the next copy of the weight."""
    fn(0)
    best = float("inf")
    start = time.perf_counter()
    for rep in range(max_reps):
        copy = (rep + 1) % copies
        t = time.perf_counter()
        fn(copy)
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > min_seconds and rep >= 2:
            break
    return best


# a bucket whose one call would exceed this many multiply-adds is not timed but extrapolated from the last one
# timed (linearly in rows: every path is bound by arithmetic there); it spares the output head's large buckets
# (49152 x 576 at 1024 rows: 29 G, seconds a call where bf16 arithmetic is emulated), which only prompt
# log-probs ever reach
MAX_TIMED_MACS = 1 << 30


def timed_buckets(buckets: Sequence[int], macs_per_row: int) -> int:
    """How many of the (increasing) buckets are timed: the first always, then those within MAX_TIMED_MACS."""
    return max(1, sum(1 for rows in buckets if rows * macs_per_row <= MAX_TIMED_MACS))


# a bucket past one where some path's call took this long is extrapolated, not timed: a bf16 engine on a CPU
# that emulates bf16 arithmetic (about 1 GFLOP/s a core on a Zen 1) spent 76 s of its first load timing
# 1,024-row calls of its five layer shapes; a call this long is bound by arithmetic, linear in rows
MAX_TIMED_CALL_SECONDS = 0.25


def time_buckets_until_slow(
    time_bucket: Callable[[int], dict[str, float]], buckets: Sequence[int], count: int
) -> list[dict[str, float]]:
    """Each path's seconds on the first `count` buckets, timed in order, up to and including the first bucket
    where some path's call took more than MAX_TIMED_CALL_SECONDS (`extrapolated` extends them). A path that
    took INVERSION times longer than its previous bucket scaled by rows was slowed by other work, not by
    arithmetic: timing goes on, so that `retime_inversions` can find that bucket."""
    timings: list[dict[str, float]] = []
    for i in range(count):
        t = time_bucket(i)
        timings.append(t)
        slow = [p for p, s in t.items() if s > MAX_TIMED_CALL_SECONDS]
        if i and slow:
            scale = buckets[i] / buckets[i - 1]
            slow = [p for p in slow if p in timings[-2] and t[p] <= INVERSION * scale * timings[-2][p]]
        if slow:
            break
    return timings


def extrapolated(timings: list[dict[str, float]], buckets: Sequence[int]) -> list[dict[str, float]]:
    """Per-bucket timings of the first buckets, extended to every bucket: each one past them scales the last
    timed one linearly in rows."""
    out = list(timings)
    for i in range(len(timings), len(buckets)):
        scale = buckets[i] / buckets[len(timings) - 1]
        out.append({path: t * scale for path, t in timings[-1].items()})
    return out


INVERSION = 2.0  # a path timed this much slower on a bucket than on the next, larger one was disturbed
RETIMES = 2


def retime_inversions(
    timings: list[dict[str, float]], time_bucket: Callable[[int], dict[str, float]], tries: int = RETIMES
) -> int:
    """Times again the buckets a burst of other work slowed down, in place; returns how many were.

    `timings[i]` holds each path's seconds on bucket i, buckets in increasing rows. A path never needs
    INVERSION times longer for fewer rows (it could run the larger bucket's call padded), so where it
    measured that, the machine was busy during that bucket's turn: seen on a suite sharing the CPU, a 1-row
    packed call timed 8 ms against 24 us for 2 rows, and the engine then chose the wrong dtype. Such a bucket
    is timed again (up to `tries` times, the larger buckets first), each path keeping its best.
    """
    retimed = 0
    for i in reversed(range(len(timings) - 1)):
        for _ in range(tries):
            larger = timings[i + 1]
            if not any(t > INVERSION * larger[p] for p, t in timings[i].items() if p in larger):
                break
            again = time_bucket(i)
            timings[i] = {p: min(t, again.get(p, t)) for p, t in timings[i].items()}
            retimed += 1
    if retimed:
        logger.info("timed %d bucket(s) again: slower than a larger bucket (the machine was busy)", retimed)
    return retimed


def bucket_index(buckets: Sequence[int], rows: int) -> int:
    """The index of the smallest bucket >= rows; `len(buckets)` for rows above the last bucket."""
    return bisect.bisect_left(buckets, rows)


class MeasuredRouter:
    """Routes the calls of some linear layers of one model while engaged; a subclass measures the paths."""

    CACHE_FILE: ClassVar[str]  # under the cache dir
    WHAT: ClassVar[str]  # what one record is, in logs and warnings

    def __init__(self) -> None:
        self.active = False

    @contextlib.contextmanager
    def engaged(self) -> Iterator[None]:
        """Route the layers' calls made inside this block (the engine's forward pass)."""
        previous, self.active = self.active, True
        try:
            yield
        finally:
            self.active = previous

    def routes(self, x: torch.Tensor) -> bool:
        """Whether a call on `x` may be routed at all (else it takes the layer's own forward)."""
        return self.active and not x.requires_grad

    def routed_forward(
        self, linear: torch.nn.Linear, buckets: Sequence[int], runners: Sequence[Runner | None]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """A `forward` for `linear`: while routing, a call of `rows` rows goes to
        `runners[bucket_index(buckets, rows)]` (one runner per bucket, then one for rows above the last);
        where that is None, or outside `engaged()`, to the layer's own forward."""
        if len(runners) != len(buckets) + 1:
            raise ValueError(
                f"need {len(buckets) + 1} runners (one per bucket and one above), got {len(runners)}"
            )
        original = linear.forward
        in_f = linear.in_features

        def forward(x: torch.Tensor) -> torch.Tensor:
            if not self.routes(x):
                return original(x)
            rows = x.numel() // in_f
            run = runners[bisect.bisect_left(buckets, rows)]
            if run is None:
                return original(x)
            out = run(x.reshape(rows, in_f))
            return out.reshape(*x.shape[:-1], out.shape[-1])

        return forward

    def key(self, item: Any) -> str:
        """The cache key of one layer's measurement (shape, dtype, kernels, threads, versions)."""
        raise NotImplementedError

    def measure_one(self, item: Any) -> Any:
        """Measure one layer's paths; the record is kept in the cache as JSON."""
        raise NotImplementedError

    def valid(self, record: Any) -> bool:
        """Whether a cached record is complete for the current buckets."""
        raise NotImplementedError

    def describe(self, record: Any) -> Any:
        return record

    def measured(self, items: Sequence[Any]) -> dict[str, Any]:
        """The records of `items` by key: from the cache file, measured where missing, stale or timed under load
        (and saved, each with the machine's load while this call measured: `vriksha/timing_load.py`)."""
        known = read_json(self.CACHE_FILE)
        out: dict[str, Any] = {}
        missing: dict[str, Any] = {}
        for item in items:
            key = self.key(item)
            if key in out or key in missing:
                continue
            entry = known.get(key)
            if (
                timing_load.usable(self.WHAT, key, entry)
                and "timing" in entry
                and self.valid(entry["timing"])
            ):
                out[key] = entry["timing"]
            else:
                missing[key] = item
        if not missing:
            return out
        announce_first_load()
        watch = timing_load.LoadWatch()
        for key, item in missing.items():
            out[key] = self.measure_one(item)
            logger.info("%s %s: %s", self.WHAT, key, self.describe(out[key]))
        for key in missing:
            known[key] = timing_load.stamped(self.WHAT, key, {"timing": out[key]}, watch)
        write_json(self.CACHE_FILE, known, f"the {self.WHAT} timings")
        return out
