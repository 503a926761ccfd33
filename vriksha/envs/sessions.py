"""Sessions: one environment instance each, a cap on how many live at once, idle reaping.

Every session owns its own `Environment` (isolation: one session's failure never touches another),
runs env code in a thread pool so a slow step never blocks the event loop, and serialises its own
calls with a lock. A session whose client went away (a dropped WebSocket) stays resumable for
`detach_grace_s`; any session without a request for `idle_timeout_s` is closed by the reaper.

Ownership: every session gets a resume token, a secret that only its creator is told. The id
names a session (it appears in logs and MCP headers); `authorize` wants the token as well before
anyone resumes, drives over HTTP or deletes it.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vriksha.envs.core import Environment
from vriksha.envs.protocol import (
    RESUME_TOKEN_HEADER,
    EnvServerError,
    ErrorCode,
    SessionCapacityError,
    SessionForbiddenError,
    UnknownSessionError,
    check_request,
    dumps,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EnvWorkers:
    """Threads that run env code off the event loop.

    Leaner than `run_in_executor` on the hot path: a plain asyncio future per call, and finished
    calls go back to the loop in batches, with one loop wake-up per batch rather than per call.
    Threads start on demand up to `max_workers`.
    """

    def __init__(self, max_workers: int, name: str = "vriksha-env") -> None:
        self.max_workers = max_workers
        self.name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = (
            collections.deque()
        )
        self._lock = threading.Lock()
        self._signaled = False
        self._threads: list[threading.Thread] = []
        self._busy = 0

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._busy += 1
            grow = self._busy > len(self._threads) and len(self._threads) < self.max_workers
        if grow:
            t = threading.Thread(target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()
        self._jobs.put((fut, fn, args))
        return fut

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args = job
            try:
                out, exc = fn(*args), None
            except BaseException as e:  # handed to the awaiting coroutine
                out, exc = None, e
            with self._lock:
                self._busy -= 1
                self._done.append((fut, out, exc))
                if self._signaled:
                    continue
                self._signaled = True
            try:
                fut.get_loop().call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return

    def _drain(self) -> None:
        with self._lock:
            self._signaled = False
            done = list(self._done)
            self._done.clear()
        for fut, out, exc in done:
            if fut.cancelled():
                continue
            if exc is None:
                fut.set_result(out)
            else:
                fut.set_exception(exc)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


@dataclass(slots=True)
class Session:
    id: str
    env: Environment
    kind: str  # "ws" | "http" | "mcp" | "openenv"
    created_at: float
    last_active: float
    steps: int = 0
    busy: int = 0
    attached: bool = True
    detached_at: float | None = None
    closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    recent: dict[Any, asyncio.Future[str]] = field(default_factory=dict)  # request id -> its reply
    owner: object | None = None  # the connection a WebSocket session is attached to
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)  # its resume token
    on_close: Callable[[str], Awaitable[None]] | None = None

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def remember(self, rid: Any, keep: int = 32) -> asyncio.Future[str]:
        """A future for the reply to request `rid`, kept so a re-sent `rid` gets the same answer."""
        recent = self.recent
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        recent[rid] = fut
        if len(recent) > keep:
            del recent[next(iter(recent))]
        return fut


class SessionManager:
    """Creates, finds, runs and reaps sessions for one environment factory."""

    def __init__(
        self,
        factory: Callable[[], Environment],
        *,
        max_sessions: int = 64,
        idle_timeout_s: float = 300.0,
        detach_grace_s: float = 30.0,
        reap_interval_s: float | None = None,
        workers: int | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        self.factory = factory
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.detach_grace_s = min(detach_grace_s, idle_timeout_s)
        self.reap_interval_s = reap_interval_s or max(0.05, min(5.0, self.detach_grace_s / 4))
        self.workers = EnvWorkers(workers or min(64, max_sessions + 4))
        self._sessions: dict[str, Session] = {}
        self._reserved = 0
        self._reaper: asyncio.Task[None] | None = None
        self.total_created = 0
        self.total_reaped = 0

    # -- counts ----------------------------------------------------------------

    @property
    def active(self) -> int:
        return len(self._sessions) + self._reserved

    def capacity(self) -> dict[str, int]:
        return {"active_sessions": self.active, "max_sessions": self.max_sessions}

    # -- lifecycle -------------------------------------------------------------

    async def create(self, kind: str, session_id: str | None = None) -> Session:
        """Make a session (the env is built in a thread); `SessionCapacityError` when full."""
        if self.active >= self.max_sessions:
            raise SessionCapacityError(
                f"the server is at its cap of {self.max_sessions} concurrent sessions; close one "
                "or retry later (or start the server with a larger --max-sessions)",
                **self.capacity(),
            )
        self._reserved += 1
        try:
            env = await self.workers.submit(self.factory)
        except Exception as exc:
            raise EnvServerError(
                f"the environment factory failed: {type(exc).__name__}: {exc}", ErrorCode.ENV_ERROR
            ) from exc
        finally:
            self._reserved -= 1
        now = time.monotonic()
        sid = session_id or uuid.uuid4().hex
        session = Session(id=sid, env=env, kind=kind, created_at=now, last_active=now)
        self._sessions[sid] = session
        self.total_created += 1
        logger.debug("session %s (%s) created; %d active", sid, kind, self.active)
        return session

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(
                f"no live session {session_id!r}: it was never created, was closed, or was reaped "
                f"after {self.idle_timeout_s:g} s idle; create a new one"
            )
        return session

    def authorize(self, session_id: str, token: str | None, action: str = "use") -> Session:
        """The session, if `token` is its resume token; `SessionForbiddenError` otherwise."""
        session = self.get(session_id)
        if not token:
            raise SessionForbiddenError(
                f"cannot {action} session {session_id!r} without its resume token: send the "
                f"'resume_token' it was created with in the {RESUME_TOKEN_HEADER} header"
            )
        if not hmac.compare_digest(token.encode(), session.token.encode()):
            raise SessionForbiddenError(
                f"the resume token does not match session {session_id!r}: a session belongs to the "
                "client that created it; create a session of your own"
            )
        return session

    def find(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    async def close(self, session_id: str, reason: str = "closed") -> bool:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        session.closed = True
        if session.on_close is not None:
            try:
                await session.on_close(reason)
            except Exception:
                logger.debug("session %s on_close failed", session_id, exc_info=True)
        try:
            async with session.lock:  # let a call in flight finish before the env goes away
                await self.workers.submit(session.env.close)
        except Exception:
            logger.warning("session %s: env.close() failed", session_id, exc_info=True)
        logger.debug("session %s closed (%s); %d active", session_id, reason, self.active)
        return True

    def detach(self, session: Session, owner: object | None = None) -> None:
        """The session's connection went away; a newer connection that took it over keeps it."""
        if owner is not None and session.owner is not owner:
            return
        session.attached = False
        session.owner = None
        session.detached_at = time.monotonic()
        session.on_close = None

    def attach(self, session: Session, owner: object | None = None) -> None:
        session.attached = True
        session.owner = owner
        session.detached_at = None
        session.touch()

    # -- running env code --------------------------------------------------------

    async def run(self, session: Session, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` (env code) in the thread pool, one call at a time per session."""
        session.busy += 1
        try:
            async with session.lock:
                if session.closed:
                    raise UnknownSessionError(f"session {session.id!r} was closed")
                return await self.workers.submit(fn, *args)
        finally:
            session.busy -= 1
            session.last_active = time.monotonic()

    # -- reaping ---------------------------------------------------------------------

    def expired(self, now: float | None = None) -> list[tuple[str, str]]:
        now = time.monotonic() if now is None else now
        out = []
        for sid, s in self._sessions.items():
            if s.busy:
                continue
            if not s.attached and s.detached_at is not None and now - s.detached_at >= self.detach_grace_s:
                out.append((sid, "detached"))
            elif now - s.last_active >= self.idle_timeout_s:
                out.append((sid, "idle"))
        return out

    async def reap_once(self) -> int:
        victims = self.expired()
        for sid, why in victims:
            logger.info("reaping session %s (%s)", sid, why)
            if await self.close(sid, reason=why):
                self.total_reaped += 1
        return len(victims)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            try:
                await self.reap_once()
            except Exception:
                logger.exception("session reaper failed; continuing")

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            try:
                await self._reaper
            except asyncio.CancelledError:
                pass
            self._reaper = None
        for sid in list(self._sessions):
            await self.close(sid, reason="server shutting down")
        self.workers.shutdown()


# ---------------------------------------------------------------- operations (JSON strings out)


def _reset(env: Environment, seed: Any, options: Any) -> str:  # fields checked by `check_request`
    return env.reset(seed, options).model_dump_json(serialize_as_any=True)  # keep subclass fields


def _step(env: Environment, action: Any) -> str:
    return env.step(action).model_dump_json(serialize_as_any=True)


def _state(env: Environment) -> str:
    return env.state.model_dump_json()


def _tools(env: Environment) -> str:
    return dumps([t.spec().model_dump() for t in env.tools()])


def _call_tool(env: Environment, name: Any, arguments: Any) -> str:
    return dumps({"output": env.call_tool(name, arguments if arguments is not None else {})})


class Dispatcher:
    """Runs one request against one session and returns the result as a JSON string."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    async def __call__(self, session: Session, op: Any, msg: dict[str, Any]) -> str:
        op = check_request(op, msg)
        run = self.manager.run
        env = session.env
        if op == "step":
            session.steps += 1
            return await run(session, _step, env, msg["action"])
        if op == "reset":
            return await run(session, _reset, env, msg.get("seed"), msg.get("options"))
        if op == "state":
            return await run(session, _state, env)
        if op == "tools":
            return await run(session, _tools, env)
        if op == "call_tool":
            return await run(session, _call_tool, env, msg.get("name"), msg.get("arguments"))
        if op == "ping":
            session.touch()
            return dumps({"pong": time.time()})
        raise EnvServerError(
            f"unknown op {op!r}; expected one of reset, step, state, tools, call_tool, ping, close",
            ErrorCode.UNKNOWN_OP,
        )
