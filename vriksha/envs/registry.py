"""Environment registry: `register_env(cls)`, `make_env(name, **kwargs)`, `list_envs()`.

The built-in environments register when `vriksha.envs.builtin` is imported; other packages
(`vriksha.repo2env`) register theirs on import too. `make_env`/`list_envs` import the known
provider modules lazily, plus any named in `$VRIKSHA_ENV_MODULES` (comma-separated), and accept
`"package.module:ClassName"` for an environment class that is not registered at all.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from vriksha.envs.core import Environment, UnknownEnvironmentError

logger = logging.getLogger(__name__)

__all__ = ["register_env", "make_env", "list_envs", "get_env_class", "unregister_env"]

_REGISTRY: dict[str, type[Environment]] = {}

# modules that register environments when imported; missing ones are skipped.
PROVIDER_MODULES: tuple[str, ...] = (
    "vriksha.envs.builtin",
    "vriksha.repo2env.environment",
    "vriksha.repo2env",
)
_loaded: set[str] = set()


def register_env(cls: type[Environment]) -> type[Environment]:
    """Register an Environment subclass under `cls.name`; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise TypeError(f"register_env expects an Environment subclass, got {cls!r}")
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no `name`; set the class attribute `name = '...'`")
    old = _REGISTRY.get(cls.name)
    if (
        old is not None
        and old is not cls
        and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__)
    ):
        logger.warning(
            "environment %r re-registered: %s replaces %s", cls.name, cls.__qualname__, old.__qualname__
        )
    _REGISTRY[cls.name] = cls
    return cls


def unregister_env(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load_providers(until: str | None = None) -> None:
    """Import provider modules in order (stopping once `until` is registered, so looking up a built-in
    does not import every other package)."""
    extra = [m.strip() for m in os.environ.get("VRIKSHA_ENV_MODULES", "").split(",") if m.strip()]
    for module in (*PROVIDER_MODULES, *extra):
        if until is not None and until in _REGISTRY:
            return
        if module in _loaded:
            continue
        _loaded.add(module)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                logger.warning("environment provider %s failed to import: %s", module, exc)
        except Exception as exc:  # a broken provider must not hide the others
            logger.warning("environment provider %s failed to import: %s", module, exc)


def get_env_class(name: str) -> type[Environment]:
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise UnknownEnvironmentError(f"cannot load environment class {name!r}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise UnknownEnvironmentError(f"{name!r} is not an Environment subclass")
        return cls
    if name not in _REGISTRY:
        _load_providers(until=name)
    if name not in _REGISTRY:
        raise UnknownEnvironmentError(
            f"no environment named {name!r}; registered: {sorted(_REGISTRY) or 'none'} "
            "(or pass 'package.module:ClassName')"
        )
    return _REGISTRY[name]


def make_env(name: str, **kwargs: Any) -> Environment:
    """Instantiate the environment registered as `name` (one instance per session)."""
    return get_env_class(name)(**kwargs)


def list_envs() -> list[str]:
    _load_providers()
    return sorted(_REGISTRY)
