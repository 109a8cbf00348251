"""The job queue interface seen by the HTTP layer.

SQL is the durable queue (``jobs`` rows in status ``queued``); a :class:`JobQueue` only *wakes* a
runner for a job id. Implementations live in ``workers`` (``workers.inprocess.InProcessRunner``,
``workers.celery_app.CeleryJobQueue``), so ``atlas`` never imports them. A lost wake-up is harmless:
every runner sweeps SQL for queued and stale jobs.

Order of operations in a request that creates a job::

    ensure_capacity(queue, settings.max_queued_jobs)     # 429 before anything is stored
    with factory.begin() as session:
        task, job = repository.create_task_with_job(...)  # one transaction
    queue.enqueue(job.id)                                 # after commit: the runner must see the row
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from atlas.errors import QueueFull


@runtime_checkable
class JobQueue(Protocol):
    """Something that runs jobs by id."""

    def enqueue(self, job_id: int, serving_key: str | None = None) -> None:
        """Ask a runner to run job ``job_id`` (committed, status ``queued``). Never raises ``QueueFull``.

        ``serving_key`` (:attr:`atlas.ports.SpaceKey.serving_key` of the job's space) routes the job to
        the workers of its model; runners that serve one model may ignore it.
        """
        ...

    def depth(self) -> int:
        """Jobs waiting to start (not counting running ones)."""
        ...


def ensure_capacity(queue: JobQueue, limit: int) -> None:
    """Raise :class:`~atlas.errors.QueueFull` (429) when ``limit`` or more jobs are waiting."""
    waiting = queue.depth()
    if waiting >= limit:
        raise QueueFull(
            f"the job queue is full ({waiting} jobs waiting, limit {limit}); retry later",
            {"depth": waiting, "limit": limit},
        )
