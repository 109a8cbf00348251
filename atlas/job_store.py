"""Job rows: claiming with a lease, heartbeats, checkpoints, completion, cancellation, recovery.

Whoever runs a job (an in-process thread or a Celery worker on another machine) first *claims* it
with one conditional ``UPDATE``: ``queued -> running``, or a ``running`` job whose heartbeat is older
than ``stale_after_s`` (its worker died). The claim writes a fresh random *lease*; every later write
of that worker (heartbeat, checkpoint, final result) is conditional on the lease, so a worker that
lost its job to another (it was presumed dead) can no longer change anything. Two workers can never
both hold a job, and a job can be finished only once.

Functions take a session and do not commit, except where noted; run each in its own short
transaction (``with factory.begin() as s:``).
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from sqlalchemy import case, delete, func, literal, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from atlas.db_clock import db_now
from atlas.errors import InvalidInput, NotFound
from atlas.models import (
    JOB_CANCELLED,
    JOB_FAILED,
    JOB_FINAL_STATUSES,
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_STATUSES,
    JOB_SUCCEEDED,
    Job,
    JobCheckpoint,
    Space,
    UTCDateTime,
    utcnow,
)
from atlas.redaction import redact_secrets
from atlas.repository import Page, mark_task_failed_if_empty
from atlas.upload_repository import purge_orphan_uploads_now

MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Claim:
    """A job claimed by one worker.

    Attributes
    ----------
    job_id, kind, task_id, upload_id, space_id
        Copied from the job row.
    lease
        The lease token every later write must present.
    attempts
        Attempts including this one.
    cancel_requested
        The job was asked to cancel before it (re)started.
    """

    job_id: int
    kind: str
    task_id: int | None
    upload_id: int
    space_id: int
    lease: str
    attempts: int
    cancel_requested: bool


@dataclass(frozen=True)
class Beat:
    """Answer of :func:`heartbeat`: whether the lease is still held and whether cancel was asked."""

    alive: bool
    cancel_requested: bool


def _stale_cutoff(session: Session, stale_after_s: float) -> dt.datetime:
    """Heartbeats older than this are stale: on the database's clock, as heartbeats are written
    (:mod:`atlas.db_clock`)."""
    return db_now(session) - dt.timedelta(seconds=stale_after_s)


def get_job(session: Session, job_id: int) -> Job:
    """Return a job or raise :class:`NotFound`."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} does not exist", {"job_id": job_id})
    return job


def space_fingerprints_of(session: Session, job_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    """(model fingerprint, spec fingerprint) of each job's space (jobs that do not exist are left out)."""
    if not job_ids:
        return {}
    rows = session.execute(select(Job.id, Space.model_fingerprint, Space.spec_fingerprint)
                           .join(Space, Job.space_id == Space.id).where(Job.id.in_([int(i) for i in job_ids])))
    return {int(i): (str(m), str(sp)) for i, m, sp in rows}


def list_jobs(
    session: Session,
    *,
    task_id: int | None = None,
    status: str | None = None,
    space_id: int | None = None,
    offset: int = 0,
    limit: int = 50,
) -> Page[Job]:
    """List jobs, newest first, optionally of one task, one status and/or one space."""
    if not 1 <= limit <= 1000 or offset < 0:
        raise InvalidInput("limit must be in 1..1000 and offset >= 0")
    if status is not None and status not in JOB_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(JOB_STATUSES)}", {"status": status})
    conds = []
    if task_id is not None:
        conds.append(Job.task_id == task_id)
    if status is not None:
        conds.append(Job.status == status)
    if space_id is not None:
        conds.append(Job.space_id == space_id)
    total = session.execute(select(func.count()).select_from(Job).where(*conds)).scalar_one()
    items = session.execute(select(Job).where(*conds).order_by(Job.id.desc()).offset(offset).limit(limit)).scalars()
    return Page(items=list(items), total=int(total), offset=offset, limit=limit)


def count_jobs(session: Session, statuses: Sequence[str] = (JOB_QUEUED,), *,
               model_fingerprint: str | None = None) -> int:
    """Number of jobs in the given statuses (the cluster-wide queue depth for ``queued``); ``model_fingerprint``:
    only the jobs of that model's spaces (those its workers run)."""
    stmt = select(func.count()).select_from(Job).where(Job.status.in_(list(statuses)))
    if model_fingerprint is not None:
        stmt = stmt.where(Job.space_id.in_(select(Space.id).where(Space.model_fingerprint == model_fingerprint)))
    return int(session.execute(stmt).scalar_one())


def request_cancel(session: Session, job_id: int) -> Job:
    """Cancel a job: a queued job is cancelled at once, a running one is asked to stop.

    A finished job is returned unchanged. A cancelled ``create`` job leaves its task ``failed`` if the
    task has no signature. A queued job whose task was deleted is removed (returned as cancelled, detached), with
    the samples no job references any more. The job row is read locked: a worker's claim committed between an
    unlocked read ("queued") and the update ("where queued") made the update match nothing, and the cancel was
    lost.
    """
    job = session.execute(select(Job).where(Job.id == job_id).with_for_update()
                          .execution_options(populate_existing=True)).scalar_one_or_none()
    if job is None:
        raise NotFound(f"job {job_id} does not exist", {"job_id": job_id})
    if job.status == JOB_QUEUED and job.task_id is None:  # its task was deleted while it waited (a dead worker's
        # job put back): it goes as finish_locked takes such a job, with the samples no job references
        _remove_orphan_job(session, job_id)
        session.expunge(job)
        job.status, job.cancel_requested, job.finished_at = JOB_CANCELLED, True, utcnow()
        job.error = "the task was deleted"
        return job
    if job.status == JOB_QUEUED:
        done = session.execute(
            update(Job).where(Job.id == job_id, Job.status == JOB_QUEUED)
            .values(status=JOB_CANCELLED, cancel_requested=True, finished_at=utcnow(), error="cancelled by request")
        ).rowcount  # type: ignore[attr-defined]  # CursorResult
        if done:  # a job released by a shutting-down worker waits with its checkpoint: it never resumes now
            session.execute(delete(JobCheckpoint).where(JobCheckpoint.job_id == job_id))
        if done and job.task_id is not None and job.kind == "create":
            mark_task_failed_if_empty(session, job.task_id)
    elif job.status == JOB_RUNNING:
        session.execute(update(Job).where(Job.id == job_id, Job.status == JOB_RUNNING).values(cancel_requested=True))
    session.flush()
    session.refresh(job)
    return job


def claim_job(
    session: Session, job_id: int, *, worker: str, stale_after_s: float
) -> Claim | None:
    """Atomically take a job: ``queued``, or ``running`` with a heartbeat older than ``stale_after_s``.

    Returns
    -------
    Claim or None
        ``None`` when the job does not exist, is finished, or is held by a live worker.
    """
    lease = secrets.token_hex(16)
    now = db_now(session)
    claimable = or_(
        Job.status == JOB_QUEUED,
        (Job.status == JOB_RUNNING) & or_(Job.heartbeat_at.is_(None),
                                          Job.heartbeat_at < now - dt.timedelta(seconds=stale_after_s)),
    )
    result = session.execute(
        update(Job).where(Job.id == job_id, claimable)
        .values(
            status=JOB_RUNNING, lease=lease, worker=worker[:200], heartbeat_at=now, attempts=Job.attempts + 1,
            started_at=func.coalesce(Job.started_at, literal(now, UTCDateTime())),
            error=None,  # why it waited ("worker shut down; …", a dead worker's note) is past once it runs again
        )
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], result).rowcount != 1:
        return None
    job = session.execute(select(Job).where(Job.id == job_id).execution_options(populate_existing=True)).scalar_one()
    return Claim(
        job_id=job.id, kind=job.kind, task_id=job.task_id, upload_id=job.upload_id, space_id=job.space_id,
        lease=lease, attempts=job.attempts, cancel_requested=bool(job.cancel_requested),
    )


def heartbeat(session: Session, job_id: int, lease: str, progress: dict[str, Any] | None = None) -> Beat:
    """Refresh the heartbeat (and optionally the progress) of a held job."""
    values: dict[str, Any] = {"heartbeat_at": db_now(session)}
    if progress is not None:
        values["progress"] = progress
    rows = session.execute(
        update(Job).where(Job.id == job_id, Job.lease == lease, Job.status == JOB_RUNNING).values(**values)
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]  # CursorResult
    cancel = session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar_one_or_none()
    return Beat(alive=rows == 1, cancel_requested=bool(cancel))


def is_cancel_requested(session: Session, job_id: int) -> bool:
    """Whether someone asked the job to cancel (``True`` also if the job vanished)."""
    value = session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar_one_or_none()
    return True if value is None else bool(value)


def save_checkpoint(
    session: Session,
    job_id: int,
    lease: str,
    *,
    samples_done: int,
    tokens: int,
    state: bytes,
    baselines: bytes | None,
    progress: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> bool:
    """Store the job's mergeable state after ``samples_done`` samples; ``False`` if the lease is lost.

    The checkpoint and the heartbeat are written in the caller's transaction, so a crash leaves
    either the previous checkpoint or this one, never a mix.
    """
    beat = heartbeat(session, job_id, lease, progress)
    if not beat.alive:
        return False
    row = session.get(JobCheckpoint, job_id)
    if row is None:
        session.add(JobCheckpoint(job_id=job_id, samples_done=samples_done, tokens=tokens, state=state,
                                  baselines=baselines, extra=extra or {}, updated_at=utcnow()))
    else:
        row.samples_done, row.tokens, row.state, row.baselines = samples_done, tokens, state, baselines
        row.extra = extra or {}
        row.updated_at = utcnow()
    session.flush()
    return True


def get_checkpoint(session: Session, job_id: int) -> JobCheckpoint | None:
    """The job's latest checkpoint, or ``None``."""
    return session.get(JobCheckpoint, job_id)


def lock_held_job(session: Session, job_id: int, lease: str) -> Job | None:
    """Lock the job row for its final transaction; ``None`` unless it is running under ``lease``.

    Checking inside the final transaction is what makes completion idempotent: a duplicate or
    superseded run finds the job finished (or re-leased) and changes nothing.
    """
    stmt = (
        select(Job).where(Job.id == job_id, Job.lease == lease, Job.status == JOB_RUNNING)
        .with_for_update().execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def stored_error(error: str) -> str:
    """A job's error as stored and shown (``GET /v1/jobs/{id}``): secrets masked, at most ``MAX_ERROR_CHARS``.

    A worker stores an unexpected exception's text, which can carry a database URL or a key; the job answer
    is a plain body, not an error the renderer redacts."""
    return redact_secrets(error)[:MAX_ERROR_CHARS]


def _finish(session: Session, job: Job, status: str, *, error: str | None = None,
            result: dict[str, Any] | None = None) -> None:
    """Set a final status; the job's checkpoint goes (a final job never resumes: a cancelled or failed job's
    state blob stayed for good)."""
    session.execute(delete(JobCheckpoint).where(JobCheckpoint.job_id == job.id))
    job.status = status
    job.finished_at = utcnow()
    job.heartbeat_at = job.finished_at
    job.lease = None
    if error is not None:
        job.error = stored_error(error)
    if result is not None:
        job.result = result


def mark_succeeded(session: Session, job: Job, result: dict[str, Any], progress: dict[str, Any] | None = None) -> None:
    """Finish a locked job as succeeded and drop its checkpoint."""
    _finish(session, job, JOB_SUCCEEDED, result=result)
    job.error = None  # a release on the way ("worker shut down; …") is no error of a job that succeeded
    if progress is not None:
        job.progress = progress
    session.flush()


def finish_job(session: Session, job_id: int, lease: str, status: str, error: str | None = None) -> bool:
    """Finish a held job as ``failed`` or ``cancelled``; ``False`` if the lease is no longer held.

    A failed or cancelled ``create`` job leaves its task ``failed`` when the task has no signature.
    """
    if status not in (JOB_FAILED, JOB_CANCELLED):
        raise ValueError(f"finish_job cannot set status {status!r}")
    job = lock_held_job(session, job_id, lease)
    if job is None:
        return False
    finish_locked(session, job, status, error)
    return True


def finish_locked(session: Session, job: Job, status: str, error: str | None = None) -> None:
    """Finish a job locked with :func:`lock_held_job` as ``failed`` or ``cancelled``; a job whose task was deleted
    is removed instead, with the uploads no job references any more (a deleted task keeps no samples)."""
    if status not in (JOB_FAILED, JOB_CANCELLED):
        raise ValueError(f"finish_locked cannot set status {status!r}")
    if job.task_id is None:  # its task was deleted while it ran: it goes as the task's other jobs went
        _remove_orphan_job(session, job.id)
        return
    _finish(session, job, status, error=error or status)
    if job.kind == "create" and job.task_id is not None:
        mark_task_failed_if_empty(session, job.task_id)
    session.flush()


def _remove_orphan_job(session: Session, job_id: int) -> None:
    """Delete a job whose task was deleted, with the samples no job references any more (they stayed for it)."""
    session.execute(delete(Job).where(Job.id == job_id))
    session.flush()
    purge_orphan_uploads_now(session)


def release_job(session: Session, job_id: int, lease: str, error: str | None = None, *,
                count_attempt: bool = True, worker: str | None = None) -> bool:
    """Give a held job back to the queue (``running -> queued``) after a transient failure, or — with
    ``count_attempt=False`` — a graceful shutdown or a database outage, whose claim does not count towards
    ``job_max_attempts`` (restarts during one long job would fail it as if its worker had died each time).

    An outage longer than the stale window let another process's sweep re-queue the job first (its heartbeat could
    not be written), counting the attempt: with ``count_attempt=False`` and its ``worker`` named, a job that sweep
    put back and nobody has claimed since (still ``queued``, the sweep's note, this worker's name) gets its attempt
    back too."""
    values: dict[str, Any] = {"status": JOB_QUEUED, "lease": None, "heartbeat_at": None}
    if not count_attempt:
        values["attempts"] = case((Job.attempts > 0, Job.attempts - 1), else_=0)
    if error is not None:
        values["error"] = stored_error(error)
    rows = session.execute(
        update(Job).where(Job.id == job_id, Job.lease == lease, Job.status == JOB_RUNNING).values(**values)
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]  # CursorResult
    if rows == 0 and not count_attempt and worker is not None:
        swept = (Job.id == job_id) & (Job.status == JOB_QUEUED) & Job.lease.is_(None) & (
            Job.error == DEAD_WORKER_NOTE) & (Job.worker == worker[:200])
        rows = session.execute(
            update(Job).where(swept).values(attempts=values["attempts"], error=values.get("error", Job.error))
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]  # CursorResult
    return bool(rows == 1)


DEAD_WORKER_NOTE = "its worker stopped (no heartbeat); queued again for a worker of its model"


def drop_final_checkpoints(session: Session) -> int:
    """Delete the checkpoints of finished jobs (left by versions that kept a cancelled or failed job's state
    blob); returns how many went."""
    final = select(Job.id).where(Job.status.in_(JOB_FINAL_STATUSES))
    result = session.execute(delete(JobCheckpoint).where(JobCheckpoint.job_id.in_(final)))
    return int(cast(CursorResult[Any], result).rowcount or 0)


class Requeued(NamedTuple):
    """What :func:`requeue_dead_jobs` did: jobs put back to ``queued``, and jobs cancelled (their cancel was asked
    while their worker was dead)."""

    queued: int
    cancelled: int


def requeue_dead_jobs(session: Session, *, stale_after_s: float, except_model: str | None = None) -> Requeued:
    """Put back to ``queued`` the running jobs whose worker died (heartbeat older than ``stale_after_s``; the
    death stays counted as an attempt, and the job's ``error`` says why it waits), except those of the model
    with fingerprint ``except_model`` (the caller's own, which it re-runs itself). Without this, a dead worker's
    job stayed ``running`` until a worker of its model came back, and a cancel waited for that worker. A job asked to
    cancel (its worker died before it saw the request) is cancelled instead, as a queued job is at once: it stayed
    ``queued`` with its cancel requested until a second cancel. Which jobs to cancel is read by the update itself
    (``RETURNING``): the rows it put back, with their flag as it changed them."""
    dead = (Job.status == JOB_RUNNING) & or_(Job.heartbeat_at.is_(None),
                                             Job.heartbeat_at < _stale_cutoff(session, stale_after_s))
    if except_model is not None:
        dead = dead & Job.space_id.in_(select(Space.id).where(Space.model_fingerprint != except_model))
    rows = session.execute(update(Job).where(dead).values(status=JOB_QUEUED, lease=None, heartbeat_at=None,
                                                          error=DEAD_WORKER_NOTE)
                           .returning(Job.id, Job.cancel_requested)
                           .execution_options(synchronize_session=False)).all()
    cancelled = 0
    for job_id, asked in rows:
        if asked:
            try:
                request_cancel(session, int(job_id))
                cancelled += 1
            except NotFound:  # gone meanwhile (another replica's sweep removed a deleted task's job)
                pass
    return Requeued(len(rows) - cancelled, cancelled)


def recoverable_jobs(
    session: Session, *, stale_after_s: float, queued_older_than_s: float | None = 0.0, limit: int = 1000,
    space_id: int | None = None, model_fingerprint: str | None = None,
) -> list[int]:
    """Ids of jobs a sweep should (re-)enqueue, oldest first: :func:`recoverable_job_statuses` without the
    statuses."""
    return [job_id for job_id, _ in recoverable_job_statuses(
        session, stale_after_s=stale_after_s, queued_older_than_s=queued_older_than_s, limit=limit,
        space_id=space_id, model_fingerprint=model_fingerprint)]


def recoverable_job_statuses(
    session: Session, *, stale_after_s: float, queued_older_than_s: float | None = 0.0, limit: int = 1000,
    space_id: int | None = None, model_fingerprint: str | None = None,
) -> list[tuple[int, str]]:
    """(id, status) of the jobs a sweep should (re-)enqueue, oldest first.

    Running jobs whose heartbeat is older than ``stale_after_s`` (their worker died) and, unless
    ``queued_older_than_s`` is ``None``, queued jobs created more than that many seconds ago (their
    wake-up may have been lost). ``space_id``: only jobs of that space (a worker sweeps the jobs of the
    model it serves) — the job's own ``space_id``, so a job whose task was deleted while its worker
    was dead is still recovered (and removed when it ends) instead of staying ``running`` for good.
    ``model_fingerprint``: only jobs of that model's spaces (an embedded runner serves its model's spaces; it
    failed another model's queued jobs, "run a worker with that model", when restarted on another model).
    """
    conds = [
        (Job.status == JOB_RUNNING) & or_(Job.heartbeat_at.is_(None),
                                          Job.heartbeat_at < _stale_cutoff(session, stale_after_s))
    ]
    if queued_older_than_s is not None:
        queued_cutoff = utcnow() - dt.timedelta(seconds=queued_older_than_s)
        conds.append((Job.status == JOB_QUEUED) & (Job.created_at <= queued_cutoff))
    stmt = select(Job.id, Job.status).where(or_(*conds))
    if space_id is not None:
        stmt = stmt.where(Job.space_id == space_id)
    if model_fingerprint is not None:
        stmt = stmt.where(Job.space_id.in_(select(Space.id).where(Space.model_fingerprint == model_fingerprint)))
    stmt = stmt.order_by(Job.id).limit(limit)
    return [(int(i), str(status)) for i, status in session.execute(stmt).all()]


def delete_job(session: Session, job_id: int) -> None:
    """Delete a job row (a job whose wake-up could not be sent, taken back by its request)."""
    session.execute(delete(Job).where(Job.id == job_id))
