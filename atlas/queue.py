"""The job queue interface seen by the HTTP layer.

SQL is the durable queue (``jobs`` rows in status ``queued``); a :class:`JobQueue` only *wakes* a
runner for a job id. Implementations live in ``workers`` (``workers.inprocess.InProcessRunner``,
``workers.celery_app.CeleryJobQueue``), so ``atlas`` never imports them. A lost wake-up is harmless:
every runner sweeps SQL for queued and stale jobs.

Order of operations in a request that creates a job (``atlas.services.tasks.TaskService.create``)::

    with store.session() as session:                      # one transaction
        check_queue(session, space)                       # 429 before anything is stored: queued SQL rows of
                                                          # the space's model, not this queue's depth
        task, job, created = repository.create_or_replay_task(...)
    queue.enqueue(job.id, serving_key)                    # after commit: the runner must see the row
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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

