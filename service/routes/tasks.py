"""``/v1/tasks``: create (upload), append, list, get, patch, delete, and source recommendation."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from atlas.sample_io import SampleLimits
from atlas.vocabulary import MAX_LISTED_IDS, MAX_SOURCES, TaskStatus
from service.deps import ContainerDep, ReadPrincipal, UploadSlot, WritePrincipal
from service.routes import MAX_ID, Limit, Offset, TaskId, error_responses
from service.schemas import (
    JobAccepted,
    SamplesAppend,
    SourceOut,
    SourcesResponse,
    TaskCreate,
    TaskCreated,
    TaskList,
    TaskOut,
    TaskPatch,
    TaskRef,
)
from service.uploads import APPEND_FORM_SCHEMA, TASK_FORM_SCHEMA, BoundedJSONRoute, read_upload
from service.views import factor_fields, job_out, task_out

router = APIRouter(prefix="/v1/tasks", tags=["tasks"], route_class=BoundedJSONRoute)

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", max_length=200,
           description="Optional client key: repeating a request with the same key returns the first answer; "
                       "the same key with another body (task fields, metadata or samples) is 409 (an empty or "
                       "blank key is no key)."),
]


def _key(idempotency_key: str | None) -> str | None:
    """The request's idempotency key; an empty or blank header is no key (it was one key shared by every
    request: the second task sent with it got 409 "key already used")."""
    return idempotency_key.strip() or None if idempotency_key is not None else None


def _request_body(form_schema: dict, json_ref: str) -> dict:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {"schema": form_schema},
                "application/json": {"schema": {"$ref": f"#/components/schemas/{json_ref}"}},
            },
        }
    }


@router.post(
    "", status_code=202, response_model=TaskCreated, summary="Add a task (upload a file or JSON samples)",
    openapi_extra=_request_body(TASK_FORM_SCHEMA, "TaskCreate"),
    responses=error_responses(401, 403, 404, 409, 413, 415, 422, 429, 503),
)
async def create_task(
    request: Request, c: ContainerDep, _: WritePrincipal, _slot: UploadSlot, idempotency_key: IdempotencyKey = None
) -> TaskCreated:
    """Create a task from a multipart upload (``file`` + ``name``, ``mode``, ``space``, ``metadata``)
    or a JSON body with ``samples``; its job is queued at once (202).

    Files: JSONL (``{"text"}`` or ``{"prompt","completion"}`` per line), JSON array, CSV or TSV (same columns),
    Parquet, or plain text (one sample per line); any of them gzipped (``.gz``). Limits: upload bytes, sample
    count and sample length answer 413; malformed input 422; a full queue 429; no model, or every upload slot taken for
    ``upload_slot_wait_s`` (``max_concurrent_uploads``), 503. A rejected upload stores nothing.
    """
    up = await read_upload(request, max_upload_bytes=c.settings.max_upload_bytes, json_model=TaskCreate,
                           with_task_fields=True, limits=SampleLimits.from_settings(c.settings))
    assert up.name is not None

    def run() -> TaskCreated:
        samples = up.samples()
        task, job = c.tasks.create(up.name or "", up.mode, up.metadata, samples, up.space,
                                   idempotency_key=_key(idempotency_key))
        return TaskCreated(task=task_out(task), job=job_out(job))

    return await run_in_threadpool(run)


@router.post(
    "/{task_id}/samples", status_code=202, response_model=JobAccepted, summary="Append samples to a task",
    openapi_extra=_request_body(APPEND_FORM_SCHEMA, "SamplesAppend"),
    responses=error_responses(401, 403, 404, 409, 413, 415, 422, 429, 503),
)
async def append_samples(
    task_id: TaskId, request: Request, c: ContainerDep, _: WritePrincipal, _slot: UploadSlot,
    idempotency_key: IdempotencyKey = None,
) -> JobAccepted:
    """Queue an ``append`` job: the new samples are sketched and merged into the task's state (exact,
    states are sums), then its signature and index entry are updated. The task's mode applies."""
    up = await read_upload(request, max_upload_bytes=c.settings.max_upload_bytes, json_model=SamplesAppend,
                           with_task_fields=False, limits=SampleLimits.from_settings(c.settings))

    def run() -> JobAccepted:
        task = c.tasks.get(task_id)
        job = c.tasks.append(task_id, up.samples(task.mode), idempotency_key=_key(idempotency_key))
        return JobAccepted(job=job_out(job))

    return await run_in_threadpool(run)


@router.get("", response_model=TaskList, summary="List tasks", responses=error_responses(401, 403, 404, 422))
def list_tasks(
    c: ContainerDep,
    _: ReadPrincipal,
    space: Annotated[str | None, Query(max_length=300, description="Space id or name; default: all spaces.")] = None,
    name: Annotated[str | None, Query(max_length=300, description="Exact task name.")] = None,
    name_prefix: Annotated[str | None, Query(max_length=300, description="Task names starting with this.")] = None,
    status: Annotated[TaskStatus | None, Query()] = None,
    task_ids: Annotated[list[Annotated[int, Field(ge=1, le=MAX_ID)]] | None, Query(
        alias="id", max_length=MAX_LISTED_IDS,
        description=f"Only these task ids (repeat the parameter: `id=3&id=7`; at most {MAX_LISTED_IDS}).")] = None,
    offset: Offset = 0,
    limit: Limit = 50,
) -> TaskList:
    """Tasks, oldest first, filtered by space, exact name or name prefix, status and ids; paginated."""
    page = c.tasks.page(space_ref=space, name=name, name_prefix=name_prefix, status=status, task_ids=task_ids,
                        offset=offset, limit=limit)
    return TaskList(items=[task_out(t) for t in page.items], total=page.total, offset=page.offset,
                    limit=page.limit)


@router.get("/{task_id}", response_model=TaskOut, summary="Get a task", responses=error_responses(401, 403, 404, 422))
def get_task(task_id: TaskId, c: ContainerDep, _: ReadPrincipal) -> TaskOut:
    """One task with its counts and status."""
    return task_out(c.tasks.get(task_id))


@router.patch(
    "/{task_id}", response_model=TaskOut, summary="Rename a task or update its metadata",
    responses=error_responses(401, 403, 404, 409, 422),
)
def patch_task(task_id: TaskId, body: TaskPatch, c: ContainerDep, _: WritePrincipal) -> TaskOut:
    """Rename the task (``name``: 409 when its space has a task of that name) and/or merge ``metadata`` into its
    metadata (a ``null`` value removes the key)."""
    return task_out(c.tasks.patch(task_id, body.metadata, name=body.name))


@router.delete(
    "/{task_id}", status_code=204, summary="Delete a task", response_class=Response,
    responses=error_responses(401, 403, 404, 422),
)
def delete_task(task_id: TaskId, c: ContainerDep, _: WritePrincipal) -> Response:
    """Remove the task, its state, signature and samples from the store and its entry from the index."""
    c.tasks.delete(task_id)
    return Response(status_code=204)


@router.get(
    "/{task_id}/sources", response_model=SourcesResponse, summary="Recommend fine-tuning sources",
    responses=error_responses(401, 403, 404, 409, 422),
)
def sources(
    task_id: TaskId,
    c: ContainerDep,
    _: ReadPrincipal,
    k: Annotated[int, Query(ge=1, le=MAX_SOURCES, description="Sources returned.")] = 5,
    candidates: Annotated[
        int | None, Query(ge=1, le=4096, description="Nearest tasks compared (default max(4k, 32)); all when fewer.")
    ] = None,
) -> SourcesResponse:
    """Rank the target's nearest stored tasks as fine-tuning sources by empirical-Bayes shrunk Fisher
    alignment, with the three factors (activation S_cov(M_a), error S_cov(Γ_e), coupling ρ), the
    split-half SE and the activation-dark flag (activation ≥ 0.8 while Fisher alignment ≤ 0.3)."""
    target, found, compared = c.queries.sources(task_id, k=k, candidates=candidates)
    return SourcesResponse(
        target=TaskRef(task_id=target.task_id, name=target.name),
        sources=[SourceOut(task_id=s.task_id, name=s.name, **factor_fields(s.factors)) for s in found],
        compared=compared,
    )
