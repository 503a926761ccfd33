"""`WS /v1/ws[?session=ID]`: one connection is one session (`?session=` with the session's resume token resumes
a dropped one). Requests are answered in order; a re-sent request id is answered from memory, never run twice."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fastapi import APIRouter, WebSocket

from vriksha.envs.app_state import EnvAppState, EnvState
from vriksha.envs.protocol import (
    PROTOCOL_VERSION,
    RESUME_TOKEN_HEADER,
    WS_PATH,
    EnvServerError,
    ErrorCode,
    ProtocolError,
    dumps,
    error_from_exception,
    loads,
    request_id,
)

logger = logging.getLogger(__name__)
router = APIRouter()


def _interrupted() -> EnvServerError:
    return EnvServerError(
        "the request was interrupted (server shutting down?); retry it", ErrorCode.SERVER_ERROR
    )


def _reply_ok(rid_json: str, result_json: str) -> str:
    return '{"id":' + rid_json + ',"ok":true,"result":' + result_json + "}"


def _reply_err(rid_json: str, err: EnvServerError) -> str:
    return '{"id":' + rid_json + ',"ok":false,"error":' + dumps(err.to_wire()) + "}"


async def _heartbeat(websocket: WebSocket, every_s: float) -> None:
    try:
        while True:
            await asyncio.sleep(every_s)
            await websocket.send_text('{"event":"heartbeat","t":' + repr(time.time()) + "}")
    except Exception:
        return


class _Close(Exception):
    """The client asked to close its session (`op: close`)."""


class WsSession:
    """One WebSocket connection bound to one session, from the hello to the detach or close."""

    def __init__(self, websocket: WebSocket, state: EnvAppState) -> None:
        self.websocket, self.state = websocket, state
        self.resume = websocket.query_params.get("session")
        self.session: Any = None
        self.closed_by_server = False

    async def open(self) -> bool:
        """Create or resume the session; on refusal, say why and close the connection."""
        manager, websocket = self.state.manager, self.websocket
        try:
            self.session = await self._resumed() if self.resume else await manager.create("ws")
            manager.attach(self.session, owner=websocket)
        except EnvServerError as exc:
            await websocket.send_text(dumps({"event": "error", "error": exc.to_wire()}))
            await websocket.close(code=1013 if exc.code == ErrorCode.CAPACITY_REACHED else 1008)
            return False
        self.session.on_close = self._on_close
        return True

    async def _resumed(self) -> Any:
        websocket, resume = self.websocket, self.resume
        token = websocket.headers.get(RESUME_TOKEN_HEADER) or websocket.query_params.get("token")
        session = self.state.manager.authorize(resume, token, "resume")
        if session.kind != "ws":
            raise EnvServerError(
                f"session {resume!r} is a {session.kind} session; only WebSocket sessions resume",
                ErrorCode.SESSION_BUSY,
            )
        previous = session.on_close
        session.on_close = None
        # the token holder is the owner, so the connection it leaves is its own stale one
        if session.attached and previous is not None:
            await previous("resumed on another connection")
        return session

    async def _on_close(self, reason: str) -> None:
        self.closed_by_server = True
        with contextlib.suppress(Exception):
            await self.websocket.send_text(dumps({"event": "closing", "reason": reason}))
            await self.websocket.close(code=1001)

    def hello(self) -> str:
        config, session = self.state.config, self.session
        return dumps(
            {
                "event": "hello",
                "session_id": session.id,
                "resume_token": session.token,
                "env": self.state.env_cls.name,
                "protocol": PROTOCOL_VERSION,
                **self.state.manager.capacity(),
                "heartbeat_s": config.heartbeat_s,
                "idle_timeout_s": config.idle_timeout_s,
                "resumed": bool(self.resume),
            }
        )

    async def answer(self, raw: str | bytes | None) -> str | None:
        """The reply to one message to send; None when there is none to send (a bare heartbeat, or a re-sent
        request answered already). Raises `_Close` on `op: close`."""
        session, rid_json = self.session, "null"
        try:
            try:
                msg = loads(raw)
            except Exception as exc:
                raise EnvServerError(f"not valid JSON: {exc}", ErrorCode.INVALID_JSON) from None
            if type(msg) is not dict:
                raise ProtocolError("a request must be a JSON object with 'id' and 'op'")
            rid = request_id(msg)
            if rid is None:
                if msg.get("op") == "ping":  # an id-less ping is a bare heartbeat
                    session.touch()
                    return None
                raise ProtocolError("every request needs an 'id' (a string or an integer)")
            rid_json = dumps(rid)
            earlier = session.recent.get(rid)
            if earlier is not None:  # a re-send after a reconnect: answer it, never run it twice
                await self.websocket.send_text(await earlier)
                return None
            op = msg.get("op")
            if op == "close":
                with contextlib.suppress(Exception):
                    await self.websocket.send_text(_reply_ok(rid_json, '{"closed":true}'))
                raise _Close
            answer, reply = session.remember(rid), None
            try:
                reply = _reply_ok(rid_json, await self.state.dispatch(session, op, msg))
            except Exception as exc:
                reply = _reply_err(rid_json, error_from_exception(exc))
            finally:
                answer.set_result(reply or _reply_err(rid_json, _interrupted()))
            return reply
        except _Close:
            raise
        except Exception as exc:
            return _reply_err(rid_json, error_from_exception(exc))

    async def serve(self) -> None:
        """Answer messages until the client leaves or closes, or the server closes the session."""
        websocket, session = self.websocket, self.session
        await websocket.send_text(self.hello())
        heartbeat = asyncio.create_task(_heartbeat(websocket, self.state.config.heartbeat_s))
        explicit_close = False
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                raw = message.get("text")
                try:
                    reply = await self.answer(raw if raw is not None else message.get("bytes"))
                except _Close:
                    explicit_close = True
                    break
                if reply is None:
                    continue
                if session.closed:
                    break
                await websocket.send_text(reply)
        except Exception:
            if not self.closed_by_server:
                logger.debug("websocket session %s ended abruptly", session.id, exc_info=True)
        finally:
            heartbeat.cancel()
            await self._finish(explicit_close)

    async def _finish(self, explicit_close: bool) -> None:
        manager, session = self.state.manager, self.session
        if explicit_close:
            await manager.close(session.id, reason="client closed")
            with contextlib.suppress(Exception):
                await self.websocket.close()
        elif not session.closed:
            manager.detach(session, owner=self.websocket)


@router.websocket(WS_PATH)
async def ws_session(websocket: WebSocket, state: EnvState) -> None:
    await websocket.accept()
    connection = WsSession(websocket, state)
    if await connection.open():
        await connection.serve()
