"""Liveness, readiness and Prometheus metrics (no API key needed)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from service.deps import ContainerDep
from service.schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness")
def healthz() -> Health:
    """The process is up and serving HTTP."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("fisher-atlas")
    except PackageNotFoundError:
        v = None
    return Health(status="ok", version=v)


@router.get(
    "/readyz", response_model=Readiness, summary="Readiness",
    responses={503: {"model": Readiness, "description": "Not ready (e.g. the model is not loaded)."}},
)
async def readyz(c: ContainerDep) -> JSONResponse:
    """Ready when the database answers, the model is loaded and the index is open (else 503)."""
    ready, checks, detail = await run_in_threadpool(c.readiness)
    body = Readiness(ready=ready, checks=checks, detail=detail).model_dump(mode="json")
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics", summary="Prometheus metrics", response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                     "description": "Prometheus text exposition format."}},
)
async def metrics(c: ContainerDep) -> Response:
    """Job durations, tokens/s, queue depth, search latency, request latency."""
    data = await run_in_threadpool(generate_latest, c.metrics.registry)
    return Response(content=data, media_type=CONTENT_TYPE_LATEST)
