"""What the server needs to know besides the engine: names, auth, admission bound, profiling, shutdown, and
the HTTP front's connection limits. The options declared with `option()` are also `vriksha serve`'s flags
(`vriksha.options`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from vriksha.net import FrontConfig
from vriksha.options import Options, option
from vriksha.reasoning.registry import REASONING_PARSERS
from vriksha.toolcalls.registry import PARSERS


@dataclass(slots=True)
class ServerConfig(Options):
    options_label: ClassVar[str] = "server"
    flag_dest_prefix: ClassVar[str] = "server_"

    host: str = option("127.0.0.1", "address to bind (0.0.0.0 for all)")
    port: int = option(8000, "port to bind")
    # names a request's `model` may use; the first is the one reported. Empty: the engine's model name.
    served_model_names: list[str] = field(default_factory=list)
    api_key: str | None = option(
        None, "require `Authorization: Bearer KEY` on requests (default: $VRIKSHA_API_KEY, else none)"
    )
    internal_key: str | None = option(
        None,
        "the key replicas and routers present to each other (K/V transfer, /kv_events/snapshot, the KV event "
        "stream's CURVE keys), never a client's key; needed by --role prefill|decode and --kv-events-endpoint, "
        "and the same on every replica and router of a fleet (default: $VRIKSHA_INTERNAL_KEY; prefer the "
        "variable: a flag shows in the process list)",
    )
    weights_key: str | None = option(
        None,
        "the key trainers present to update the weights, pause and resume generation, and reset the prefix "
        "cache; without it those endpoints are closed (default: $VRIKSHA_WEIGHTS_KEY)",
    )
    # endpoints that need no key even when `api_key` is set (never the internal or weight endpoints)
    auth_exempt: frozenset[str] = frozenset({"/health", "/metrics"})
    max_waiting: int = option(
        256,
        "sequences (prompts x n) allowed to wait for their first token; more get 503 with Retry-After, and a "
        "request that alone asks for more gets 400",
    )
    max_prompt_logprobs: int = option(
        1 << 18,
        "prompt log-probabilities one request may ask for (prompt tokens x (prompt_logprobs + 1), in each "
        "choice that returns them); more get 400",
    )
    retry_after_s: int = 1
    profile_dir: Path = field(default_factory=lambda: Path("profiles"))
    shutdown_timeout_s: float = option(
        30.0,
        "on SIGTERM, seconds in-flight requests may run before they are answered with 503 (or an error event "
        "in a stream) and aborted; meanwhile /health says draining",
        flag="shutdown-timeout",
    )
    # connections, deadlines, body and header caps, descriptor limit, log rate (`--max-connections`, ...)
    front: FrontConfig = field(default_factory=FrontConfig)
    # let more than one trainer update this server's weights (they must take turns: one update at a time)
    allow_multiple_weight_clients: bool = False
    tool_call_parser: str | None = option(
        None,
        "how the model writes tool calls (default: chosen from the chat template; hermes when it says nothing)",
        choices=tuple(sorted(PARSERS)),
    )
    reasoning_parser: str | None = option(
        None,
        "split the <think>...</think> block a reasoning model writes into reasoning_content (chat) and reasoning "
        "items (/v1/responses); default: none, the reply comes back whole",
        choices=tuple(sorted(REASONING_PARSERS)),
    )
    responses_max_stored: int = option(
        1024,
        "/v1/responses kept for previous_response_id and GET /v1/responses/{id} (least recently used dropped "
        "first; 0: none kept)",
    )
    responses_ttl_s: float = option(
        3600.0, "seconds a stored /v1/responses response stays retrievable after it was last used"
    )
    load_weights_dir: str | None = option(
        None,
        "at startup, load the newest complete weight version under this directory (the filesystem weight transfer's "
        "directory, e.g. a run's output_dir/weights); versions without their COMPLETE marker are skipped",
    )

    @classmethod
    def internal_fields(cls) -> tuple[str, ...]:
        """Fields that are not options of their own here (list-valued flags, sections, fixed settings)."""
        return tuple(f.name for f in dataclasses.fields(cls) if "help" not in f.metadata)
