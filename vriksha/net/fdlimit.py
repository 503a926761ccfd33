"""The file-descriptor budget: raise the soft limit at start, and size the connection cap to what it leaves."""

from __future__ import annotations

import logging
import os
import resource

logger = logging.getLogger(__name__)

# descriptors kept free for everything but client sockets: model files, logs, pipes, threads' eventfds, and
# the refusals themselves (a refused connection holds its descriptor until its 503 is written)
FD_RESERVE = 64
_CEILING = 1 << 20  # an "unlimited" hard limit is not worth a table of that size


def raise_fd_limit(target: int | None = None) -> tuple[int, int]:
    """Set the soft RLIMIT_NOFILE to `target` (default: the hard limit, at most 2**20); return (old, new)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = hard if hard != resource.RLIM_INFINITY else _CEILING
    want = min(target if target is not None else min(cap, _CEILING), cap)
    if want != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            logger.warning("could not set the file-descriptor limit to %d (kept %d): %s", want, soft, exc)
            return soft, soft
    if target is None and want > soft:
        logger.info("file-descriptor limit raised from %d to %d", soft, want)
    return soft, want


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def connection_budget(max_connections: int) -> int:
    """`max_connections`, lowered so that the connections fit under the soft descriptor limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = max(1, soft - open_fds() - FD_RESERVE)
    if room < max_connections:
        logger.warning(
            "the file-descriptor limit (%d, %d in use) leaves room for %d connections; "
            "--max-connections lowered from %d (raise `ulimit -n` to allow more)",
            soft,
            open_fds(),
            room,
            max_connections,
        )
        return room
    return max_connections


def near_fd_limit(fd: int) -> bool:
    """True when descriptor number `fd` is within the reserve of the soft limit (descriptors are allocated
    lowest-first, so at least `fd` others are open)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft != resource.RLIM_INFINITY and fd >= soft - FD_RESERVE // 2
