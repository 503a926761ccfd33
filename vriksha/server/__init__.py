"""The OpenAI-compatible HTTP server: `create_app(engine, ServerConfig(...))`, or `vriksha serve`."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vriksha.server.app import create_app
    from vriksha.server.config import ServerConfig

_LAZY = {"create_app": "vriksha.server.app", "ServerConfig": "vriksha.server.config"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vriksha.server' has no attribute {name!r}")


__all__ = ["ServerConfig", "create_app"]
