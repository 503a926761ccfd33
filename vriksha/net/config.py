"""The HTTP front's limits: one field per limit, each with the help text its command-line flag shows."""

from __future__ import annotations

from dataclasses import dataclass, field


def option(default: object, help: str, *, metavar: str | None = None) -> object:
    """A config field that `net.flags` turns into `--name-with-dashes` (the `_s` suffix of seconds dropped)."""
    return field(default=default, metadata={"help": help, "metavar": metavar})


@dataclass(slots=True)
class FrontConfig:
    """Limits that keep a server answering while hostile or broken clients hold connections."""

    max_connections: int = option(
        1024,
        "open connections (HTTP and WebSocket) beyond which a new one gets 503 with a JSON body and is "
        "closed; lowered at start to what the file-descriptor limit leaves room for",
        metavar="N",
    )
    header_timeout_s: float = option(
        10.0,
        "seconds a client has to send a request's complete headers, counted from the connection's start "
        "or the previous response (slow-loris defence); then 408 and close",
        metavar="S",
    )
    keep_alive_timeout_s: float = option(
        5.0, "seconds an idle keep-alive connection is kept open after a response", metavar="S"
    )
    body_timeout_s: float = option(
        30.0, "seconds a client has to send a request's whole body; then 408 and close", metavar="S"
    )
    max_body_bytes: int = option(
        16 * 1024 * 1024, "largest request body accepted, in bytes; larger ones get 413", metavar="BYTES"
    )
    max_header_bytes: int = option(
        16 * 1024,
        "largest request line plus headers, in bytes; larger ones get 431 and the connection is closed",
        metavar="BYTES",
    )
    fd_limit: int | None = option(
        None,
        "soft file-descriptor limit (RLIMIT_NOFILE) to set at start; none: raise it to the hard limit",
        metavar="N",
    )
    log_repeat_limit: int = option(
        5,
        "log at most N messages of one kind (same logger and text) per --log-repeat-window: warnings and "
        "errors, and every message of the connection loggers; the rest are counted and reported once the "
        "window ends",
        metavar="N",
    )
    log_repeat_window_s: float = option(60.0, "the window of --log-repeat-limit, in seconds", metavar="S")

    def validate(self) -> None:
        from vriksha.errors import ConfigError

        for name in ("max_connections", "max_body_bytes", "max_header_bytes", "log_repeat_limit"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "keep_alive_timeout_s", "body_timeout_s", "log_repeat_window_s"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value}")
        if self.fd_limit is not None and self.fd_limit < 64:
            raise ConfigError(f"fd_limit must be >= 64 (or unset), got {self.fd_limit}")
