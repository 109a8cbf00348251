"""Queries: ``/v1/route`` (open-set prompt routing), ``/v1/align``, ``/v1/align/matrix``, ``/v1/atlas``."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.deps import ContainerDep, ReadPrincipal
from service.routes import MAX_ID, error_responses
from service.schemas import (
    AlignMatrixRequest,
    AlignMatrixResponse,
    AlignResponse,
    AtlasPoint,
    AtlasResponse,
    PairFlags,
    TaskRef,
)
from service.schemas_routing import RouteMatch, RouteRejection, RouteRequest, RouteResponse, RouteResult
from service.uploads import BoundedJSONRoute
from service.views import factor_fields

router = APIRouter(prefix="/v1", tags=["queries"], route_class=BoundedJSONRoute)


@router.post(
    "/route", response_model=RouteResponse, summary="Route prompts to stored tasks (open set)",
    responses=error_responses(401, 403, 404, 409, 413, 422, 429, 503),
)
async def route(body: RouteRequest, response: Response, c: ContainerDep, _: ReadPrincipal) -> RouteResponse:
    """Sketch each prompt (all its next-token positions) with the loaded model, take the FAISS top
    ``candidates`` by signature (and the space's completion tasks), rank them by the whitened Fisher ranking fused
    with the lexical score (``rank_score``, ``lexical``), and return the top ``k``. ``none`` is true when the prompt
    fits no stored task: the answered task's route score is under its threshold (the request's ``threshold``, else
    the task's calibrated or overridden one), the nearest task holds it under its threshold, or the answered task's
    template or novelty test rejects it (``rejected_by`` says which; docs/SCORES.md).

    The ``Server-Timing`` header splits the server time into ``forward`` (model forward + sketch) and
    ``search`` (FAISS + state loading + exact re-rank).
    """
    answers, timings = await c.queries.route(body.texts(), k=body.k, threshold=body.threshold,
                                             candidates=body.candidates, space_ref=body.space)
    response.headers["Server-Timing"] = timings.header()
    results = [
        RouteResult(
            matches=[RouteMatch(task_id=m.task_id, name=m.name, score=m.score, faiss_score=m.faiss_score,
                                activation=m.activation, error=m.error, threshold=m.threshold,
                                confidence=m.confidence, rank_score=m.rank_score,
                                lexical=m.lexical, length_matched=m.length_matched) for m in a.matches],
            none=a.none, best_score=a.best_score, threshold=a.threshold, confidence=a.confidence,
            nearest_rejects=a.nearest_rejects, template_rejects=a.template_rejects,
            novelty_rejects=a.novelty_rejects, truncated=a.truncated,
            rejected_by=None if a.rejected_by is None else RouteRejection(**dataclasses.asdict(a.rejected_by),
                                                                          message=a.rejected_by.message),
        )
        for a in answers
    ]
    first = results[0]
    return RouteResponse(matches=first.matches, none=first.none, best_score=first.best_score,
                         threshold=first.threshold, confidence=first.confidence,
                         nearest_rejects=first.nearest_rejects, template_rejects=first.template_rejects,
                         novelty_rejects=first.novelty_rejects, rejected_by=first.rejected_by,
                         truncated=first.truncated, results=results)


@router.get(
    "/align", response_model=AlignResponse, summary="Alignment of two tasks",
    responses=error_responses(401, 403, 404, 409, 422),
)
def align(
    c: ContainerDep,
    _: ReadPrincipal,
    a: Annotated[int, Query(ge=1, le=MAX_ID, description="First task id.")],
    b: Annotated[int, Query(ge=1, le=MAX_ID, description="Second task id.")],
) -> AlignResponse:
    """Fisher alignment of tasks ``a`` and ``b`` with its factors: activation S_cov(M_a), error
    S_cov(Γ_e), coupling ρ (and χ), split-half SE, the activation-dark flag, and the empirical-Bayes
    shrunk alignment (shrinkage estimated over ``a`` and its nearest stored tasks)."""
    ta, tb, f = c.queries.align(a, b)
    return AlignResponse(
        a=TaskRef(task_id=ta.task_id, name=ta.name), b=TaskRef(task_id=tb.task_id, name=tb.name), chi=f.chi,
        **factor_fields(f),
    )


@router.post(
    "/align/matrix", response_model=AlignMatrixResponse, summary="Alignment matrices of a set of tasks",
    responses=error_responses(401, 403, 404, 409, 413, 422),
)
def align_matrix(body: AlignMatrixRequest, c: ContainerDep, _: ReadPrincipal) -> AlignMatrixResponse:
    """All pairwise alignments of ``task_ids`` (one space, all ready, at most ``max_matrix_tasks``):
    Fisher, shrunk Fisher, activation, error and ρ matrices, row/column ``i`` = ``ids[i]``."""
    m = c.queries.matrix(body.task_ids)

    def rows(x: object) -> list[list[float]]:
        return [[round(float(v), 6) for v in row] for row in x]  # type: ignore[attr-defined]

    return AlignMatrixResponse(ids=m.ids, names=m.names, fisher=rows(m.fisher), fisher_shrunk=rows(m.fisher_shrunk),
                               activation=rows(m.activation), error=rows(m.error), rho=rows(m.rho),
                               pair_flags=[PairFlags(i=i, j=j, flags=list(f))
                                           for (i, j), f in sorted(m.pair_flags.items())])


@router.get(
    "/atlas", response_model=AtlasResponse, summary="2-D map of a space",
    responses=error_responses(401, 403, 404, 409, 422, 503),
)
def atlas(
    c: ContainerDep,
    _: ReadPrincipal,
    space: Annotated[str | None, Query(max_length=300, description="Space id or name; default: the model's.")] = None,
) -> AtlasResponse:
    """Classical MDS of 1 − Fisher alignment (deterministic, sign-fixed) with average-linkage clusters.
    Spaces above ``max_matrix_tasks`` ready tasks are drawn from an even subset (``sampled``)."""
    sp, amap, total, sampled = c.queries.atlas(space)
    return AtlasResponse(
        space_id=sp.id, method=amap.method, total=total, sampled=sampled, n_clusters=amap.n_clusters,
        points=[AtlasPoint(task_id=p.task_id, name=p.name, x=p.x, y=p.y, cluster=p.cluster) for p in amap.points],
    )
