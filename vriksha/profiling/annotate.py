"""`phase`: a named region that shows up in torch.profiler traces and costs next to nothing otherwise;
`native_call`: the same for a native kernel's call, recorded as an operator."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch.autograd.profiler as _autograd_profiler
from torch.profiler import record_function

from vriksha.profiling.operators import NATIVE_PREFIX

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def profiler_active() -> bool:
    """True while any torch profiler (ours or another program's) is recording."""
    return _autograd_profiler._is_profiler_enabled


def _decorate(name: str, fn: F) -> F:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            if not _autograd_profiler._is_profiler_enabled:
                return await fn(*args, **kwargs)
            with record_function(name):
                return await fn(*args, **kwargs)

        return awrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _autograd_profiler._is_profiler_enabled:
            return fn(*args, **kwargs)
        with record_function(name):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class _IdlePhase:
    """What `phase` returns while no profiler records: a shared, stateless no-op (one per name)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> _IdlePhase:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        return _decorate(self.name, fn)


class _RecordingPhase:
    """What `phase` returns while a profiler records: a fresh `record_function` user annotation."""

    __slots__ = ("name", "_rf")

    def __init__(self, name: str) -> None:
        self.name = name
        self._rf: record_function | None = None

    def __enter__(self) -> _RecordingPhase:
        self._rf = record_function(self.name)
        self._rf.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        rf, self._rf = self._rf, None
        if rf is not None:
            rf.__exit__(None, None, None)

    def __call__(self, fn: F) -> F:
        return _decorate(self.name, fn)


_idle: dict[str, _IdlePhase] = {}


def phase(name: str) -> _IdlePhase | _RecordingPhase:
    """`with phase("engine.forward"):` or `@phase("train.backward")`.

    While a torch profiler is recording, the region is a `torch.profiler.record_function` user
    annotation called `name`; otherwise it costs a flag check and a dict lookup. As a decorator the
    check happens at every call, so functions decorated at import time are traced when profiling starts.
    """
    if _autograd_profiler._is_profiler_enabled:
        return _RecordingPhase(name)
    p = _idle.get(name)
    if p is None:
        p = _idle[name] = _IdlePhase(name)
    return p


def native_call(fn: Callable[..., R], kernel: str) -> Callable[..., R]:
    """`fn`, a native kernel's entry point (a ctypes function), to be called now: `fn` itself while no
    profiler records, else `fn` wrapped so that its call shows up in the trace as `vriksha::<kernel>`, which
    the report reads as a compute operator (torch's profiler records only its own operators, so a step spent
    in one native call would otherwise read as all overhead)."""
    if not _autograd_profiler._is_profiler_enabled:
        return fn
    name = NATIVE_PREFIX + kernel

    def recorded(*args: Any) -> R:
        with record_function(name):
            return fn(*args)

    return recorded
