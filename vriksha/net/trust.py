"""The credentials of vriksha's roles and how a process presents them (the trust model: docs/server.md, "Who
may call what").

- the **API key** (`--api-key`, `$VRIKSHA_API_KEY`): clients; `Authorization: Bearer KEY` or `x-api-key`;
- the **internal key** (`--internal-key`, `$VRIKSHA_INTERNAL_KEY`): replicas and routers among themselves
  (K/V transfer, cache event snapshots, the ZMQ streams' CURVE keys); header `x-vriksha-internal-key`;
- the **weights key** (`--weights-key`, `$VRIKSHA_WEIGHTS_KEY`): trainers updating a server's weights; header
  `x-vriksha-weights-key`.

One key never stands in for another: each is checked only against its own header, and the three must differ.
"""

from __future__ import annotations

import os
import secrets

from vriksha.errors import ConfigError

INTERNAL_KEY_ENV = "VRIKSHA_INTERNAL_KEY"
WEIGHTS_KEY_ENV = "VRIKSHA_WEIGHTS_KEY"
API_KEY_ENV = "VRIKSHA_API_KEY"
INTERNAL_HEADER = "x-vriksha-internal-key"
WEIGHTS_HEADER = "x-vriksha-weights-key"
MIN_KEY_CHARS = 16

_HOW = "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"


def new_key() -> str:
    """A fresh random key (256 bits)."""
    return secrets.token_urlsafe(32)


def env_key(name: str) -> str | None:
    """The key in environment variable `name`, or None when it is unset or empty."""
    return os.environ.get(name) or None


def check_keys(api_key: str | None, internal_key: str | None, weights_key: str | None = None) -> None:
    """The role keys given are long enough and pairwise different (a key shared by two roles would let a
    client of one act as the other)."""
    named = {"--internal-key": internal_key, "--weights-key": weights_key}
    for flag, key in named.items():
        if key is not None and len(key) < MIN_KEY_CHARS:
            raise ConfigError(f"{flag} must be at least {MIN_KEY_CHARS} characters; {_HOW}")
    given = [(flag, key) for flag, key in {"--api-key": api_key, **named}.items() if key]
    for i, (a, ka) in enumerate(given):
        for b, kb in given[i + 1 :]:
            if secrets.compare_digest(ka.encode(), kb.encode()):
                raise ConfigError(f"{a} and {b} must differ: each key grants its own role only; {_HOW}")


def internal_headers(key: str | None) -> dict[str, str]:
    return {INTERNAL_HEADER: key} if key else {}


def weights_headers(key: str | None) -> dict[str, str]:
    return {WEIGHTS_HEADER: key} if key else {}
