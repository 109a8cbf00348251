"""Tasks: create and append (validated, stored all or nothing, then queued), list, get, patch, delete."""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from atlas import job_store
from atlas import repository as repo
from atlas import space_repository as sql
from atlas.db import read_snapshot
from atlas.errors import AtlasError, IncompatibleSpace, InvalidInput, PayloadTooLarge, QueueFull, QueueUnavailable
from atlas.idempotency import job_by_key
from atlas.index import IndexManager
from atlas.models import JOB_QUEUED, Job, Space, Task
from atlas.ports import serving_key
from atlas.queue import JobQueue
from atlas.samples import Sample, is_blank, is_storable_text, main_field, sample_chars
from atlas.services.states import StateLoader
from atlas.store import Store
from atlas.upload_repository import EncodedSamples

log = logging.getLogger(__name__)


class TaskService:
    """Task lifecycle (see the module docstring).

    Parameters
    ----------
    store, index, states
        The store, the FAISS index manager and the state loader (its cache is dropped on delete).
    queue
        Wakes a runner for each new job.
    computable
        ``computable(space)`` raises ``ModelUnavailable``/``IncompatibleSpace`` when no model of this
        deployment can compute signatures in ``space`` (checked before anything is stored).
    """

    def __init__(self, store: Store, index: IndexManager, states: StateLoader, queue: JobQueue,
                 computable: Callable[[Space], None]) -> None:
        self.store = store
        self.settings = store.settings
        self.index = index
        self.states = states
        self.queue = queue
        self.computable = computable

    # -- validation ------------------------------------------------------------------------------

    def check_samples(self, samples: Sequence[Sample]) -> None:
        """Enforce the sample-count and sample-length limits (413) and non-emptiness (422: no sample, or every
        sample blank)."""
        s = self.settings
        if not samples:
            raise InvalidInput("the upload holds no samples")
        if len(samples) > s.max_samples:
            raise PayloadTooLarge(
                f"{len(samples)} samples exceed the limit of {s.max_samples} per upload",
                {"samples": len(samples), "max_samples": s.max_samples},
            )
        filled = False  # a sample with something to sketch (its main field not blank)
        for i, smp in enumerate(samples):
            filled = filled or not is_blank(main_field(smp))
            n = sample_chars(smp)
            if n > s.max_sample_chars:
                raise PayloadTooLarge(
                    f"sample {i} has {n} characters; the limit is {s.max_sample_chars}",
                    {"sample": i, "chars": n, "max_sample_chars": s.max_sample_chars},
                )
        if not filled:  # nothing to sketch: its job could only fail
            raise InvalidInput(f"every sample is blank ({len(samples)} sample(s)): a text sample needs a non-blank "
                               "'text', a pair a non-blank 'completion'", {"samples": len(samples)})

    @staticmethod
    def _is_replay(session: Session, idempotency_key: str | None) -> bool:
        """A repeated request (its key is stored): answered from the store, it queues nothing new."""
        return idempotency_key is not None and job_by_key(session, idempotency_key) is not None

    def _check_queue(self, session: Session, space: Space) -> None:
        """Refuse a new job when the queue of the space's model is full (429): jobs waiting for the same workers.
        Another model's leftover jobs (no worker of it running) filled the one cluster-wide count and refused
        every upload."""
        depth = job_store.count_jobs(session, (JOB_QUEUED,), model_fingerprint=space.model_fingerprint)
        if depth >= self.settings.max_queued_jobs:
            raise QueueFull(
                f"the job queue of model {space.model_name!r} is full ({depth} queued jobs); retry later",
                {"queued": depth, "max_queued_jobs": self.settings.max_queued_jobs, "model": space.model_name},
                retry_after_s=5.0,
            )

    def _check_computable(self, *, space_ref: str | None = None, task_id: int | None = None) -> None:
        """``computable`` for the space named (or the task's), outside any transaction: it may ask the worker
        registry (Redis), and a hung Redis held the write transaction — and a database connection — for its
        timeouts."""
        with self.store.read() as session:
            space = (repo.get_task(session, task_id).space if task_id is not None
                     else self.store.resolve_space(session, space_ref))
            session.expunge(space)  # its columns stay readable once the session is gone
        self.computable(space)

    def _enqueue(self, job_id: int, task_id: int | None, key: str, *, created: bool) -> None:
        """Wake a runner for the job on the queue of its space's model (``key``: its serving key) — a scale-out
        worker consumes only that one (a job sent to the base queue waited for a worker's sweep, and its
        message was never consumed); take back what the request wrote if that fails."""
        try:
            self.queue.enqueue(job_id, key)
        except Exception as exc:
            # Nothing half-stored: take back what this request wrote.
            with self.store.session() as session:
                if created and task_id is not None:
                    repo.delete_task(session, task_id)
                else:
                    job_store.delete_job(session, job_id)
                    repo.purge_orphan_uploads(session)
            if isinstance(exc, AtlasError):
                raise
            raise QueueUnavailable(f"the job queue is unreachable, nothing was stored; retry later ({exc})") from exc

    # -- writes ----------------------------------------------------------------------------------

    def create(self, name: str, mode: str, metadata: dict[str, Any] | None, samples: Sequence[Sample],
               space_ref: str | None = None, idempotency_key: str | None = None) -> tuple[Task, Job]:
        """Validate, store the task and its samples, and queue its job (all or nothing)."""
        self.check_samples(samples)
        self._check_computable(space_ref=space_ref)
        samples = EncodedSamples(samples)  # before the write transaction: see EncodedSamples
        with self.store.session() as session:
            space = self.store.resolve_space(session, space_ref)
            replay = self._is_replay(session, idempotency_key)
            if not replay:
                self._check_queue(session, space)
            task, job, created = repo.create_or_replay_task(session, space.id, name, mode, metadata, samples,
                                                            idempotency_key=idempotency_key)
            # a replay is not woken again: a failed wake-up would take back the first request's task (its lost
            # wake-up, if any, is recovered by the sweep) — a concurrent request's too, with the same key, that won
            # the race for the name after this one found no job of its key
            fresh = created and job.status == JOB_QUEUED and job.attempts == 0
            key = serving_key(space.model_fingerprint, space.spec_fingerprint)
        if fresh:
            self._enqueue(job.id, task.id, key, created=True)
        return task, job

    def append(self, task_id: int, samples: Sequence[Sample], idempotency_key: str | None = None) -> Job:
        """Store more samples for a task and queue an ``append`` job."""
        self.check_samples(samples)
        self._check_computable(task_id=task_id)
        samples = EncodedSamples(samples)  # before the write transaction: see EncodedSamples
        with self.store.session() as session:
            task = repo.get_task(session, task_id)
            replay = self._is_replay(session, idempotency_key)
            if not replay:
                self._check_queue(session, task.space)
            job = repo.append_samples(session, task_id, samples, idempotency_key=idempotency_key)
            fresh = not replay and job.status == JOB_QUEUED and job.attempts == 0  # see create
            key = serving_key(task.space.model_fingerprint, task.space.spec_fingerprint)
        if fresh:
            self._enqueue(job.id, task_id, key, created=False)
        return job

    def patch(self, task_id: int, metadata: dict[str, Any] | None = None, *, name: str | None = None) -> Task:
        """Rename a task (``name``: unique in its space, 409 otherwise) and/or merge ``metadata`` into its metadata;
        a ready task's rename is logged as a change, so caches keyed by task and other replicas follow it."""
        with self.store.session() as session:
            return repo.update_task(session, task_id, name=name, metadata=metadata)

    def delete(self, task_id: int) -> None:
        """Delete a task from the store, then from the index."""
        with self.store.session() as session:
            space_id = repo.get_task(session, task_id).space_id
            repo.delete_task(session, task_id)
        self.states.drop(task_id)
        try:
            self.index.catch_up(space_id)
        except Exception:
            log.warning("index catch-up after delete failed (the background sync retries)", exc_info=True)

    # -- reads -----------------------------------------------------------------------------------

    def get(self, task_id: int) -> Task:
        """One task."""
        with self.store.read() as session:
            return repo.get_task(session, task_id)

    def find(self, name: str, space_ref: str | None = None) -> Task:
        """A task by exact name (the default space's first)."""
        page = self.page(space_ref=space_ref, name=name, name_prefix=None, status=None, offset=0, limit=1)
        if not page.items:
            from atlas.errors import NotFound

            raise NotFound(f"no task named {name!r}", {"name": name})
        return page.items[0]

    def page(self, *, space_ref: str | None = None, name: str | None = None, name_prefix: str | None = None,
             status: str | None = None, task_ids: Sequence[int] | None = None, offset: int = 0, limit: int = 50
             ) -> repo.Page[Task]:
        """List tasks with filters (``name``: exact, normalised like a stored name — stripped; ``name_prefix``:
        prefix, in NFC as stored names are: a decomposed "cafe\u0301" finds "café"; ``task_ids``: only these)."""
        name = name.strip() if name is not None else None
        name_prefix = unicodedata.normalize("NFC", name_prefix) if name_prefix else name_prefix
        with self.store.read() as session:
            read_snapshot(session)
            space_id = self.store.resolve_space(session, space_ref).id if space_ref is not None else None
            if not all(is_storable_text(t) for t in (name, name_prefix) if t is not None):
                return repo.Page(items=[], total=0, offset=offset, limit=limit)  # no stored name holds a NUL
            if name is None:
                return repo.list_tasks(session, space_id=space_id, name_prefix=name_prefix, status=status,
                                       task_ids=task_ids, offset=offset, limit=limit)
            return sql.tasks_by_exact_name(session, name, space_id=space_id, status=status, name_prefix=name_prefix,
                                           default_space_id=self.store.default_space_id, offset=offset, limit=limit,
                                           task_ids=task_ids)


def require_same_space(space: Space, served_space_id: int | None) -> None:
    """Raise ``IncompatibleSpace`` unless ``space`` is the one this process computes in."""
    if served_space_id is not None and space.id != served_space_id:
        raise IncompatibleSpace(
            f"space {space.id} (model {space.model_name!r}) is not the space of the loaded model; "
            "this service can only compute signatures in its own space",
            {"space_id": space.id, "default_space_id": served_space_id},
        )
