"""Liveness, readiness and Prometheus metrics (no API key needed).

``/healthz`` and ``/readyz`` are ``async`` and never wait on the request thread pool or the connection
pool: ``/healthz`` touches nothing; ``/readyz`` runs its probes on two threads of its own, each bounded
by :data:`PROBE_TIMEOUT_S`, so both answer within about a second even while the database is locked
(``/readyz`` then says the database is not ready). Readiness details carry no file paths.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from atlas.db import probe_write_lock
from atlas.redaction import redact_paths, redact_secrets, truncate
from service.deps import ContainerDep
from service.schemas import ErrorBody, Health, Readiness

router = APIRouter(tags=["health"])

PROBE_TIMEOUT_S = 1.0
"""Longest wait for one readiness probe."""

_PROBES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="readyz")
_MODEL_PROBES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="readyz-model")
"""The model probe's own thread: a stalled Redis holds a registry read for up to its socket timeout times its
retries; on the shared threads, a few probes in a row then left none for the database's."""

try:
    _VERSION: str | None = version("fisher-atlas")
except PackageNotFoundError:
    _VERSION = None


FORBIDDEN_HOST: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorBody, "description": "The request's Host is not one this service answers to "
                                             "(`forbidden_host`)."}}
PUBLIC_ERRORS: dict[int | str, dict[str, Any]] = {
    **FORBIDDEN_HOST,
    429: {"model": ErrorBody, "description": "Too many requests from this client (`rate_limited`, with Retry-After)."},
}
"""What the security middleware answers on the key-free, rate-limited paths too (missing from the schema)."""


@router.get("/healthz", response_model=Health, summary="Liveness", responses=FORBIDDEN_HOST)
async def healthz() -> Health:
    """The process is up and serving HTTP (touches neither the database nor a thread)."""
    return Health(status="ok", version=_VERSION)


async def _probe(fn: Any, *args: Any, threads: ThreadPoolExecutor = _PROBES) -> tuple[bool, Any]:
    """Run ``fn`` on the probe threads; ``(False, "timed out")`` after :data:`PROBE_TIMEOUT_S`."""
    loop = asyncio.get_running_loop()
    try:
        return True, await asyncio.wait_for(loop.run_in_executor(threads, fn, *args), PROBE_TIMEOUT_S)
    except TimeoutError:
        return False, "timed out"
    except Exception as exc:
        return False, type(exc).__name__


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return truncate(redact_paths(redact_secrets(value)), 300)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


@router.get(
    "/readyz", response_model=Readiness, summary="Readiness",
    responses={503: {"model": Readiness, "description": "Not ready (the model is not loaded, the database is "
                                                         "locked or unreachable)."}, **PUBLIC_ERRORS},
)
async def readyz(c: ContainerDep) -> JSONResponse:
    """Ready when the database answers and can take a write, the model (or a worker) serves the default space
    and the index is open. The database and the model are probed at once, each on its own thread and bound, so
    a slow part is named as such (Redis down reads "model", not "database")."""
    (db_done, db), (model_done, model) = await asyncio.gather(_probe(c.database_ready),
                                                              _probe(c.model_ready, threads=_MODEL_PROBES))
    checks = {"database": db_done and db[0], "model": model_done and model[0], "index": c.index is not None}
    detail: dict[str, Any] = {}
    if not checks["database"]:
        detail["database"] = db[1] if db_done else db
    if model_done:
        detail["model"] = model[1]
    else:
        detail["model"] = f"{model} (the worker registry did not answer)" if c.lm is None else model
    if checks["database"]:
        done, reason = await _probe(probe_write_lock, c.settings.resolved_database_url(), PROBE_TIMEOUT_S / 2)
        if not done or reason is not None:
            checks["database"] = False
            detail["database"] = reason if done else "timed out"
    ready = all(checks.values())
    body = Readiness(ready=ready, checks=checks, detail=_clean(detail)).model_dump(mode="json")
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics", summary="Prometheus metrics", response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                     "description": "Prometheus text exposition format."}, **PUBLIC_ERRORS},
)
async def metrics(c: ContainerDep) -> Response:
    """Job durations, tokens/s, queue depth, search latency, request latency."""
    data = await run_in_threadpool(generate_latest, c.metrics.registry)
    return Response(content=data, media_type=CONTENT_TYPE_LATEST)
