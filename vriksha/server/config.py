"""What the server needs to know besides the engine: names, auth, admission bound, profiling, shutdown, and
the HTTP front's connection limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vriksha.net import FrontConfig


@dataclass(slots=True)
class ServerConfig:
    # names a request's `model` may use; the first is the one reported. Empty: the engine's model name.
    served_model_names: list[str] = field(default_factory=list)
    api_key: str | None = None
    # replicas' and routers' credential among themselves (K/V transfer, cache events); never a client's
    internal_key: str | None = None
    # trainers' credential for weight updates, pause and resume; without it those endpoints are closed
    weights_key: str | None = None
    # endpoints that need no key even when `api_key` is set (never the internal or weight endpoints)
    auth_exempt: frozenset[str] = frozenset({"/health", "/metrics"})
    # sequences (prompts x n) admitted but not yet given their first token; beyond this the server answers 503
    max_waiting: int = 256
    # prompt log-probabilities one request may ask for (prompt tokens x (k + 1), per choice); beyond: 400
    max_prompt_logprobs: int = 1 << 18
    retry_after_s: int = 1
    profile_dir: Path = field(default_factory=lambda: Path("profiles"))
    # on SIGTERM: how long in-flight requests may run before they are aborted
    shutdown_timeout_s: float = 30.0
    # connections, deadlines, body and header caps, descriptor limit, log rate (`--max-connections`, ...)
    front: FrontConfig = field(default_factory=FrontConfig)
    # let more than one trainer update this server's weights (they must take turns: one update at a time)
    allow_multiple_weight_clients: bool = False
    # tool-call convention (vriksha.toolcalls); None: chosen from the chat template
    tool_call_parser: str | None = None
