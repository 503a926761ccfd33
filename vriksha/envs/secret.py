"""A per-server secret that salts the hidden parts of an episode (hidden test inputs).

The same seed gives the same episode within one server (and across servers that share
VRIKSHA_ENV_SECRET), but a seed alone does not reveal the hidden inputs: reading the environment's
source and replaying its generator with the seed gives different ones.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import threading

__all__ = ["SECRET_ENV", "server_secret", "salted_rng"]

SECRET_ENV = "VRIKSHA_ENV_SECRET"
_lock = threading.Lock()
_secret: bytes | None = None


def server_secret() -> bytes:
    """$VRIKSHA_ENV_SECRET if set (replicas that must agree share it), else random, once per process."""
    global _secret
    given = os.environ.get(SECRET_ENV, "")
    if given:
        return given.encode()
    with _lock:
        if _secret is None:
            _secret = os.urandom(32)
        return _secret


def salted_rng(seed: int, *labels: str) -> random.Random:
    """A generator keyed by the secret, the seed and `labels` (which hidden part it draws)."""
    msg = "|".join([str(seed), *labels]).encode()
    digest = hmac.new(server_secret(), msg, hashlib.sha256).digest()
    return random.Random(int.from_bytes(digest, "big"))
