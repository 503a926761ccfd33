"""Environment registry: `register_env(cls)`, `make_env(name, **kwargs)`, `list_envs()`.

Environments register themselves: a class decorated with `@register_env` is known once its module
is imported. Packages that are not imported up front declare theirs as entry points in the
`vriksha.environments` group (`name = "package.module:ClassName"`, or a module that registers on
import); vriksha's own `repo` environment is declared that way in `pyproject.toml`, so this module
names no package above it. `make_env`/`list_envs` import lazily: the built-ins
(`vriksha.envs.builtin`), then the entry point of the name asked for (all of them for `list_envs`),
then any module named in `$VRIKSHA_ENV_MODULES` (comma-separated). `"package.module:ClassName"`
loads an environment class that is not registered at all.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from vriksha.envs.core import Environment, UnknownEnvironmentError

logger = logging.getLogger(__name__)

__all__ = ["ENTRY_POINT_GROUP", "register_env", "make_env", "list_envs", "get_env_class", "unregister_env"]

ENTRY_POINT_GROUP = "vriksha.environments"
BUILTIN_MODULE = "vriksha.envs.builtin"

_REGISTRY: dict[str, type[Environment]] = {}
_loaded: set[str] = set()  # modules and entry points already imported (or found broken)
# Held while providers load: `_loaded` marks a module before its import has registered anything, so a second
# thread must wait for the first rather than find the module "loaded" and the registry still empty. Re-entrant:
# a provider may look up another environment while it is imported.
_load_lock = threading.RLock()


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


def _import(module: str) -> None:
    if module in _loaded:
        return
    _loaded.add(module)
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            logger.warning("environment module %s failed to import: %s", module, exc)
    except Exception as exc:  # a broken provider must not hide the others
        logger.warning("environment module %s failed to import: %s", module, exc)


def _load_entry_point(ep: EntryPoint) -> None:
    key = f"entry point {ep.name} = {ep.value}"
    if key in _loaded:
        return
    _loaded.add(key)
    try:
        obj = ep.load()
    except Exception as exc:  # a broken plug-in must not hide the others
        logger.warning("environment %s failed to load: %s", key, exc)
        return
    if isinstance(obj, type) and issubclass(obj, Environment):
        if obj.name != ep.name:
            logger.warning("environment %s registers as %r, not %r", key, obj.name, ep.name)
        register_env(obj)


def _entry_points(name: str | None = None) -> list[EntryPoint]:
    found = entry_points(group=ENTRY_POINT_GROUP)
    return [ep for ep in found if name is None or ep.name == name]


def _load_providers(until: str | None = None) -> None:
    """Import the built-ins, then entry points (only `until`'s when given), then `$VRIKSHA_ENV_MODULES`,
    stopping once `until` is registered (looking up a built-in imports nothing else)."""
    extra = [m.strip() for m in os.environ.get("VRIKSHA_ENV_MODULES", "").split(",") if m.strip()]
    steps: list[Any] = [BUILTIN_MODULE, *_entry_points(until), *extra]
    with _load_lock:
        for step in steps:
            if until is not None and until in _REGISTRY:
                return
            if isinstance(step, str):
                _import(step)
            else:
                _load_entry_point(step)


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
            f"(or pass 'package.module:ClassName'; an installed package declares its environments as "
            f"{ENTRY_POINT_GROUP!r} entry points: reinstall it if one is missing)"
        )
    return _REGISTRY[name]


def make_env(name: str, **kwargs: Any) -> Environment:
    """Instantiate the environment registered as `name` (one instance per session)."""
    return get_env_class(name)(**kwargs)


def list_envs() -> list[str]:
    _load_providers()
    return sorted(_REGISTRY)
