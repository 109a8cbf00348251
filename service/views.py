"""Rows and results to response models: one place that turns ORM rows into the API's ``TaskOut`` /
``JobOut`` / ``KeyOut`` and a pair's factors into ``PairFactors`` fields."""

from __future__ import annotations

from typing import Any

from atlas.analysis import Factors
from atlas.models import ApiKey, Job, Task
from atlas.vocabulary import JobKind, JobStatus, Mode, TaskStatus
from service.schemas import JobOut, JobProgress, JobResult, TaskOut
from service.schemas_keys import KeyOut
from workers.extraction_results import sample_notes
from workers.job_progress import progress_view


def job_out(job: Job) -> JobOut:
    """A job row as ``JobOut`` (its progress as :func:`workers.job_progress.progress_view` shows it)."""
    progress = JobProgress(**progress_view(job.progress, job.status))
    return JobOut.model_validate({
        "id": job.id, "kind": JobKind(job.kind), "task_id": job.task_id, "status": JobStatus(job.status),
        "progress": progress, "result": job_result(job.result), "error": job.error, "created_at": job.created_at,
        "started_at": job.started_at, "finished_at": job.finished_at, "attempts": job.attempts,
        "cancel_requested": job.cancel_requested,
    })


def key_out(key: ApiKey) -> KeyOut:
    """A key row as ``KeyOut`` (no secret: the API's answers and the CLI's ``keys --local`` print alike)."""
    return KeyOut(id=key.id, name=key.name, prefix=key.prefix, scopes=list(key.scopes), created_at=key.created_at,
                  last_used_at=key.last_used_at, revoked=key.revoked_at is not None)


def job_result(result: dict[str, Any] | None) -> JobResult | None:
    """A succeeded job's stored summary (``Job.result``) as ``JobResult``: its sample counts only; ``None`` for
    a job without one."""
    if not isinstance(result, dict):
        return None
    from pydantic import ValidationError

    try:
        fields = {k: result[k] for k in JobResult.model_fields if k in result and k != "notes"}
        return JobResult.model_validate(fields | {"notes": sample_notes(result)})
    except ValidationError:  # a summary this version cannot read: the job is shown without it
        return None


def task_out(task: Task) -> TaskOut:
    """A task row as ``TaskOut``."""
    return TaskOut(
        id=task.id, name=task.name, space_id=task.space_id, mode=Mode(task.mode), status=TaskStatus(task.status),
        metadata=task.meta or {}, n_samples=task.n_samples, n_tokens=task.n_tokens, version=task.version,
        created_at=task.created_at, updated_at=task.updated_at,
    )


def factor_fields(f: Factors) -> dict[str, Any]:
    """The ``PairFactors`` fields (``/v1/align``, each source of ``/v1/tasks/{id}/sources``) of a pair's factors."""
    return {"fisher": f.fisher, "fisher_shrunk": f.fisher_shrunk, "activation": f.activation, "error": f.error,
            "rho": f.rho, "se": f.se, "activation_dark": f.activation_dark, "flags": list(f.flags)}
