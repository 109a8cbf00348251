"""Request ids: each HTTP request gets one (a sane ``X-Request-ID`` it came with, else a new one), answered in its
``X-Request-ID`` header and written at the end of its access-log line, so a client's failed call and the log's line
of it can be matched (neither carried an id: an operations review, 2026-12-07)."""

from __future__ import annotations

import contextvars
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("fisher_atlas_request_id", default="-")
"""The id of the request being served in this context (``-`` outside one: a job's thread, the startup)."""
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
"""An incoming id that is kept: short, and nothing a log line or a header could be forged with."""


class RequestIdMiddleware:
    """Pure ASGI middleware: the request's id into :data:`REQUEST_ID` and the answer's ``X-Request-ID`` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _SANE.fullmatch(given) else uuid.uuid4().hex[:16]
        token = REQUEST_ID.set(rid)

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        # An error escaping the app keeps the id set: Starlette renders the 500 and uvicorn logs it outside this
        # middleware, in this request's context (its own task's), and both name the id (neither did).
        await self.app(scope, receive, with_id)
        REQUEST_ID.reset(token)
