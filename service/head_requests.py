"""``HEAD`` wherever ``GET`` is served (RFC 9110, 9.3.2): the ``GET`` answer's status and headers without its body.

FastAPI's routes take the methods they name, so ``HEAD /healthz`` and every ``HEAD /v1/...`` answered 405 while the
docs and the dashboard, Starlette routes, answered 200; load balancers and probes that send ``HEAD`` saw a service
that refused them (an API fuzz, 2026-12-07).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGetMiddleware:
    """Pure ASGI middleware: a ``HEAD`` request runs as a ``GET`` and its answer's body is left out. The body ends at
    its first part, so a stream (a job's progress events) ends there too: the server then tells the app the client has
    gone."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def without_body(message: Message) -> None:
            nonlocal ended
            if ended:
                return
            if message["type"] == "http.response.body":
                ended = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)
