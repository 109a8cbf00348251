"""``/v1/jobs``: status, progress stream (server-sent events) and cancellation."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from atlas.errors import NotFound
from atlas.services.jobs import is_final
from atlas.vocabulary import JobStatus
from service.auth import key_gate
from service.deps import ContainerDep, ReadPrincipal, WritePrincipal
from service.errors import is_retryable
from service.routes import MAX_ID, Limit, Offset, error_responses
from service.schemas import JobList, JobOut
from service.streams import SlotReleasingResponse, stream_client
from service.uploads import BoundedJSONRoute
from service.views import job_out

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=BoundedJSONRoute)

JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="Job id.")]

POLL_S = 0.5
"""How often the progress stream reads the job row."""
KEY_RECHECK_S = 5.0
"""How often the progress stream checks that the caller's key is still active."""
KEEPALIVE_S = 15.0
"""A comment line is sent after this long without an event (keeps proxies from closing the stream)."""


@router.get("", response_model=JobList, summary="List jobs", responses=error_responses(401, 403, 404, 422))
def list_jobs(
    c: ContainerDep,
    _: ReadPrincipal,
    task_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    status: Annotated[JobStatus | None, Query()] = None,
    space: Annotated[str | None, Query(max_length=300, description="Space id or name; default: all spaces.")] = None,
    offset: Offset = 0,
    limit: Limit = 50,
) -> JobList:
    """Jobs, newest first, optionally of one task, status and/or space."""
    page = c.jobs.page(task_id=task_id, status=status, space_ref=space, offset=offset, limit=limit)
    return JobList(items=[job_out(j) for j in page.items], total=page.total, offset=page.offset,
                   limit=page.limit)


@router.get("/{job_id}", response_model=JobOut, summary="Get a job", responses=error_responses(401, 403, 404, 422))
def get_job(job_id: JobId, c: ContainerDep, _: ReadPrincipal) -> JobOut:
    """Status (``queued|running|succeeded|failed|cancelled``), progress and error of a job."""
    return job_out(c.jobs.get(job_id))


@router.post(
    "/{job_id}/cancel", response_model=JobOut, summary="Cancel a job", responses=error_responses(401, 403, 404, 422)
)
def cancel_job(job_id: JobId, c: ContainerDep, _: WritePrincipal) -> JobOut:
    """A queued job is cancelled at once; a running job is asked to stop at its next batch (it keeps
    nothing half-written). A finished job is returned unchanged."""
    return job_out(c.jobs.cancel(job_id))


@router.get(
    "/{job_id}/events", summary="Progress stream (server-sent events)",
    response_class=EventSourceResponse,
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"},
                                                "example": 'event: progress\ndata: {"id": 7, "status": '
                                                           '"running", ...}\n\n'}},
              "description": "One `progress` event (data: the job as JSON) whenever the job changes, ending "
                             "with an `end` event when it reaches a terminal status (close the stream then). A "
                             "progress event's id names the job's state: reconnecting with `Last-Event-ID`, the "
                             "first event is left out while the job is as that id says."},
        **error_responses(401, 403, 404, 422, 429),
    },
)
async def job_events(job_id: JobId, request: Request, c: ContainerDep,
                     principal: ReadPrincipal) -> EventSourceResponse:
    """Stream the job's progress as server-sent events until it ends (the row is read every 0.5 s);
    sse-starlette frames the events and sends a keep-alive comment every 15 s. The caller's key is checked
    again every ``KEY_RECHECK_S``: a key revoked meanwhile ends the stream (an ``end`` event saying so).

    Open streams are capped per key (per client address when anonymous, ``max_event_streams_per_client``) and in
    total (``max_event_streams``): one more answers 429 with ``Retry-After``; a slot is given back when its stream
    ends or its client disconnects (:class:`service.streams.SlotReleasingResponse`)."""
    first = job_out(await run_in_threadpool(c.jobs.get, job_id))

    gate = key_gate(c)

    def key_revoked() -> bool:
        return gate is not None and not gate.still_active(principal)

    seen = request.headers.get("last-event-id")

    async def events() -> AsyncIterator[ServerSentEvent]:
        job = first
        last = job.model_dump_json()
        if seen != _event_id(last):  # a client reconnecting with the job as it still is has it already
            yield ServerSentEvent(data=last, event="progress", id=_event_id(last))
        checked = time.monotonic()
        while not is_final(job.status):
            await asyncio.sleep(POLL_S)
            try:
                if time.monotonic() - checked >= KEY_RECHECK_S:
                    checked = time.monotonic()
                    if await run_in_threadpool(key_revoked):
                        yield ServerSentEvent(data=json.dumps({"id": job_id, "key_revoked": True}), event="end")
                        return
                job = job_out(await run_in_threadpool(c.jobs.get, job_id))
            except NotFound:  # deleted with its task: report and stop
                yield ServerSentEvent(data=json.dumps({"id": job_id, "deleted": True}), event="end")
                return
            except Exception as exc:  # the database restarting or busy: poll again (a restart cut the stream)
                if not is_retryable(exc):
                    raise
                continue
            now_json = job.model_dump_json()
            if now_json != last:
                last = now_json
                yield ServerSentEvent(data=now_json, event="progress", id=_event_id(now_json))
        yield ServerSentEvent(data=json.dumps({"id": job_id, "status": job.status}), event="end")

    client = stream_client(principal, request.scope)
    c.event_streams.acquire(client)  # QueueFull → 429 with Retry-After
    try:
        return SlotReleasingResponse(c.event_streams, client, events(), ping=int(KEEPALIVE_S),
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    except BaseException:
        c.event_streams.release(client)
        raise


def _event_id(job_json: str) -> str:
    """A progress event's id: a digest of the job's JSON, the same on every connection (per-connection counters
    restarted at 0, so ``Last-Event-ID`` told a reconnecting client nothing; an API review, 2026-12-07)."""
    return hashlib.blake2b(job_json.encode(), digest_size=8).hexdigest()
