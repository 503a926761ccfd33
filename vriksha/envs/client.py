"""Clients for the environment server: `AsyncEnvClient` and the blocking `EnvClient`.

One client is one session over a WebSocket (`/v1/ws`). Every request carries a fresh id and waits
for the answer with that id, so a late answer to a timed-out request can never be mistaken for
the next one. A background task sends heartbeats and watches the server's; when the connection
drops, the next request reconnects, resumes the same session (`?session=ID`, proving ownership
with the resume token the server gave in its hello) and re-sends, and the server answers a
re-sent id from its memory instead of running the request twice.

    with EnvClient("http://127.0.0.1:8000") as env:
        result = env.reset(seed=0)
        result = env.step({"text": "42"})
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from vriksha.envs.core import Observation, State, StepResult, ToolSpec
from vriksha.envs.protocol import RESUME_TOKEN_HEADER, WS_PATH, EnvConnectionError, RemoteEnvError

try:
    import orjson

    _loads = orjson.loads

    def _dumps(obj: Any) -> str:
        return orjson.dumps(obj).decode()
except ImportError:  # pragma: no cover
    import json

    _loads = json.loads

    def _dumps(obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"))


logger = logging.getLogger(__name__)

T = TypeVar("T")


def ws_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    if not url.startswith(("ws://", "wss://")):
        url = "ws://" + url
    return url if url.endswith(WS_PATH) else url + WS_PATH


class AsyncEnvClient:
    """One environment session over a WebSocket, with request ids, heartbeats and reconnect."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 600.0,
        heartbeat_s: float | None = None,
        reconnect_attempts: int = 3,
        reconnect_backoff_s: float = 0.2,
        observation_type: type[Observation] = Observation,
        state_type: type[State] = State,
    ) -> None:
        self.url = ws_url(base_url)
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.heartbeat_s = heartbeat_s
        self.reconnect_attempts = reconnect_attempts
        self.reconnect_backoff_s = reconnect_backoff_s
        self.observation_type = observation_type
        self.state_type = state_type
        self.hello: dict[str, Any] = {}
        self.session_id: str | None = None
        self.resume_token: str | None = None  # the secret that resumes this session; never logged
        self.last_seen = 0.0
        self.reconnects = 0
        self.server_closed: str | None = None
        self._ws: ClientConnection | None = None
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._prefix = os.urandom(4).hex()
        self._reader: asyncio.Task[None] | None = None
        self._beater: asyncio.Task[None] | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._closed = False

    # -- connection ------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._ws is not None and self._reader is not None and not self._reader.done()

    async def connect(self) -> AsyncEnvClient:
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if not self.connected:
                await self._open(resume=self.session_id)
        return self

    async def _open(self, resume: str | None) -> None:
        await self._drop()
        url = self.url + (f"?session={resume}" if resume else "")
        headers = {RESUME_TOKEN_HEADER: self.resume_token} if resume and self.resume_token else None
        try:
            ws = await connect(
                url,
                open_timeout=self.connect_timeout_s,
                max_size=None,
                compression=None,
                additional_headers=headers,
            )
        except Exception as exc:
            raise EnvConnectionError(
                f"cannot connect to {url}: {exc}; is `vriksha env serve` running?"
            ) from exc
        try:
            first = _loads(await asyncio.wait_for(ws.recv(), self.connect_timeout_s))
        except Exception as exc:
            await ws.close()
            raise EnvConnectionError(f"{url} sent no hello: {exc}") from exc
        if first.get("event") != "hello":
            await ws.close()
            err = first.get("error") or {}
            raise RemoteEnvError(err.get("code", "error"), err.get("message", str(first)), err)
        self._ws = ws
        if resume:
            self.reconnects += 1
        self.hello = first
        self.session_id = first["session_id"]
        self.resume_token = first.get("resume_token") or self.resume_token
        self.last_seen = time.monotonic()
        self.server_closed = None
        self._reader = asyncio.create_task(self._read_loop(ws))
        beat = self.heartbeat_s or float(first.get("heartbeat_s") or 15.0)
        self._beater = asyncio.create_task(self._heartbeat_loop(ws, beat))

    async def _drop(self) -> None:
        for task in (self._reader, self._beater):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._reader = self._beater = None
        if self._ws is not None:
            ws, self._ws = self._ws, None
            try:
                await ws.close()
            except Exception:
                pass

    async def _read_loop(self, ws: ClientConnection) -> None:
        try:
            async for raw in ws:
                self.last_seen = time.monotonic()
                msg = _loads(raw)
                rid = msg.get("id")
                if rid is not None:
                    fut = self._pending.pop(str(rid), None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    continue  # an answer nobody waits for any more (it timed out): dropped, never misread
                if msg.get("event") == "closing":
                    self.server_closed = str(msg.get("reason", "closed"))
        except ConnectionClosed:
            pass
        finally:
            err = ConnectionError(f"the connection to {self.url} closed")
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(err)
            self._pending.clear()

    async def _heartbeat_loop(self, ws: ClientConnection, every_s: float) -> None:
        try:
            while True:
                await asyncio.sleep(every_s)
                if time.monotonic() - self.last_seen > 3 * every_s + 1.0:
                    logger.warning(
                        "no heartbeat from %s for %.1f s; dropping the connection", self.url, 3 * every_s
                    )
                    await ws.close()
                    return
                await ws.send('{"op":"ping"}')
        except (ConnectionClosed, asyncio.CancelledError):
            return

    # -- requests ------------------------------------------------------------------------

    async def request(self, op: str, **fields: Any) -> Any:
        """Send `{"id", "op", **fields}` and return its `result`; `RemoteEnvError` on an error answer."""
        if self._closed:
            raise EnvConnectionError("this client is closed; make a new one")
        rid = f"{self._prefix}-{next(self._ids)}"
        payload = _dumps({"id": rid, "op": op, **fields})
        last_exc: Exception | None = None
        for attempt in range(self.reconnect_attempts + 1):
            if attempt:
                await asyncio.sleep(self.reconnect_backoff_s * attempt)
            try:
                if not self.connected:
                    if self.server_closed is not None:
                        raise EnvConnectionError(f"the server ended this session ({self.server_closed})")
                    await self.connect()
                answer = await self._roundtrip(rid, payload)
                break
            except TimeoutError:  # an OSError, but not a lost connection: never retried
                raise
            except (ConnectionError, ConnectionClosed, OSError) as exc:
                if isinstance(exc, EnvConnectionError) and self.server_closed is not None:
                    raise
                last_exc = exc
                logger.info("request %s (%s) lost its connection: %s; reconnecting", rid, op, exc)
                await self._drop()
            except RemoteEnvError as exc:
                if exc.code == "session_forbidden":
                    raise EnvConnectionError(
                        f"the server refused to resume session {self.session_id}: {exc.remote_message}"
                    ) from exc
                if exc.code != "unknown_session":
                    raise
                raise EnvConnectionError(
                    f"session {self.session_id} is gone on the server (reaped or closed): {exc.remote_message}"
                ) from exc
        else:
            raise EnvConnectionError(
                f"lost {self.url} and could not reconnect after {self.reconnect_attempts} attempts: {last_exc}"
            )
        if answer.get("ok"):
            return answer.get("result")
        err = answer.get("error") or {}
        raise RemoteEnvError(str(err.get("code", "error")), str(err.get("message", "")), err)

    async def _roundtrip(self, rid: str, payload: str) -> dict[str, Any]:
        assert self._ws is not None
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self._ws.send(payload)
            return await asyncio.wait_for(fut, self.request_timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"no answer to request {rid} within {self.request_timeout_s:g} s; a later answer to it "
                "will be ignored (raise request_timeout_s for slow environments)"
            ) from None
        finally:
            self._pending.pop(rid, None)

    # -- the environment API --------------------------------------------------------------

    def _result(self, data: dict[str, Any]) -> StepResult:
        result = StepResult.model_validate(data)
        if self.observation_type is not Observation:
            result.observation = self.observation_type.model_validate(data["observation"])
        return result

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> StepResult:
        return self._result(await self.request("reset", seed=seed, options=options))

    async def step(self, action: BaseModel | dict[str, Any]) -> StepResult:
        if isinstance(action, BaseModel):
            action = action.model_dump(mode="json")
        return self._result(await self.request("step", action=action))

    async def state(self) -> State:
        return self.state_type.model_validate(await self.request("state"))

    async def tools(self) -> list[ToolSpec]:
        return [ToolSpec.model_validate(t) for t in await self.request("tools")]

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        return (await self.request("call_tool", name=name, arguments=arguments or {}))["output"]

    async def ping(self) -> float:
        """Round-trip time of an application-level ping, in seconds."""
        t0 = time.perf_counter()
        await self.request("ping")
        return time.perf_counter() - t0

    async def close(self) -> None:
        if self._closed:
            return
        if self.connected:
            try:
                await asyncio.wait_for(
                    self._roundtrip(
                        f"{self._prefix}-close", '{"id":"' + self._prefix + '-close","op":"close"}'
                    ),
                    5.0,
                )
            except Exception:
                pass
        self._closed = True
        await self._drop()

    async def __aenter__(self) -> AsyncEnvClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class EnvClient:
    """Blocking client: the `AsyncEnvClient` API on a private event loop in a background thread."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vriksha-env-client", daemon=True)
        self._thread.start()
        self.aclient = AsyncEnvClient(base_url, **kwargs)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def session_id(self) -> str | None:
        return self.aclient.session_id

    @property
    def resume_token(self) -> str | None:
        return self.aclient.resume_token

    @property
    def hello(self) -> dict[str, Any]:
        return self.aclient.hello

    def connect(self) -> EnvClient:
        self._call(self.aclient.connect())
        return self

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> StepResult:
        return self._call(self.aclient.reset(seed, options))

    def step(self, action: BaseModel | dict[str, Any]) -> StepResult:
        return self._call(self.aclient.step(action))

    def state(self) -> State:
        return self._call(self.aclient.state())

    def tools(self) -> list[ToolSpec]:
        return self._call(self.aclient.tools())

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        return self._call(self.aclient.call_tool(name, arguments))

    def ping(self) -> float:
        return self._call(self.aclient.ping())

    def request(self, op: str, **fields: Any) -> Any:
        return self._call(self.aclient.request(op, **fields))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self.aclient.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            self._loop.close()

    def __enter__(self) -> EnvClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()
