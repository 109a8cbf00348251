"""The FastAPI application: ``create_app(settings)``.

The lifespan builds and starts the :class:`service.container.Container` — the composition root: store,
index, prompt service, job queue and the services (the app starts even if the model fails to load,
answering 503 where a model is needed) — and stops it on shutdown. One router per resource under
``/v1``; every error is rendered as ``{"code", "message", "detail"}`` (:mod:`service.errors`); request
bodies are size-limited while they stream (:class:`service.body_limit.BodyLimitMiddleware`); request
latency goes to the app's own Prometheus registry.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atlas.settings import Settings, get_settings
from service.auth import check_origins_allowed
from service.body_limit import ENVELOPE_BYTES, BodyLimit, BodyLimitMiddleware, BufferedBytes
from service.container import Container
from service.dashboard import mount_dashboard
from service.errors import install_error_handlers, template_of, unexpected_error
from service.head_requests import HeadAsGetMiddleware
from service.metrics import Metrics
from service.request_ids import RequestIdMiddleware
from service.routes import fit, health, jobs, keys, query, spaces, tasks
from service.schemas import SamplesAppend, TaskCreate
from service.security import SecurityMiddleware, document_security_responses, serve_docs_offline

API_DESCRIPTION = """
FisherAtlas is a **task-signature vector database**. Upload a task (texts, or prompt/completion pairs);
a worker streams it through a causal LM and FisherSketch into a 16 KiB signature of its head-gradient
Fisher geometry. Then ask:

* **routing** — which stored task does this prompt belong to (`POST /v1/route`, open set: `none`);
* **source recommendation** — which task to fine-tune on for a target (`GET /v1/tasks/{id}/sources`);
* **alignment** — how aligned are two tasks, and why (`GET /v1/align`, `POST /v1/align/matrix`);
* **atlas** — a 2-D map of a space (`GET /v1/atlas`).

Authentication: `X-API-Key: <key>` (or `Authorization: Bearer <key>`), scopes `read` ⊂ `write` ⊂ `admin`;
required when the service is bound to a non-loopback address. Every error has the body
`{"code", "message", "detail"}`.
"""


PUBLIC_PATHS = ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc")
"""Paths answered without an API key."""


class MetricsMiddleware:
    """Pure ASGI middleware counting requests and their latency by route template: the route the router chose, else
    the request's template in the OpenAPI paths (an answer given before routing — a 401, 403, 413 or 429 of the
    security layer — was ``unmatched``, with the scanners' 404s), ``/dashboard`` or the docs' path, else
    ``unmatched`` (:func:`service.errors.template_of`)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            template = getattr(scope.get("route"), "path", None) or template_of(scope) or "unmatched"
            method = scope.get("method", "GET")
            self.metrics.requests.labels(method, template, str(status)).inc()
            self.metrics.request_seconds.labels(method, template).observe(time.perf_counter() - t0)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """OpenAPI with the JSON-variant upload bodies registered as components."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes,
                         tags=app.openapi_tags)
    document_security_responses(schema)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (TaskCreate, SamplesAppend):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in js.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components[model.__name__] = js
    schema.setdefault("components", {})["securitySchemes"] = {
        "ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        "Bearer": {"type": "http", "scheme": "bearer"},
    }
    if app.state.container.keys_required:
        schema["security"] = [{"ApiKey": []}, {"Bearer": []}]
        for path, item in schema.get("paths", {}).items():
            if path in PUBLIC_PATHS or path.startswith("/dashboard"):
                for op in item.values():
                    if isinstance(op, dict):
                        op["security"] = []
    app.openapi_schema = schema
    return schema


def create_app(settings: Settings | None = None, *, overrides: dict[str, Any] | None = None) -> FastAPI:
    """Build the FisherAtlas app.

    Parameters
    ----------
    settings
        Validated settings (default: from the environment).
    overrides
        Passed to :class:`service.container.Container` (tests: a preloaded ``lm``, ``start_runner``).

    Raises
    ------
    RuntimeError
        ``allowed_origins`` holds ``*`` while ``require_keys`` is not true
        (:func:`service.auth.check_origins_allowed`).
    """
    settings = settings or get_settings()
    check_origins_allowed(settings)  # the wildcard origin without keys required: refused before anything starts
    container = Container(settings, overrides)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(container.start)
        try:
            yield
        finally:
            await run_in_threadpool(container.stop)

    try:
        app_version = version("fisher-atlas")
    except PackageNotFoundError:
        app_version = "0.0.0"
    app = FastAPI(
        title="FisherAtlas",
        version=app_version,
        description=API_DESCRIPTION,
        lifespan=lifespan,
        openapi_tags=[
            {"name": "tasks", "description": "Upload, append, list, update and delete tasks; source recommendation."},
            {"name": "jobs", "description": "Extraction jobs: status, progress stream, cancellation."},
            {"name": "queries", "description": "Routing, alignment, matrices and the atlas map."},
            {"name": "spaces", "description": "Spaces (model + sketch spec), export and import."},
            {"name": "keys", "description": "API keys (admin)."},
            {"name": "health", "description": "Liveness, readiness, metrics."},
        ],
    )
    app.state.container = container
    app.state.settings = settings
    install_error_handlers(app)

    for module in (health, tasks, jobs, query, fit, spaces, keys):
        app.include_router(module.router)
    mount_dashboard(app)
    serve_docs_offline(app)

    app.add_middleware(HeadAsGetMiddleware)  # innermost: the router sees a GET
    app.add_middleware(
        BodyLimitMiddleware,
        limit=BodyLimit(settings.max_upload_bytes + ENVELOPE_BYTES, "max_upload_bytes", settings.max_upload_bytes),
        # JSON bodies held at once: as many whole bodies as the uploads parsed at once, and one more being read
        buffered=BufferedBytes((settings.max_concurrent_uploads + 1) * (settings.max_upload_bytes + ENVELOPE_BYTES)),
        by_route={("POST", "/v1/spaces/import"): BodyLimit(settings.max_import_bytes + ENVELOPE_BYTES,
                                                           "max_import_bytes", settings.max_import_bytes)},
    )
    app.add_middleware(SecurityMiddleware, settings=settings, container=container)
    if settings.allowed_origins:  # outside the key check: a browser's preflight carries no key
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                           allow_headers=["content-type", "x-api-key", "authorization", "idempotency-key",
                                          "last-event-id"],
                           expose_headers=["retry-after", "server-timing", "x-request-id"], max_age=600)
    app.add_middleware(MetricsMiddleware, metrics=container.metrics)
    # outermost: every answer carries its id, a refused one and a 500 too
    app.add_middleware(RequestIdMiddleware, on_error=unexpected_error)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app
