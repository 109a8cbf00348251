"""The one vocabulary of statuses, kinds and modes: ``StrEnum``s shared by the models, the API schemas,
the workers and the client (members are ``str``, so they compare equal to, and serialise as, their values).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class TaskStatus(StrEnum):
    """A task is ``pending`` until its first job succeeds, then ``ready``; ``failed`` if it never does."""

    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


class JobStatus(StrEnum):
    """Lifecycle of a job; the last three are final."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """Whether the job can change no more."""
        return self in FINAL_JOB_STATUSES


FINAL_JOB_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


class JobKind(StrEnum):
    """``create`` computes a new task's state; ``append`` merges new samples into it."""

    CREATE = "create"
    APPEND = "append"


class Mode(StrEnum):
    """``text``: every next-token position counts; ``completion``: only the completion's tokens."""

    TEXT = "text"
    COMPLETION = "completion"


ModeName = Literal["text", "completion"]
"""The values of :class:`Mode` as a typing ``Literal`` (for signatures that take plain strings)."""


class ChangeKind(StrEnum):
    """Kinds of rows in the change log the FAISS index follows."""

    UPSERT = "upsert"
    DELETE = "delete"


class Scope(StrEnum):
    """API key scopes, each including the ones before it."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


MAX_SOURCES = 100
"""Sources one recommendation returns at most (REST, client, CLI and library alike)."""
MAX_LISTED_IDS = 1000
"""Most task ids one list request may filter by (``GET /v1/tasks?id=…``)."""
MATRIX_DEFAULT_TASKS = 40
"""Tasks of an alignment matrix when none are named: the space's first ready tasks by id (CLI, library and dashboard
alike; a heatmap of more has unreadable labels)."""
