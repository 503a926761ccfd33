"""Where vriksha keeps what it derives once and reuses: converted models, compiled kernels, linear-path plans."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$VRIKSHA_CACHE`, default `~/.cache/vriksha`."""
    return Path(os.environ.get("VRIKSHA_CACHE", Path.home() / ".cache" / "vriksha")).expanduser()
