"""One router per resource: health, tasks, jobs, queries (route/align/atlas), spaces, keys."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query

from service.schemas import MAX_ID, ErrorBody

__all__ = ["MAX_ID", "Limit", "Offset", "error_responses"]

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
    429: "The job queue or the model is overloaded; retry later.",
    503: "The model is not loaded.",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries rendering the shared error body for ``codes``."""
    return {code: {"model": ErrorBody, "description": _DESCRIPTIONS.get(code, "Error.")} for code in codes}
