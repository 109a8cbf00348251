"""One error body for every failure: ``{"code", "message", "detail"}``.

Domain errors (:class:`atlas.errors.AtlasError`) carry their HTTP status and code; FastAPI's
request validation errors become ``422 invalid_input``; Starlette's HTTP errors (unknown route,
wrong method) keep their status with a code derived from it; anything unexpected is logged and
rendered as ``500 internal_error`` without leaking internals.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from atlas.db import is_busy_error, is_unreachable_error, storage_fault
from atlas.errors import (
    AtlasError,
    DatabaseBusy,
    DatabaseUnavailable,
    IncompatibleSpace,
    InvalidInput,
    ResourcesExhausted,
    StorageFull,
)
from atlas.redaction import bounded, redact_cut, truncate
from fishersketch import CorruptState, SketchError, SpecMismatch
from service.logs import install_log_redaction
from service.request_ids import REQUEST_ID

logger = logging.getLogger("fisher_atlas.service")

_CODES_BY_STATUS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    411: "length_required",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "too_many_requests",  # a domain error says which (queue_full, uploads_busy, ...): these are the framework's
    503: "service_unavailable",
}


def error_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    """Build the error body shared by every endpoint."""
    return {"code": code, "message": message, "detail": detail}


def _json_safe(value: Any) -> Any:
    """Make validation-error context JSON-serialisable (exceptions, bytes, ...)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        item = {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        out.append(_json_safe(item))
    return out


MAX_MESSAGE_CHARS = 1000
"""Longest message in an error body (huge inputs are never echoed whole)."""


MAX_DETAIL_CHARS = 8000
"""Largest serialised detail; a larger one is sent as its truncated JSON text."""


def safe_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    """:func:`error_body` with secrets masked and sizes bounded: message 1000 characters; detail strings
    300, 20 items per list or dict, nesting depth 4, and 8000 characters in all."""
    small = _encodable(bounded(detail))
    text = json.dumps(small, default=str)
    if len(text) > MAX_DETAIL_CHARS:
        small = truncate(text, MAX_DETAIL_CHARS)
    return error_body(code, _encodable(redact_cut(str(message), MAX_MESSAGE_CHARS)), small)


def _encodable(value: Any) -> Any:
    """``value`` with every string made UTF-8-encodable: a lone surrogate an input carried into a message or detail
    (a ``fit`` label naming no task) is written as its escape, ``\\ud800`` (rendering it raised, a 500)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(v) for v in value]
    return value


def error_response(exc: AtlasError) -> JSONResponse:
    """A domain error as its response: its status and body, with ``Retry-After`` on a 429, 503 or 507 and
    ``WWW-Authenticate`` on a 401 — what the handlers and the security middleware (before any route) both send."""
    headers = None
    if exc.status_code in (429, 503, 507):
        wait = exc.retry_after_s if exc.retry_after_s is not None else 1.0
        headers = {"Retry-After": str(max(1, math.ceil(wait)))}
    if exc.status_code == 401:
        headers = {"WWW-Authenticate": 'ApiKey header="X-API-Key"'}
    return JSONResponse(safe_body(exc.code, exc.message, exc.detail), status_code=exc.status_code, headers=headers)


async def _atlas_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AtlasError)
    return error_response(exc)


async def _sketch_error(request: Request, exc: Exception) -> JSONResponse:
    """Render algorithm errors that escaped the domain checks: a spec mismatch is ``incompatible_space``."""
    if isinstance(exc, SpecMismatch):
        return await _atlas_error(request, IncompatibleSpace(str(exc)))
    if isinstance(exc, CorruptState):  # stored data, not the request: a real server error
        return await unexpected_error(request, exc)
    return await _atlas_error(request, InvalidInput(str(exc)))


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail = _validation_detail(exc)
    first = detail[0] if detail else {}
    loc = ".".join(str(p) for p in first.get("loc", []))
    said = str(first.get("msg", "")).removeprefix("Value error, ")  # pydantic's prefix of our own validators' text
    message = f"invalid request: {loc}: {said}" if first else "invalid request"
    if first.get("loc") == ["path", "task_id"] and first.get("type") == "int_parsing":  # a name where an id goes
        message += " (a task's numeric id; find one by name with GET /v1/tasks?name=..., or the client's find_task)"
    return JSONResponse(safe_body("invalid_input", message, detail), status_code=422)


class DomainErrorInBody(StarletteHTTPException):
    """A domain error raised while FastAPI parses a request's body, which turns any other exception there into
    "There was an error parsing the body" (400): carried through as an HTTP exception, rendered as the domain error
    itself (an upload slot's 503 ``uploads_busy`` with its Retry-After)."""

    def __init__(self, error: AtlasError) -> None:
        super().__init__(error.status_code, error.message)
        self.error = error


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, DomainErrorInBody):
        return error_response(exc.error)
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 400 and (mapped := os_error(exc.__cause__)) is not None:  # the server's fault, not the body's
        logger.warning("%s on %s %s while reading the body: %s", mapped.code, request.method, request.url.path,
                       exc.__cause__)
        return error_response(mapped)
    if status == 400:  # FastAPI's "error parsing the body": malformed input, rendered as such
        status = 422
    code = _CODES_BY_STATUS.get(status, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    headers = exc.headers
    if status == 405 and (allowed := _allowed_methods(request)):
        headers = {**(headers or {}), "Allow": allowed}
    return JSONResponse(safe_body(code, message, None), status_code=status, headers=headers)


def _allowed_methods(request: Request) -> str | None:
    """Every method the OpenAPI document gives the request's path: Starlette's 405 named those of the first route
    matching the path alone (``OPTIONS /v1/tasks`` said ``Allow: POST``, its GET left out: an API review, 2026-12-07).
    ``None`` for a path the document does not hold."""
    path = _app_path(request.scope)
    methods = set().union(*(m for regex, _, m in path_templates(request.app) if regex.match(path)))  # (no HEAD)
    return ", ".join(sorted(methods)) or None


def path_templates(app: Any) -> list[tuple[re.Pattern[str], str, set[str]]]:
    """The OpenAPI document's paths: each one's compiled pattern, its template and its methods (cached on the app)."""
    from starlette.routing import compile_path

    templates = getattr(app.state, "method_templates", None)
    if templates is None:
        templates = [(compile_path(path)[0], path, {m.upper() for m in item if m in _HTTP_METHODS})
                     for path, item in app.openapi().get("paths", {}).items()]
        app.state.method_templates = templates
    return templates


def _app_path(scope: Any) -> str:
    """The request's path below the app's root (a mount's own root, which routing writes into the scope, ignored)."""
    path, root = scope.get("path", ""), scope.get("app_root_path", scope.get("root_path", ""))
    return str(path[len(root):] if root and path.startswith(root) else path)


def template_of(scope: Any) -> str | None:
    """The route template of a request that reached no route (answered before routing: a 401, 403, 413 or 429 of the
    security layer), from the OpenAPI paths; the dashboard's and the docs' own paths; ``None`` for any other path."""
    app, path = scope.get("app"), _app_path(scope)
    if app is not None and hasattr(app, "openapi"):
        method = str(scope.get("method", "GET")).upper()
        matching = [(t, m) for regex, t, m in path_templates(app) if regex.match(path)]
        for template, methods in matching:  # the one of the request's method, else any (a 405)
            if method in methods:
                return template
        if matching:
            return matching[0][0]
    if path == "/dashboard" or path.startswith("/dashboard/"):
        return "/dashboard"
    return path if path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect") else None


_HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def is_retryable(exc: BaseException) -> bool:
    """Whether the same call may succeed when retried: the database busy or out of reach (what
    :func:`_database_error` answers 503), or a domain error that answers 503 (for work outside a request's
    handler, such as an event stream's polling, which must wait rather than fail)."""
    return is_busy_error(exc) or (isinstance(exc, AtlasError) and exc.status_code == 503)


def database_busy_or_down(exc: BaseException) -> AtlasError | None:
    """The 503 of a database error a retry may cure (``None`` for any other): unreachable (down or restarting:
    "busy" would mislead an operator) or busy (locked, pool exhausted, a lock or statement timeout). Shared by the
    handlers and the key gate, which reads the database before any route."""
    if is_busy_error(exc) and is_unreachable_error(exc):
        return DatabaseUnavailable("the database cannot be reached; retry shortly", None, retry_after_s=2.0)
    if is_busy_error(exc):
        return DatabaseBusy("the database is busy; retry shortly", None)
    return None


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """A locked database, an exhausted pool or an unreachable server: 503 with Retry-After, never 500."""
    if (retry := database_busy_or_down(exc)) is not None:
        what = "unreachable" if isinstance(retry, DatabaseUnavailable) else "busy"
        logger.warning("database %s on %s %s: %s", what, request.method, request.url.path, type(exc).__name__)
        return await _atlas_error(request, retry)
    fault = storage_fault(exc)
    if fault is not None and near_open_file_limit():  # SQLite's "unable to open database file": out of descriptors
        logger.warning("too many open files on %s %s: %s", request.method, request.url.path, fault)
        return await _atlas_error(request, ResourcesExhausted(
            "the server has too many open files right now; retry shortly", None))
    if fault is not None:  # a retry cannot cure it before an operator does: 60 s
        logger.error("database storage fault on %s %s: %s", request.method, request.url.path, fault)
        return await _atlas_error(request, DatabaseUnavailable(
            f"the database cannot be written ({fault}); the operator must make the data directory writable "
            "(permissions, free space) — nothing was stored", None, retry_after_s=60.0))
    return await unexpected_error(request, exc)


def os_error(exc: BaseException | None) -> AtlasError | None:
    """The domain error of an ``OSError`` the server can name: no space (507 :class:`StorageFull`), too many open
    files (503 :class:`ResourcesExhausted`); ``None`` for any other (a 500 or the caller's own rendering)."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull("the server has no space left for this request's data (its temporary directory, TMPDIR, "
                           "or its data directory); nothing was stored: retry later, or ask the operator to free "
                           "space", None)
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return ResourcesExhausted("the server has too many open files right now; retry shortly", None)
    return None


def near_open_file_limit(margin: int = 8) -> bool:
    """Whether this process holds within ``margin`` of its open-file limit: SQLite says "unable to open database
    file" for that too, which read as a storage fault an operator must mend (503 with Retry-After 60, a resource
    review) when it lasts a moment."""
    import psutil

    try:
        import resource  # POSIX only

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft != resource.RLIM_INFINITY and psutil.Process().num_fds() >= soft - margin
    except OSError as exc:  # counting them needs a descriptor too
        return exc.errno in (errno.EMFILE, errno.ENFILE)
    except (ImportError, psutil.Error):
        return False


async def _os_error(request: Request, exc: Exception) -> JSONResponse:
    """A full disk or too many open files: 507 / 503 naming it (a full TMPDIR answered uploads and imports 500)."""
    mapped = os_error(exc)
    if mapped is None:
        return await unexpected_error(request, exc)
    logger.warning("%s on %s %s: %s", mapped.code, request.method, request.url.path, exc)
    return error_response(mapped)


async def _client_disconnect(request: Request, exc: Exception) -> JSONResponse:
    """The client went away mid-request (nobody reads the answer): one info line, not a 500 with a traceback."""
    logger.info("client disconnected during %s %s; nothing was stored", request.method, request.url.path)
    return JSONResponse(error_body("client_disconnected", "the client closed the connection", None), status_code=400)


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A 500, logged with its traceback, naming the request's id (:class:`service.request_ids.RequestIdMiddleware`
    answers with it while the id is set; the app's last-resort handler, outside every middleware, is this too)."""
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    rid = REQUEST_ID.get()
    known = rid != "-"  # "-": outside the middleware (nothing to name)
    return JSONResponse(
        error_body("internal_error", "internal server error; see the service log" + (f" (request {rid})" if known
                                                                                      else ""), None),
        status_code=500, headers={"X-Request-ID": rid} if known else None,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that render every error as ``{"code", "message", "detail"}``."""
    app.add_exception_handler(AtlasError, _atlas_error)
    app.add_exception_handler(SketchError, _sketch_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OperationalError, _database_error)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(PoolTimeout, _database_error)
    app.add_exception_handler(ClientDisconnect, _client_disconnect)
    app.add_exception_handler(OSError, _os_error)
    app.add_exception_handler(Exception, unexpected_error)
    install_log_redaction()
