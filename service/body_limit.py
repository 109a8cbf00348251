"""The request-body cap of every request (:class:`BodyLimitMiddleware`): a declared ``Content-Length`` above the upload
limit (plus a small allowance for the multipart envelope) is refused at once with 413, and an undeclared (chunked)
body is counted as it arrives and cut off with 413 as soon as it crosses the limit — a 10 GB upload is never read
into memory or onto disk."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import DomainErrorInBody, error_response
from service.security import route_path
from service.upload_slots import UploadsBusy

ENVELOPE_BYTES = 256 * 1024
"""Allowance above ``max_upload_bytes`` for multipart headers and form fields."""


@dataclass(frozen=True)
class BodyLimit:
    """A cap on request bodies.

    Attributes
    ----------
    max_bytes : int
        The cap enforced: the setting's value plus the multipart envelope (:data:`ENVELOPE_BYTES`).
    setting : str
        The setting that sets it (named in the 413).
    setting_value : int or None
        The setting's own value, reported in the 413 (default: ``max_bytes``).
    """

    max_bytes: int
    setting: str = "max_upload_bytes"
    setting_value: int | None = None

    @property
    def reported(self) -> int:
        """The value of the setting the 413 reports (what the operator configured)."""
        return self.max_bytes if self.setting_value is None else self.setting_value

    def message(self) -> str:
        """The 413 message naming the setting and its value."""
        what = "upload" if self.setting == "max_upload_bytes" else "import"
        return f"the request body exceeds the {what} limit of {self.reported} bytes (setting {self.setting})"


class _BodyTooLarge(HTTPException):
    def __init__(self, cap: BodyLimit) -> None:
        super().__init__(413, cap.message())


class BufferedBytes:
    """The bytes of JSON request bodies (read whole into memory by the app, unlike multipart files, which are spooled
    to disk) held at once by this process, against a budget: a route or ``fit`` body of up to ``max_upload_bytes`` is
    read whole before it waits for a parse slot, so bodies waiting were bounded by nothing but connections (a
    review, 2026-12-07)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Count ``n`` more bytes, unless that passes the budget (then nothing is counted)."""
        with self._lock:
            if self.held + n > self.max_bytes:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        """Give back ``n`` bytes."""
        with self._lock:
            self.held -= n


class _BudgetSpent(DomainErrorInBody):
    """Raised from the body's read: an exception there that is not an HTTP one became FastAPI's 400 "error parsing
    the body" (a 422), not the 503."""

    def __init__(self) -> None:
        super().__init__(UploadsBusy("the service holds as many large request bodies as it reads at once; retry "
                                     "shortly", None))


LARGE_BODY_BYTES = 1024 * 1024
"""A request body above this (or one of no declared length) holds an upload slot while it is parsed
(:func:`service.uploads.large_body`), and a JSON one counts against :class:`BufferedBytes` once it is past it: a
prompt's body never does, so slow senders holding the budget cannot refuse everyone's routes."""


class BodyLimitMiddleware:
    """Pure ASGI middleware refusing request bodies above their limit (413) without buffering them.

    ``limit`` applies to every request but those named in ``by_route`` (``(method, path)`` → its own limit:
    a space import is an export of whole tasks, far larger than any sample upload). The path is the one the
    app routes on (:func:`service.security.route_path`: without the ``root_path`` of ``--root-path``). With
    ``buffered``, a JSON body (or one of no declared type) past :data:`LARGE_BODY_BYTES` is counted against that budget
    until its request is answered; one that would pass it is refused with 503 ``uploads_busy`` and ``Retry-After``,
    nothing done."""

    def __init__(self, app: ASGIApp, limit: BodyLimit,
                 by_route: Mapping[tuple[str, str], BodyLimit] | None = None,
                 buffered: BufferedBytes | None = None) -> None:
        self.app = app
        self.limit = limit
        self.by_route = dict(by_route or {})
        self.buffered = buffered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.by_route.get((scope.get("method", ""), route_path(scope)), self.limit)
        declared, expects_continue, ctype = None, False, b""
        for key, value in scope.get("headers", []):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
            elif key == b"expect" and value.lower() == b"100-continue":
                expects_continue = True
            elif key == b"content-type":
                ctype = value.split(b";")[0].strip().lower()
        if declared is not None and declared > cap.max_bytes:
            # A client waiting for "100 Continue" has not sent its body: refuse it unread (reading would invite it).
            if declared <= cap.max_bytes + DRAIN_BYTES and not expects_continue:
                await _drain(receive, DRAIN_BYTES + cap.max_bytes)
            await _send_413(send, cap, declared)
            return
        received = counted = 0
        limit = cap.max_bytes
        started = False
        budget = self.buffered if ctype in (b"", b"application/json") or ctype.endswith(b"+json") else None

        async def counting_receive() -> Message:
            nonlocal received, counted
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                received += size
                if received > limit:
                    raise _BodyTooLarge(cap)
                if budget is not None and received > LARGE_BODY_BYTES:  # small bodies never wait or fail here
                    if not budget.take(received - counted):
                        raise _BudgetSpent
                    counted = received
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:  # the body is flowing (a "100 Continue" was sent, if asked): read it off first
                await _drain(receive, DRAIN_BYTES)
                await _send_413(send, cap, None)
        except _BudgetSpent as exc:  # raised past the app's handlers (a body read outside a route)
            if not started:
                await _drain(receive, DRAIN_BYTES)
                await error_response(exc.error)(scope, receive, send)
        finally:
            if budget is not None and counted:
                budget.give(counted)


DRAIN_BYTES = 256 * 1024 * 1024
"""Most bytes of a refused body read (and dropped) before the 413 is sent. An HTTP/1.1 client sends its whole body
before it reads the answer: refused unread, its upload met a closed connection and the client reported the
service unreachable instead of the 413. Bodies further past the limit are refused unread."""


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a request body, at most ``budget`` bytes (one chunk at a time)."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _send_413(send: Send, cap: BodyLimit, declared: int | None) -> None:
    body = json.dumps({
        "code": "payload_too_large",
        "message": cap.message(),
        "detail": {cap.setting: cap.reported, "content_length": declared},
    }).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})

