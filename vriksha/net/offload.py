"""A request's CPU work off the event loop: parsing, tokenizing, chat templates, grammar checks and safety scans
of a large input run on a small thread pool, so that the loop keeps answering (/health, other clients'
streams) while a multi-megabyte prompt is tokenized. Small inputs run inline: for them the hop to a thread
would cost more than the work."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

INLINE_BYTES = 32 * 1024  # inputs up to this size are handled on the loop (well under a millisecond of work)
_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        workers = min(4, max(2, os.cpu_count() or 2))
        _executor = ThreadPoolExecutor(workers, thread_name_prefix="request-cpu")
    return _executor


async def off_loop(size: int | None, fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)`, inline when `size` (the input's bytes or characters; None: unknown) is small, else on the
    request-CPU thread pool (tokenizers and llguidance release the GIL while they work)."""
    if size is not None and size <= INLINE_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(fn, *args))


def body_size(headers: Mapping[str, str]) -> int | None:
    """A request's declared Content-Length, or None (chunked, or not a number)."""
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None
