"""Rows to response models: one place that turns ORM rows into the API's ``TaskOut`` / ``JobOut``."""

from __future__ import annotations

from atlas.models import Job, Task
from atlas.vocabulary import JobKind, JobStatus, Mode, TaskStatus
from service.schemas import JobOut, JobProgress, TaskOut
from workers.jobs import progress_view


def job_out(job: Job) -> JobOut:
    """A job row as ``JobOut``."""
    progress = JobProgress(**progress_view(job.progress))
    return JobOut.model_validate({
        "id": job.id, "kind": JobKind(job.kind), "task_id": job.task_id, "status": JobStatus(job.status),
        "progress": progress, "error": job.error, "created_at": job.created_at, "started_at": job.started_at,
        "finished_at": job.finished_at, "attempts": job.attempts, "cancel_requested": job.cancel_requested,
    })


def task_out(task: Task) -> TaskOut:
    """A task row as ``TaskOut``."""
    return TaskOut(
        id=task.id, name=task.name, space_id=task.space_id, mode=Mode(task.mode), status=TaskStatus(task.status),
        metadata=task.meta or {}, n_samples=task.n_samples, n_tokens=task.n_tokens, version=task.version,
        created_at=task.created_at, updated_at=task.updated_at,
    )
