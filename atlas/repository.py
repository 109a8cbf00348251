"""Repository functions for spaces, uploads, tasks and their stored results.

Every function takes a :class:`~sqlalchemy.orm.Session` and works inside the caller's transaction;
none of them commits. One unit of work is one transaction::

    with factory.begin() as session:
        task, job = create_task_with_job(session, space_id, "qa", "text", {}, samples)

so a rejected request (an exception) leaves nothing behind. Errors are :mod:`atlas.errors`
exceptions. Blobs are opaque bytes here (``SketchState.to_bytes``, ``BaselineSums.to_bytes``);
signatures are float32 vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import delete, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from atlas.changes import record_change
from atlas.errors import Conflict, InvalidInput, NotFound
from atlas.idempotency import job_by_key, replay, request_digest
from atlas.models import (
    CHANGE_DELETE,
    CHANGE_UPSERT,
    JOB_APPEND,
    JOB_CREATE,
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    TASK_FAILED,
    TASK_PENDING,
    TASK_READY,
    BaselineRow,
    Job,
    JobRequest,
    Signature,
    SketchStateRow,
    Task,
    Upload,
    utcnow,
)
from atlas.paging import Page as Page
from atlas.samples import Sample, check_metadata, is_storable_text, name_forms
from atlas.signature_repository import bytes_to_vectors as bytes_to_vectors
from atlas.signature_repository import count_signatures as count_signatures
from atlas.signature_repository import get_baseline_blob as get_baseline_blob
from atlas.signature_repository import get_baselines as get_baselines
from atlas.signature_repository import get_signatures as get_signatures
from atlas.signature_repository import get_state_blob as get_state_blob
from atlas.signature_repository import get_states as get_states
from atlas.signature_repository import iter_signatures as iter_signatures
from atlas.signature_repository import vector_to_bytes as vector_to_bytes
from atlas.space_repository import current_model_key as current_model_key
from atlas.space_repository import get_or_create_space as get_or_create_space
from atlas.space_repository import get_space as get_space
from atlas.space_repository import list_spaces as list_spaces
from atlas.space_repository import list_tasks as list_tasks
from atlas.task_names import normalize_name
from atlas.upload_repository import decode_samples as decode_samples
from atlas.upload_repository import encode_samples as encode_samples
from atlas.upload_repository import get_or_create_upload as get_or_create_upload
from atlas.upload_repository import held_by_import, purge_orphan_uploads_now
from atlas.upload_repository import load_upload_samples as load_upload_samples
from atlas.upload_repository import purge_orphan_uploads as purge_orphan_uploads
from atlas.vocabulary import Mode

T = TypeVar("T")

MODES = tuple(Mode)


def check_mode(mode: object) -> None:
    """Raise :class:`InvalidInput` unless ``mode`` is ``text`` or ``completion``."""
    if mode not in MODES:
        raise InvalidInput(f"mode must be one of {', '.join(MODES)}", {"mode": mode})


# --------------------------------------------------------------------------------------------------
# Spaces
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# Uploads
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------------


def free_failed_name(session: Session, space_id: int, name: str) -> None:
    """Delete a task of this name whose creation failed or was cancelled (``failed``, no signature),
    so that its name can be used again."""
    old = session.execute(
        select(Task).where(Task.space_id == space_id, Task.name == name, Task.status == TASK_FAILED)
    ).scalar_one_or_none()
    if old is None:
        return
    if session.execute(select(exists().where(Signature.task_id == old.id))).scalar_one():
        return
    if session.execute(select(exists().where(Job.task_id == old.id, Job.status.in_((JOB_QUEUED, JOB_RUNNING))))
                       ).scalar_one():
        return
    delete_task(session, old.id)


def _add_job(
    session: Session, kind: str, task: Task, upload: Upload, n_samples: int, idempotency_key: str | None,
    digest: str,
) -> Job:
    """Queue a ``kind`` job for ``task`` over ``upload``; a concurrent use of the key is a :class:`Conflict`."""
    job = Job(
        kind=kind, space_id=task.space_id, task_id=task.id, upload_id=upload.id, status=JOB_QUEUED,
        progress={"samples_done": 0, "samples_total": n_samples}, idempotency_key=idempotency_key,
        attempts=0, cancel_requested=False,
    )
    try:
        with session.begin_nested():
            session.add(job)
    except IntegrityError:
        if idempotency_key is not None and job_by_key(session, idempotency_key) is not None:
            raise Conflict(
                "a request with this idempotency key is being processed; retry", {"idempotency_key": idempotency_key}
            ) from None
        if session.execute(select(exists().where(Task.id == task.id))).scalar_one():
            raise
        raise NotFound(f"task {task.id} was deleted meanwhile", {"task_id": task.id}) from None
    if idempotency_key is not None:
        session.add(JobRequest(job_id=job.id, request_sha256=digest))
    return job


def create_task_with_job(
    session: Session,
    space_id: int,
    name: str,
    mode: str,
    metadata: dict[str, Any] | None,
    samples: Sequence[Sample],
    idempotency_key: str | None = None,
) -> tuple[Task, Job]:
    """:func:`create_or_replay_task` without its ``created`` flag."""
    task, job, _ = create_or_replay_task(session, space_id, name, mode, metadata, samples, idempotency_key)
    return task, job


def create_or_replay_task(
    session: Session,
    space_id: int,
    name: str,
    mode: str,
    metadata: dict[str, Any] | None,
    samples: Sequence[Sample],
    idempotency_key: str | None = None,
) -> tuple[Task, Job, bool]:
    """Create a pending task, store its samples and queue its ``create`` job — all or nothing.

    Parameters
    ----------
    space_id
        The space of the model and sketch spec the task is computed in.
    name
        Unique within the space.
    mode
        ``"text"`` or ``"completion"``.
    metadata
        User metadata (a JSON object).
    samples
        The task's samples, in upload order.
    idempotency_key
        Optional client key: repeating the request with the same key returns the stored task and
        job instead of creating new ones.

    Returns
    -------
    (Task, Job, created)
        The new (or, for a repeated key, the stored) task and job, and whether this call created them (a caller
        that wakes a runner, and takes the task back when that fails, must do so only for its own task — a
        concurrent request with the same key may have created it).

    Raises
    ------
    Conflict
        The name exists in the space, or the key was used for a different request.
    NotFound
        Unknown space.
    InvalidInput
        Bad name, mode, metadata or no samples.
    """
    name = normalize_name(name)
    check_mode(mode)
    meta = check_metadata(metadata)
    digest = request_digest(JOB_CREATE, samples, space_id=space_id, name=name, mode=mode, metadata=meta)
    if idempotency_key is not None:
        job = job_by_key(session, idempotency_key)
        if job is not None:
            return *replay(session, job, JOB_CREATE, samples, digest, name=name, space_id=space_id, mode=mode), False
    get_space(session, space_id)
    free_failed_name(session, space_id, name)
    upload = get_or_create_upload(session, samples)
    task = Task(space_id=space_id, name=name, mode=mode, meta=meta, status=TASK_PENDING, n_samples=0, n_tokens=0)
    try:
        with session.begin_nested():
            session.add(task)
    except IntegrityError:
        if idempotency_key is not None and (job := job_by_key(session, idempotency_key)) is not None:
            return *replay(session, job, JOB_CREATE, samples, digest, name=name, space_id=space_id, mode=mode), False
        raise Conflict(f"a task named {name!r} already exists in this space: append to it, or delete it first",
                       {"name": name}) from None
    return task, _add_job(session, JOB_CREATE, task, upload, len(samples), idempotency_key, digest), True


def append_samples(
    session: Session, task_id: int, samples: Sequence[Sample], idempotency_key: str | None = None
) -> Job:
    """Store more samples for an existing task and queue an ``append`` job.

    The job sketches only the new samples and merges its state into the task's stored state when it
    finishes (merging is exact: states are sums), then updates the signature and the index entry.
    """
    digest = request_digest(JOB_APPEND, samples, task_id=task_id)
    if idempotency_key is not None:
        job = job_by_key(session, idempotency_key)
        if job is not None:
            return replay(session, job, JOB_APPEND, samples, digest, id=task_id)[1]
    task = lock_task(session, task_id)  # a delete of the task waits for this job, which it then takes with it
    if task is None:
        raise NotFound(f"task {task_id} does not exist", {"task_id": task_id})
    if idempotency_key is not None:  # the same request through another replica, stored while this one waited for
        job = job_by_key(session, idempotency_key)  # the lock: its replay (it was refused as a repeated upload, 409)
        if job is not None:
            return replay(session, job, JOB_APPEND, samples, digest, id=task_id)[1]
    upload = get_or_create_upload(session, samples)
    _refuse_repeated_upload(session, task, upload)
    return _add_job(session, JOB_APPEND, task, upload, len(samples), idempotency_key, digest)


def _refuse_repeated_upload(session: Session, task: Task, upload: Upload) -> None:
    """409 when a job of ``task`` that succeeded or may still succeed already holds ``upload`` (the same samples,
    content-addressed): appending the file a task was made from counted every sample twice, silently."""
    earlier = session.execute(
        select(Job.id).where(Job.task_id == task.id, Job.upload_id == upload.id,
                             Job.status.in_([JOB_QUEUED, JOB_RUNNING, JOB_SUCCEEDED])).limit(1)
    ).scalar_one_or_none()
    how = f"job {earlier} added the same upload" if earlier is not None else (
        "it was imported with the same upload" if held_by_import(session, task.id, upload.sha256) else None)
    if how is not None:
        raise Conflict(
            f"task {task.name!r} already holds these {upload.n_samples} samples ({how}: same samples, same order); "
            "appending them again would count each twice. To weight samples, repeat them within one upload.",
            {"task_id": task.id, "job_id": None if earlier is None else int(earlier)})


def get_task(session: Session, task_id: int) -> Task:
    """Return a task or raise :class:`NotFound`."""
    task = session.get(Task, task_id)
    if task is None:
        raise NotFound(f"task {task_id} does not exist", {"task_id": task_id})
    return task


def get_task_by_name(session: Session, space_id: int, name: str) -> Task:
    """Return the task called ``name`` in a space or raise :class:`NotFound`."""
    task = session.execute(select(Task).where(Task.space_id == space_id, Task.name.in_(name_forms(name)))
                           .order_by(Task.id)).scalars().first() if is_storable_text(name) else None
    if task is None:
        raise NotFound(f"no task named {name!r}", {"space_id": space_id, "name": name})
    return task


def get_tasks(session: Session, task_ids: Sequence[int]) -> list[Task]:
    """Tasks in the order of ``task_ids``; raises :class:`NotFound` naming the missing ids."""
    rows = {t.id: t for t in session.execute(select(Task).where(Task.id.in_(list(task_ids)))).scalars()}
    missing = [i for i in task_ids if i not in rows]
    if missing:
        raise NotFound(f"tasks do not exist: {missing}", {"task_ids": missing})
    return [rows[i] for i in task_ids]


def task_names(session: Session, task_ids: Sequence[int]) -> dict[int, str]:
    """The names of those of the tasks ``task_ids`` that exist, by id (a deleted one is left out)."""
    if not task_ids:
        return {}
    return {int(i): str(n) for i, n in session.execute(
        select(Task.id, Task.name).where(Task.id.in_([int(t) for t in task_ids])))}


def lock_task(session: Session, task_id: int) -> Task | None:
    """Load a task with a row lock (PostgreSQL ``FOR UPDATE``) for a read-modify-write; ``None`` if gone."""
    stmt = select(Task).where(Task.id == task_id).with_for_update(of=Task).execution_options(populate_existing=True)
    return session.execute(stmt).scalar_one_or_none()


def update_task(
    session: Session,
    task_id: int,
    *,
    name: str | None = None,
    metadata: dict[str, Any] | None = None,
    replace_metadata: bool = False,
) -> Task:
    """Rename a task and/or change its metadata.

    ``metadata`` is merged key by key (a ``None`` value removes the key, as in JSON merge patch)
    unless ``replace_metadata`` is true.
    """
    task = lock_task(session, task_id)
    if task is None:
        raise NotFound(f"task {task_id} does not exist", {"task_id": task_id})
    if metadata is not None:
        patch = check_metadata(metadata)
        if replace_metadata:
            task.meta = {k: v for k, v in patch.items() if v is not None}
        else:
            merged = dict(task.meta or {})
            for key, value in patch.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            task.meta = check_metadata(merged, where="the merged metadata")
    renamed = name is not None and normalize_name(name) != task.name
    if name is not None and renamed:
        free_failed_name(session, task.space_id, normalize_name(name))  # as a create of that name may (not this task)
        task.name = normalize_name(name)
        try:
            with session.begin_nested():
                session.flush()
        except IntegrityError:
            raise Conflict(f"a task named {name!r} already exists in this space", {"name": name}) from None
    task.updated_at = utcnow()
    session.flush()
    if renamed and task.status == TASK_READY:  # caches keyed by task (atlas.state_cache) follow the log
        record_change(session, task.space_id, task.id, CHANGE_UPSERT)
    return task


def delete_task(session: Session, task_id: int) -> None:
    """Delete a task with its state, signature and baselines, and log a delete change.

    Its queued jobs are cancelled and removed with their finished jobs; a running job is asked to
    cancel and removed when it stops (its final transaction finds the task gone), with its samples.
    Samples no job references any more are deleted.
    """
    # Lock order: its running job rows, then the task row — as a job's final transaction takes them (its job,
    # then its task); the other order deadlocks with a job ending at the same moment (PostgreSQL).
    session.execute(select(Job.id).where(Job.task_id == task_id, Job.status == JOB_RUNNING).with_for_update())
    task = lock_task(session, task_id)
    if task is None:
        raise NotFound(f"task {task_id} does not exist", {"task_id": task_id})
    had_signature = session.execute(select(exists().where(Signature.task_id == task_id))).scalar_one()
    session.execute(
        update(Job).where(Job.task_id == task_id, Job.status == JOB_RUNNING)
        .values(cancel_requested=True)
    )
    session.execute(delete(Job).where(Job.task_id == task_id, Job.status != JOB_RUNNING))
    session.execute(delete(Task).where(Task.id == task_id))
    session.expunge(task)
    purge_orphan_uploads_now(session)  # a running job's samples go when it stops (job_store.finish_locked)
    if had_signature:  # last: the change-sequence row lock is held only until commit
        record_change(session, task.space_id, task_id, CHANGE_DELETE)


# --------------------------------------------------------------------------------------------------
# Stored results
# --------------------------------------------------------------------------------------------------


def store_task_result(
    session: Session,
    task: Task,
    *,
    state: bytes,
    signature: np.ndarray,
    baselines: bytes | None,
    n_samples: int,
    n_tokens: int,
) -> int:
    """Write a task's (already merged) state, signature and baselines; mark it ready; log the change.

    Call it inside the transaction that also finishes the job, after :func:`lock_task`.

    Returns
    -------
    int
        The sequence number of the ``upsert`` change.
    """
    space = task.space
    vec = vector_to_bytes(signature, space.m)
    now = utcnow()
    rows: list[tuple[type[Any], dict[str, Any]]] = [(SketchStateRow, {"blob": state}), (Signature, {"vector": vec})]
    if baselines is not None:
        rows.append((BaselineRow, {"blob": baselines}))
    for model, values in rows:
        row = session.get(model, task.id, populate_existing=True)
        if row is None:
            extra = {"space_id": task.space_id} if model is Signature else {}
            session.add(model(task_id=task.id, version=1, updated_at=now, **values, **extra))
        else:
            for key, value in values.items():
                setattr(row, key, value)
            row.version = row.version + 1
            row.updated_at = now
    task.n_samples = int(n_samples)
    task.n_tokens = int(n_tokens)
    task.status = TASK_READY
    task.version = (task.version or 0) + 1
    task.updated_at = now
    session.flush()
    return record_change(session, task.space_id, task.id, CHANGE_UPSERT)


def create_ready_task(
    session: Session,
    space_id: int,
    name: str,
    mode: str,
    metadata: dict[str, Any] | None,
    *,
    state: bytes,
    signature: np.ndarray,
    baselines: bytes | None,
    n_samples: int,
    n_tokens: int,
    keep_form: bool = False,
) -> Task:
    """Create a task that already has its results (import/restore): no upload, no job. ``keep_form``: the name is
    not NFC-normalised (:func:`atlas.task_names.normalize_name`).

    Raises :class:`Conflict` when the name exists in the space; logs the ``upsert`` change.
    """
    name = normalize_name(name, imported=True, keep_form=keep_form)  # an export's names
    check_mode(mode)
    get_space(session, space_id)
    task = Task(space_id=space_id, name=name, mode=mode, meta=check_metadata(metadata), status=TASK_PENDING,
                n_samples=0, n_tokens=0, version=0)
    try:
        with session.begin_nested():
            session.add(task)
    except IntegrityError:
        raise Conflict(f"a task named {name!r} already exists in this space", {"name": name}) from None
    store_task_result(session, task, state=state, signature=signature, baselines=baselines, n_samples=n_samples,
                      n_tokens=n_tokens)
    return task


def mark_task_failed_if_empty(session: Session, task_id: int) -> None:
    """Set a task ``failed`` if it has no signature yet (its creation did not succeed)."""
    session.execute(
        update(Task)
        .where(Task.id == task_id, Task.status == TASK_PENDING)
        .values(status=TASK_FAILED, updated_at=utcnow())
    )
