"""The artifact store: where vriksha keeps on disk what it derives once and reuses (converted models, compiled
kernels, measured timings and the choices made from them), in `$VRIKSHA_CACHE`, default `~/.cache/vriksha`.

Not a cache of requests or KV: those are the engine's radix cache (`engine/core/radix_cache.py`) and the
router's mirror of it. `loading/`, the engine's platform room and the semantic router all keep artifacts here.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """`$VRIKSHA_CACHE`, default `~/.cache/vriksha`."""
    return Path(os.environ.get("VRIKSHA_CACHE", Path.home() / ".cache" / "vriksha")).expanduser()


_announced = False


def announce_first_load() -> None:
    """Say once per process, before the first kernel build or timing that is not cached yet, that the first
    load on a machine builds and times its paths (the user would otherwise wait on a silent minute)."""
    global _announced
    if not _announced:
        _announced = True
        logger.warning(
            "compiling and timing this machine's kernels, dtypes and linear paths once (about a minute on 2 "
            "cores); later loads read them from %s",
            cache_dir(),
        )


def read_json(name: str) -> dict[str, Any]:
    """The JSON object kept as `name` in the store; empty where it is missing or unreadable."""
    try:
        return json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}


def write_json(name: str, data: dict[str, Any], what: str) -> None:
    """Replace `name` in the store with `data` at once (a reader never sees half a file); a failure to
    write is logged as a warning naming `what` was not saved, never raised."""
    path = cache_dir() / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not save %s to %s: %s", what, path, exc)
