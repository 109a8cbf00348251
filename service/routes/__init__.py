"""One router per resource: health, tasks, jobs, queries (route/align/atlas), spaces, keys."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query

from service.schemas import MAX_ID, RETRY_AFTER, ErrorBody

__all__ = ["MAX_ID", "Limit", "Offset", "error_responses"]

TaskId = Annotated[int, Path(ge=1, le=MAX_ID, description="Task id.")]
"""A task id in a route's path (one definition: the OpenAPI document describes it alike everywhere)."""

Offset = Annotated[int, Query(ge=0, le=MAX_ID)]
"""``offset`` query parameter of the paginated lists."""

Limit = Annotated[int, Query(ge=1, le=1000)]
"""``limit`` query parameter of the paginated lists."""

_DESCRIPTIONS = {
    401: "No valid API key.",
    403: "The API key lacks the required scope.",
    404: "Not found.",
    409: "Conflict: duplicate name, task not ready, or incompatible spaces.",
    413: "An upload, sample count, sample, prompt or matrix exceeds a limit.",
    415: "Unsupported content type.",
    422: "Malformed input.",
    429: "Too many requests (`rate_limited`), a full job queue (`queue_full`) or too many progress streams; retry "
         "after Retry-After.",
    503: "Unavailable for the moment: no model or worker serves the space (`model_unavailable`), the database "
         "(`database_unavailable`, `database_busy`), the job queue (`queue_unavailable`) or the upload slots "
         "(`uploads_busy`); retry after Retry-After.",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries rendering the shared error body for ``codes`` (429 and 503 with their
    ``Retry-After``)."""
    return {code: {"model": ErrorBody, "description": _DESCRIPTIONS.get(code, "Error."),
                   **({"headers": RETRY_AFTER} if code in (429, 503) else {})} for code in codes}
