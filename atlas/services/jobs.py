"""Jobs: get, list, cancel; job statistics for ``/metrics``."""

from __future__ import annotations

from typing import Any

from atlas import job_store
from atlas import repository as repo
from atlas import space_repository as sql
from atlas.db import read_snapshot
from atlas.models import JOB_FINAL_STATUSES, JOB_QUEUED, JOB_RUNNING, Job
from atlas.store import Store


class JobService:
    """Job reads and cancellation (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, job_id: int) -> Job:
        """One job."""
        with self.store.read() as session:
            return job_store.get_job(session, job_id)

    def page(self, *, task_id: int | None = None, status: str | None = None, space_ref: str | None = None,
             offset: int = 0, limit: int = 50) -> repo.Page[Job]:
        """Jobs, newest first (``space_ref``: a space's id or name; ``None``: every space)."""
        with self.store.read() as session:
            read_snapshot(session)
            space_id = self.store.resolve_space(session, space_ref).id if space_ref is not None else None
            return job_store.list_jobs(session, task_id=task_id, status=status, space_id=space_id, offset=offset,
                                       limit=limit)

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued job or ask a running one to stop."""
        with self.store.session() as session:
            return job_store.request_cancel(session, job_id)

    def stats(self) -> dict[str, Any]:
        """Jobs by status, queue depth, succeeded durations and tokens (aggregated in SQL)."""
        with self.store.read() as session:
            by_status = sql.job_counts(session)
            figures = sql.succeeded_job_figures(session)
        return {"by_status": by_status, **figures,
                "queue_depth": by_status.get(JOB_QUEUED, 0) + by_status.get(JOB_RUNNING, 0)}


def is_final(status: str) -> bool:
    """Whether a job status is terminal."""
    return status in JOB_FINAL_STATUSES
