"""Typed errors of the client, mapped from the error body's ``code`` (``{"code", "message", "detail"}``)."""

from __future__ import annotations

from typing import Any


class AtlasClientError(Exception):
    """An error answered by the service (or a transport failure, with ``status`` 0).

    Attributes
    ----------
    status : int
        HTTP status (0 when the service could not be reached).
    code : str
        The service's error code, e.g. ``not_found``, ``queue_full``.
    message : str
        Human-readable explanation.
    detail : Any
        Structured detail, if any.
    retry_after : float or None
        The ``Retry-After`` the service sent (429, 503).
    """

    def __init__(self, status: int, code: str, message: str, detail: Any = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        self.retry_after = retry_after


class Unreachable(AtlasClientError):
    """The service could not be reached (connection refused, reset, timeout)."""


class ClientClosed(AtlasClientError):
    """The client was closed (``close()``/``aclose()``, or its ``with`` block ended); make a new one."""


class InvalidInput(AtlasClientError):
    """422: the request or upload is malformed."""


class NotFound(AtlasClientError):
    """404: no such task, job, space or key."""


class Conflict(AtlasClientError):
    """409: a name is taken, or the state does not allow the request."""


class NotReady(Conflict):
    """409: the task has no signature yet."""


class IncompatibleSpace(Conflict):
    """409: tasks of different spaces (model or sketch spec) were mixed."""


class PayloadTooLarge(AtlasClientError):
    """413: a size limit was exceeded."""


class UnsupportedMediaType(AtlasClientError):
    """415: the upload's content type is not supported."""


class Unauthorized(AtlasClientError):
    """401: no API key, or an unknown one."""


class Forbidden(AtlasClientError):
    """403: the key lacks the scope, or the origin/host is refused."""


class RateLimited(AtlasClientError):
    """429: a queue is full or the key's rate limit is reached; ``retry_after`` says when to retry."""


class Unavailable(AtlasClientError):
    """503: no model serves the space, or the store is busy; ``retry_after`` says when to retry."""


class BadGateway(Unavailable):
    """502 or 504 from a proxy in front of the service (it is restarting, or did not answer in time): retried and
    waited out as a 503 is."""


class CreatedButNotDone(TimeoutError):
    """``add_task(wait=True)`` whose wait ended before the job did (``wait_timeout``): the task exists, and
    ``created`` (a ``TaskCreated``) says which, with its job; the job may well be running still."""

    def __init__(self, message: str, created: Any) -> None:
        super().__init__(message)
        self.created = created


ERRORS_BY_CODE: dict[str, type[AtlasClientError]] = {
    "unreachable": Unreachable, "invalid_input": InvalidInput, "not_found": NotFound, "conflict": Conflict,
    "not_ready": NotReady, "incompatible_space": IncompatibleSpace, "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType, "unauthorized": Unauthorized, "forbidden": Forbidden,
    "queue_full": RateLimited, "rate_limited": RateLimited, "model_unavailable": Unavailable,
    "unavailable": Unavailable, "database_busy": Unavailable, "database_unavailable": Unavailable,
    "queue_unavailable": Unavailable,
}
"""The error class of each documented code."""

ERRORS_BY_STATUS: dict[int, type[AtlasClientError]] = {
    401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: PayloadTooLarge,
    415: UnsupportedMediaType, 422: InvalidInput, 429: RateLimited, 502: BadGateway, 503: Unavailable,
    504: BadGateway,
}
"""Fallback by HTTP status for codes this client does not know."""


def error_for(status: int, code: str, message: str, detail: Any = None,
              retry_after: float | None = None) -> AtlasClientError:
    """The typed error of an answer (by code, else by status, else the base class)."""
    cls = ERRORS_BY_CODE.get(code) or ERRORS_BY_STATUS.get(status) or AtlasClientError
    return cls(status, code, message, detail, retry_after)
