"""Route thresholds: ``POST /v1/route/fit`` and ``GET``/``PATCH /v1/tasks/{id}/routing`` (docs/SCORES.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service.auth import authorize
from service.deps import ContainerDep, ReadPrincipal, WritePrincipal
from service.routes import TaskId, error_responses
from service.schemas_routing import FitRequest, FitResponse, RoutingInfo, ThresholdPatch
from service.uploads import BoundedJSONRoute

router = APIRouter(prefix="/v1", tags=["queries"], route_class=BoundedJSONRoute)


@router.get("/tasks/{task_id}/routing", response_model=RoutingInfo, summary="A task's route threshold",
            responses=error_responses(401, 403, 404))
async def get_routing(task_id: TaskId, c: ContainerDep, _: ReadPrincipal) -> RoutingInfo:
    """The task's effective route threshold: its override, else its calibrated one, else the default."""
    return RoutingInfo(**await run_in_threadpool(c.thresholds.info, task_id))


@router.patch("/tasks/{task_id}/routing", response_model=RoutingInfo,
              summary="Override a task's route threshold, template or novelty test or false-reject rate",
              responses=error_responses(401, 403, 404, 422))
async def patch_routing(task_id: TaskId, body: ThresholdPatch, c: ContainerDep, _: WritePrincipal) -> RoutingInfo:
    """Set (or clear with ``null``) the task's threshold override; turn its template or novelty test on or off;
    re-calibrate its threshold at another false-reject rate."""
    threshold = body.threshold if "threshold" in body.model_fields_set else ...
    return RoutingInfo(**await run_in_threadpool(c.thresholds.patch, task_id, threshold, body.template,
                                                 body.false_reject_rate, body.novelty))


@router.post("/route/fit", response_model=FitResponse, summary="Tune route thresholds from labelled prompts",
             responses=error_responses(401, 403, 404, 409, 413, 422, 429, 503))
async def fit(body: FitRequest, request: Request, c: ContainerDep, _: ReadPrincipal) -> FitResponse:
    """Route the labelled prompts, then raise each task's threshold just above the prompts it wrongly
    accepts (labelled another task or "none"), never past the documented false-reject rate of its
    own held-out scores and labelled prompts (semantic-router's ``fit``; docs/SCORES.md). Each label names a ready
    task of the space (404 unknown; 409 another space's, or not ready) or is ``"none"``; ``dry_run`` stores nothing
    and needs the ``read`` scope only (a preview routes prompts, as ``/v1/route`` does); storing needs ``write``."""
    if not body.dry_run:
        authorize(request, c, "write")
    res = await c.thresholds.fit([(e.prompt, e.label) for e in body.examples], space_ref=body.space,
                                 dry_run=body.dry_run)
    return FitResponse(thresholds=res.thresholds, accuracy_before=res.accuracy_before,
                       accuracy_after=res.accuracy_after, stored=res.stored, template_off=res.template_off,
                       novelty_off=res.novelty_off, previous=res.previous, unsplit=res.unsplit,
                       held_by_cap=res.held_by_cap)
