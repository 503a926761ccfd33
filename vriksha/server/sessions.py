"""Which session a request continues: its `session_id` field, else its `x-session-id` header."""

from __future__ import annotations

from starlette.requests import Request

from vriksha.server.errors import BadRequestError

SESSION_HEADER = "x-session-id"
MAX_SESSION_ID = 256


def session_of(field: str | None, request: Request) -> str | None:
    if field is not None:
        return field
    header = request.headers.get(SESSION_HEADER)
    if header is None:
        return None
    if not header or len(header) > MAX_SESSION_ID:
        raise BadRequestError(
            f"the {SESSION_HEADER} header must be 1 to {MAX_SESSION_ID} characters", param=SESSION_HEADER
        )
    return header
