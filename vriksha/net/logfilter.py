"""Rate-limited logging: a flood of one message (an accept loop out of descriptors, a client hammering a bad
request) is logged a few times per window, then counted and summarised, so the log stays bounded."""

from __future__ import annotations

import logging
import threading
import time

_MAX_KEYS = 4096
# loggers whose every level is rate-limited: what clients can make them say is unbounded
_CONNECTION_LOGGERS = ("vriksha.net", "uvicorn", "asyncio")


class RepeatFilter(logging.Filter):
    """Pass at most `limit` records of one kind (logger, level, message template) per `window_s`; the first
    record of the next window says how many were dropped. Applies to warnings and errors of every logger, and
    to every level of the connection-handling loggers (the front's, uvicorn's, asyncio's)."""

    def __init__(self, limit: int, window_s: float) -> None:
        super().__init__()
        self.limit = limit
        self.window_s = window_s
        self._lock = threading.Lock()
        self._seen: dict[
            tuple[str, int, str], list[float | int]
        ] = {}  # key -> [window start, count, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and not record.name.startswith(_CONNECTION_LOGGERS):
            return True  # the application's own progress lines are not connection noise
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(key)
            if entry is None or now - entry[0] >= self.window_s:
                dropped = int(entry[2]) if entry is not None else 0
                if len(self._seen) >= _MAX_KEYS:
                    self._seen.clear()
                self._seen[key] = [now, 1, 0]
                if dropped:
                    record.msg = f"{record.msg} [{dropped} more like this in the last {self.window_s:.0f} s]"
                return True
            entry[1] += 1
            if entry[1] <= self.limit:
                return True
            entry[2] += 1
            return False


def install_repeat_filter(limit: int, window_s: float) -> RepeatFilter:
    """Attach one `RepeatFilter` to every handler of the root and uvicorn loggers (once per handler)."""
    filt = RepeatFilter(limit, window_s)
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access"):
        for handler in logging.getLogger(name).handlers:
            for old in [f for f in handler.filters if isinstance(f, RepeatFilter)]:
                handler.removeFilter(old)
            handler.addFilter(filt)
    return filt
