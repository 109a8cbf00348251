"""Request ids: each HTTP request gets one (a sane ``X-Request-ID`` it came with, else a new one), answered in its
``X-Request-ID`` header and written at the end of its access-log line, so a client's failed call and the log's line
of it can be matched (neither carried an id: an operations review, 2026-12-07)."""

from __future__ import annotations

import contextvars
import re
import uuid
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("fisher_atlas_request_id", default="-")
"""The id of the request being served in this context (``-`` outside one: a job's thread, the startup)."""
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
"""An incoming id that is kept: short, and nothing a log line or a header could be forged with."""


class RequestIdMiddleware:
    """Pure ASGI middleware: the request's id into :data:`REQUEST_ID` and the answer's ``X-Request-ID`` header. An
    error escaping the app is answered here by ``on_error`` (the 500 of :func:`service.errors.unexpected_error`)
    while the id is still set: Starlette rendered it outside every middleware, so neither the 500's answer nor its
    log lines named the request."""

    def __init__(self, app: ASGIApp, on_error: Callable[[Request, Exception], Awaitable[Response]] | None = None
                 ) -> None:
        self.app = app
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _SANE.fullmatch(given) else uuid.uuid4().hex[:16]
        token = REQUEST_ID.set(rid)
        started = False

        async def with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", rid.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, with_id)
        except Exception as exc:
            if started or self.on_error is None:  # an answer under way cannot become a 500
                raise
            response = await self.on_error(Request(scope, receive), exc)
            await response(scope, receive, with_id)
        finally:
            REQUEST_ID.reset(token)
