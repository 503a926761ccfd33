"""The HTTP front every vriksha server uses (`vriksha serve`, `vriksha env serve`, the router): connection cap,
header/body/keep-alive deadlines, body and header caps, the descriptor limit, rate-limited error logs;
and the validated field types of request bodies (`net.fields`, which clients import without uvicorn)."""

from typing import Any

from vriksha.net.config import FrontConfig
from vriksha.net.flags import add_flags, flag_name, from_args

__all__ = ["FrontConfig", "FrontServer", "add_flags", "flag_name", "from_args", "front_config"]


def __getattr__(name: str) -> Any:  # the serving half imports uvicorn: only when a server is built
    if name in ("FrontServer", "front_config"):
        from vriksha.net import server

        return getattr(server, name)
    raise AttributeError(f"module 'vriksha.net' has no attribute {name!r}")
