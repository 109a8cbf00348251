"""``/v1/jobs``: status, progress stream (server-sent events) and cancellation."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from service.deps import EngineDep, ReadPrincipal, WritePrincipal
from service.engine import is_final, job_view
from service.routes import MAX_ID, Limit, Offset, error_responses
from service.schemas import JobList, JobOut

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="Job id.")]

POLL_S = 0.5
"""How often the progress stream reads the job row."""
KEEPALIVE_S = 15.0
"""A comment line is sent after this long without an event (keeps proxies from closing the stream)."""


@router.get("", response_model=JobList, summary="List jobs", responses=error_responses(401, 403, 422))
def list_jobs(
    engine: EngineDep,
    _: ReadPrincipal,
    task_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    status: Annotated[Literal["queued", "running", "succeeded", "failed", "cancelled"] | None, Query()] = None,
    offset: Offset = 0,
    limit: Limit = 50,
) -> JobList:
    """Jobs, newest first, optionally of one task and/or status."""
    page = engine.list_jobs(task_id=task_id, status=status, offset=offset, limit=limit)
    return JobList(items=[JobOut(**job_view(j)) for j in page.items], total=page.total, offset=page.offset,
                   limit=page.limit)


@router.get("/{job_id}", response_model=JobOut, summary="Get a job", responses=error_responses(401, 403, 404, 422))
def get_job(job_id: JobId, engine: EngineDep, _: ReadPrincipal) -> JobOut:
    """Status (``queued|running|succeeded|failed|cancelled``), progress and error of a job."""
    return JobOut(**job_view(engine.get_job(job_id)))


@router.post(
    "/{job_id}/cancel", response_model=JobOut, summary="Cancel a job", responses=error_responses(401, 403, 404, 422)
)
def cancel_job(job_id: JobId, engine: EngineDep, _: WritePrincipal) -> JobOut:
    """A queued job is cancelled at once; a running job is asked to stop at its next batch (it keeps
    nothing half-written). A finished job is returned unchanged."""
    return JobOut(**job_view(engine.cancel_job(job_id)))


@router.get(
    "/{job_id}/events", summary="Progress stream (server-sent events)",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"},
                                                "example": 'event: progress\ndata: {"id": 7, "status": '
                                                           '"running", ...}\n\n'}},
              "description": "One `progress` event (data: the job as JSON) whenever the job changes, ending "
                             "with an `end` event when it reaches a terminal status."},
        **error_responses(401, 403, 404, 422),
    },
)
async def job_events(job_id: JobId, request: Request, engine: EngineDep, _: ReadPrincipal) -> StreamingResponse:
    """Stream the job's progress as server-sent events until it ends (the row is read every 0.5 s)."""
    first = JobOut(**job_view(await run_in_threadpool(engine.get_job, job_id)))

    async def events() -> AsyncIterator[str]:
        job = first
        last = job.model_dump_json()
        yield f"event: progress\nid: 0\ndata: {last}\n\n"
        n, quiet_since = 0, time.monotonic()
        while not is_final(job.status):
            if await request.is_disconnected():
                return
            await asyncio.sleep(POLL_S)
            try:
                job = JobOut(**job_view(await run_in_threadpool(engine.get_job, job_id)))
            except Exception:  # deleted with its task: report and stop
                yield f"event: end\ndata: {json.dumps({'id': job_id, 'deleted': True})}\n\n"
                return
            now_json = job.model_dump_json()
            if now_json != last:
                n += 1
                last = now_json
                quiet_since = time.monotonic()
                yield f"event: progress\nid: {n}\ndata: {now_json}\n\n"
            elif time.monotonic() - quiet_since > KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield ": keep-alive\n\n"
        yield f"event: end\ndata: {json.dumps({'id': job_id, 'status': job.status})}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
