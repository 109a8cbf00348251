"""Domain exceptions.

Every error the product raises on purpose is an :class:`AtlasError` carrying the HTTP status
and a stable machine-readable ``code``. The HTTP layer renders all of them with one function,
``service.errors.error_response`` (secrets masked, sizes bounded), as ``{"code", "message", "detail"}``; no other
layer knows about HTTP beyond this number.
"""

from __future__ import annotations

from typing import Any


class AtlasError(Exception):
    """Base class of domain errors.

    Parameters
    ----------
    message
        Human-readable explanation, safe to show to API users.
    detail
        Optional structured detail (JSON-serialisable).
    """

    status_code: int = 500
    code: str = "internal_error"

    retry_after_s: float | None = None
    """Seconds a client should wait before retrying (rendered as ``Retry-After``; 429 and 503)."""

    def __init__(self, message: str, detail: Any = None, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        if retry_after_s is not None:
            self.retry_after_s = float(retry_after_s)


class InvalidInput(AtlasError):
    """The request or upload is malformed or violates a constraint (422)."""

    status_code = 422
    code = "invalid_input"


class NotFound(AtlasError):
    """A task, job, space or key does not exist (404)."""

    status_code = 404
    code = "not_found"


class Conflict(AtlasError):
    """The request conflicts with stored state, e.g. a duplicate task name (409)."""

    status_code = 409
    code = "conflict"


class PayloadTooLarge(AtlasError):
    """An upload, sample count, sample or prompt exceeds a configured limit (413)."""

    status_code = 413
    code = "payload_too_large"


class Unauthorized(AtlasError):
    """No valid API key was presented (401)."""

    status_code = 401
    code = "unauthorized"


class Forbidden(AtlasError):
    """The API key lacks the scope the operation needs (403)."""

    status_code = 403
    code = "forbidden"


class QueueFull(AtlasError):
    """The job queue is at capacity; retry later (429)."""

    status_code = 429
    code = "queue_full"


class QueueUnavailable(AtlasError):
    """The job queue's broker cannot be reached: nothing was stored; retry later (503)."""

    status_code = 503
    code = "queue_unavailable"
    retry_after_s = 5.0


class ModelUnavailable(AtlasError):
    """The language model is not loaded or cannot be loaded (503)."""

    status_code = 503
    code = "model_unavailable"


class IncompatibleSpace(AtlasError):
    """Signatures of different model fingerprints or sketch specs were mixed (409)."""

    status_code = 409
    code = "incompatible_space"


class NotReady(AtlasError):
    """A task has no signature yet (its job has not finished) (409)."""

    status_code = 409
    code = "not_ready"


class DatabaseUnavailable(AtlasError):
    """The database cannot be reached or used: a wrong URL, a server down, a file that is no database, or a
    schema written by a newer version (503)."""

    status_code = 503
    code = "database_unavailable"


class StorageFull(AtlasError):
    """The server has no space left for the request's data: its temporary directory (``TMPDIR``, where uploads over
    1 MB are spooled) or its data directory (507); nothing was stored."""

    status_code = 507
    code = "insufficient_storage"
    retry_after_s = 30.0


class ResourcesExhausted(AtlasError):
    """The server is out of a process resource (open files); retry shortly (503)."""

    status_code = 503
    code = "resources_exhausted"
    retry_after_s = 2.0


class DatabaseBusy(AtlasError):
    """The database is locked by another writer or out of connections; retry shortly (503)."""

    status_code = 503
    code = "database_busy"
    retry_after_s = 2.0
