"""Request gatekeeping in front of every route: Host allow-list, Origin check, API key, rate limit.

:class:`SecurityMiddleware` (pure ASGI, so nothing of the body is read before it decides):

1. **Host** (DNS rebinding): on a loopback bind — or wherever ``settings.allowed_hosts`` is set — the
   ``Host`` header must name localhost, a loopback IP, the configured ``host``, the address the client
   connected to, or an entry of ``allowed_hosts`` (``*``: any). Else 403 ``forbidden_host``. On a
   public bind keys are required, so a rebound name gains nothing (Jupyter's ``allow_remote_access``).
2. **Origin** (cross-site requests): ``POST``/``PUT``/``PATCH``/``DELETE`` carrying an ``Origin`` that is
   neither this service's own origin (the ``Host`` the browser used, under ``http`` or ``https``: behind a
   TLS-terminating proxy the page is ``https`` while this server sees ``http``) nor in ``allowed_origins`` — or
   ``Sec-Fetch-Site: cross-site`` — get 403 ``forbidden_origin`` (Jupyter's ``check_origin``). Clients
   that are not browsers send no ``Origin`` and pass.
3. **API key** on ``/v1/...`` when :meth:`service.auth.KeyGate.required` says so (a request carrying a proxy
   header counts as coming from outside: :func:`service.auth.is_proxied`): checked before the body is read
   (401 ``unauthorized``); the route checks its scope.
4. **Rate limit** on ``/v1/...``: a token bucket per key, or per client address when anonymous or when the key
   check failed (``rate_limit_per_s``, ``rate_limit_burst``); empty → 429 ``rate_limited`` with ``Retry-After``.
   The public paths that do work (``/readyz`` probes the database and the model on two threads of its own,
   ``/metrics`` renders the registry) are limited per client address too, so one client flooding them cannot
   turn another's readiness probe into "timed out"; ``/healthz`` touches nothing and is not limited.

Every refusal is the usual ``{"code", "message", "detail"}`` body and stores nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from atlas.errors import AtlasError, Unauthorized
from atlas.redaction import truncate
from atlas.settings import Settings
from service.auth import (
    ANONYMOUS,
    PRINCIPAL_STATE,
    KeyGate,
    forget_listening,
    is_loopback,
    is_proxied,
    key_gate,
    listening_publicly,
    presented_key,
)
from service.errors import database_busy_or_down, error_response
from service.schemas import RETRY_AFTER

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "127.0.0.1", "::1"})


class TokenBucket:
    """Token buckets per client: ``rate`` tokens per second up to ``burst``; LRU-bounded in clients.

    A small class rather than a library: the answer needs the exact wait until the next token
    (``Retry-After``), which this computes in one line.
    """

    def __init__(self, rate: float, burst: int, max_clients: int = 10_000) -> None:
        self.rate = float(rate)
        self.burst = float(burst)
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, client: str, now: float | None = None) -> float:
        """Take one token for ``client``; return 0 when allowed, else the seconds until a token is free."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                wait, tokens = 0.0, tokens - 1.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[client] = (tokens, now)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return wait


def _host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8000`` → ``::1``), lower-case."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _origin_of(scheme: str, host_header: str) -> str:
    """``scheme://host[:port]`` as a browser writes the origin of a page served under ``host_header``."""
    default = {"http": "80", "https": "443"}.get(scheme)
    host = host_header.strip().lower()
    if default and host.endswith(f":{default}"):
        host = host[: -len(default) - 1]
    return f"{scheme}://{host}"


def _normal_origin(origin: str) -> str:
    """An origin as compared: lower-case, default port dropped; an unparsable one (``http://[::1``) as written,
    so that it matches nothing but itself (a refusal, never a server error)."""
    text = origin.strip().lower()
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    return _origin_of(parts.scheme, parts.netloc) if parts.scheme and parts.netloc else text


class SecurityMiddleware:
    """See the module docstring.

    Parameters
    ----------
    app : ASGIApp
    settings : Settings
    container : service.container.Container
        Gives the store once started (keys are looked up in it).
    """

    def __init__(self, app: ASGIApp, settings: Settings, container: Any) -> None:
        self.app = app
        self.settings = settings
        self.container = container
        forget_listening()  # a port this process served before may be bound otherwise now
        self.allowed_hosts = {h.strip().lower() for h in settings.allowed_hosts if h.strip()}
        self.allowed_origins = {_normal_origin(o) for o in settings.allowed_origins if o.strip()}
        self.local_hosts = set(LOCAL_NAMES) | {settings.host.strip().lower()}
        self.bucket = TokenBucket(settings.rate_limit_per_s, settings.rate_limit_burst) \
            if settings.rate_limit_per_s > 0 else None
        self._gate: KeyGate | None = None

    @property
    def gate(self) -> KeyGate:
        """The key gate over the started container's store (the container's one: :func:`service.auth.key_gate`)."""
        if self._gate is None:
            self._gate = key_gate(self.container)
            assert self._gate is not None, "the container is not started"
        return self._gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        server = scope.get("server")
        try:
            public = listening_publicly(server)
            self._check_host(headers, server, public)
            self._check_origin(scope, headers)
            path = route_path(scope)
            if path.startswith("/v1/") or path == "/v1":
                try:
                    principal = await self._authenticate(headers, server, is_proxied(headers))
                except Unauthorized:
                    self._rate_limit(None, scope)  # a failed try spends the address's tokens (429 once gone)
                    raise
                # ANONYMOUS: the gate ran and asked for no key (authorize() must not decide again)
                scope.setdefault("state", {})[PRINCIPAL_STATE] = principal if principal is not None else ANONYMOUS
                self._rate_limit(principal, scope)
            elif path in RATE_LIMITED_PUBLIC_PATHS:
                self._rate_limit(None, scope)
        except AtlasError as exc:
            await _render(exc, scope, receive, send)
            return
        except Exception as exc:
            if (retry := database_busy_or_down(exc)) is None:
                raise
            await _render(retry, scope, receive, send)
            return
        await self.app(scope, receive, send)

    # -- checks ----------------------------------------------------------------------------------

    def _check_host(self, headers: Headers, server: Any, public: bool) -> None:
        if "*" in self.allowed_hosts or (public and not self.allowed_hosts):
            return
        host = _host_name(headers.get("host", ""))
        connected = str(server[0]).lower() if server else ""
        if host in self.local_hosts or host in self.allowed_hosts or host == connected or is_loopback(host):
            return
        raise _Refused(403, "forbidden_host",
                       f"Host {truncate(host, 100)!r} is not served here; add it to FISHER_ATLAS_ALLOWED_HOSTS",
                       {"host": truncate(host, 100)})

    def _check_origin(self, scope: Scope, headers: Headers) -> None:
        if scope.get("method", "GET").upper() not in STATE_CHANGING or "*" in self.allowed_origins:
            return
        origin = headers.get("origin")
        if origin is None:
            if headers.get("sec-fetch-site", "").lower() == "cross-site":
                raise _Refused(403, "forbidden_origin", "cross-site requests may not change state", None)
            return
        host = headers.get("host", "")
        own = (_origin_of("http", host), _origin_of("https", host))  # the same host is the same server
        if _normal_origin(origin) in (*own, *self.allowed_origins):
            return
        raise _Refused(403, "forbidden_origin",
                       f"requests from origin {truncate(origin, 100)!r} may not change state; "
                       "add it to FISHER_ATLAS_ALLOWED_ORIGINS", {"origin": truncate(origin, 100)})

    async def _authenticate(self, headers: Headers, server: Any, proxied: bool) -> Any:
        if self.container.store is None:
            return None
        gate = self.gate
        required = gate.required_without_io(server, proxied)
        if required is None:
            required = await anyio.to_thread.run_sync(gate.required, server, proxied)
        if not required:
            return None
        return await anyio.to_thread.run_sync(gate.authenticate, presented_key(headers), proxied)

    def _rate_limit(self, principal: Any, scope: Scope) -> None:
        if self.bucket is None:
            return
        if principal is not None and principal.key_id is not None:
            client = f"key:{principal.key_id}"
        else:
            client = f"addr:{(scope.get('client') or ('?',))[0]}"
        wait = self.bucket.take(client)
        if wait > 0:
            raise _Refused(429, "rate_limited",
                           f"rate limit of {self.settings.rate_limit_per_s:g} requests/s exceeded; retry later",
                           {"retry_after_s": round(wait, 3)}, retry_after_s=wait)


RATE_LIMITED_PUBLIC_PATHS = frozenset({"/readyz", "/metrics"})
"""Paths answered without a key that are rate-limited per client address (they do work)."""


def route_path(scope: Scope) -> str:
    """The path the app routes on: ``scope["path"]`` without the ``root_path`` an ASGI server put in front of it
    (``uvicorn --root-path /api`` sends ``/api/v1/tasks``, which Starlette routes as ``/v1/tasks``).

    The same rule as Starlette's router, character for character: the root is cut only where a ``/`` follows
    it, and a root's trailing ``/`` is kept as written (``--root-path /api/`` sends ``/api//v1/keys``, routed as
    ``/v1/keys``). Any other rule lets a path reach a route unchecked.
    """
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "") or ""
    if not root or not path.startswith(root):
        return path
    if path == root:
        return "/"
    return path[len(root):] if path[len(root)] == "/" else path


class _Refused(AtlasError):
    """A refusal of the middleware with its own status and code."""

    def __init__(self, status: int, code: str, message: str, detail: Any, *, retry_after_s: float | None = None):
        super().__init__(message, detail, retry_after_s=retry_after_s)
        self.status_code = status
        self.code = code


async def _render(exc: AtlasError, scope: Scope, receive: Receive, send: Send) -> None:
    """Send a domain error from the middleware, as the handlers render it (:func:`service.errors.error_response`)."""
    await error_response(exc)(scope, receive, send)


# --------------------------------------------------------------------------------------------------
# OpenAPI: the refusals every /v1 route can answer
# --------------------------------------------------------------------------------------------------

REFUSALS = {
    401: "No valid API key (required on public binds and once any key exists).",
    403: "Foreign Origin on a state-changing request, Host not allowed, or the key lacks the scope.",
    429: "Rate limit of this key or client exceeded, or the queue is full; see Retry-After.",
    503: "The database cannot be reached or is busy (locked or out of connections), or no model serves the space; "
         "see Retry-After.",
}


TOO_LARGE = "The request body exceeds the service's limit for it (see the message)."
NOT_JSON = "The body is not declared as JSON (Content-Type: application/json)."


def document_security_responses(schema: dict[str, Any]) -> None:
    """Add the middleware's refusals (401, 403, 429, 503; 413 where a body is taken, 415 where it must be JSON) to
    every ``/v1`` operation of an OpenAPI ``schema``, and give every 422 the service's error body (its handler
    renders FastAPI's validation errors as one; two operations said ``HTTPValidationError``).

    Works on the generated document, not on the route objects: FastAPI ≥ 0.165 keeps included routers
    lazily (``app.routes`` no longer lists their ``APIRoute`` objects), and the document is what clients
    and schemathesis read.
    """
    error_body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for path, item in schema.get("paths", {}).items():
        if not path.startswith("/v1"):
            continue
        for operation in item.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            for status, text in REFUSALS.items():
                responses.setdefault(str(status), {"description": text, "content": error_body})
                if status in (429, 503):
                    responses[str(status)].setdefault("headers", RETRY_AFTER)
            if "requestBody" in operation:  # the body limit answers before any route
                responses.setdefault("413", {"description": TOO_LARGE, "content": error_body})
                if set(operation["requestBody"].get("content", {})) == {"application/json"}:
                    responses.setdefault("415", {"description": NOT_JSON, "content": error_body})
            if "422" in responses:
                responses["422"]["content"] = error_body
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):  # referenced by nothing now
        if f'"#/components/schemas/{unused}"' not in json.dumps(schema):
            components.pop(unused, None)


# --------------------------------------------------------------------------------------------------
# /docs without a CDN
# --------------------------------------------------------------------------------------------------

DOCS_ASSETS = "/docs-assets"


def serve_docs_offline(app: Any) -> None:
    """Serve ``/docs`` (Swagger UI 5) and ``/redoc`` from files shipped in the ``fastapi-offline`` package.

    FastAPI's own pages load their scripts from a CDN (blank offline); these are the same pages
    pointing at ``/docs-assets/...``. Without the package the CDN pages stay.
    """
    try:
        import fastapi_offline
    except ImportError:
        return
    from pathlib import Path

    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from starlette.routing import Route
    from starlette.staticfiles import StaticFiles

    static = Path(fastapi_offline.__file__).resolve().parent / "static"
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in ("/docs", "/redoc")]
    title = app.title

    def unframed(page: Any) -> Any:
        """A docs page no other site may frame (its "Try it out" sends same-origin requests: clickjacking)."""
        page.headers["X-Frame-Options"] = "DENY"
        page.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
        return page

    async def docs(_: Any) -> Any:
        return unframed(get_swagger_ui_html(
            openapi_url=app.openapi_url, title=f"{title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
        ))

    async def redoc(_: Any) -> Any:
        return unframed(get_redoc_html(openapi_url=app.openapi_url, title=f"{title} - ReDoc",
                                       redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
                                       redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png", with_google_fonts=False))

    app.router.routes.append(Route("/docs", docs, methods=["GET", "HEAD"], include_in_schema=False))
    app.router.routes.append(Route("/redoc", redoc, methods=["GET", "HEAD"], include_in_schema=False))
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(static)), name="docs-assets")
