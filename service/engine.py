"""The service engine: everything the HTTP layer needs, with no HTTP in it.

:class:`AtlasEngine` owns the database engine and sessions, the loaded model and its sketcher, the
default space, the FAISS :class:`~atlas.index.IndexManager`, the job queue (in-process runner or
Celery) and the caches of :mod:`service.caches` (deserialised states, prompt states). It answers the
API's questions by loading states and signatures from the store and calling the pure query functions
of :mod:`atlas.analysis`; space export/import is :mod:`atlas.space_io`. Routes stay thin: parse,
authorise, call one engine method in a worker thread, render.

Started and stopped by the app lifespan (:func:`service.app.create_app`); if the model cannot be
loaded the engine still starts, ``ready`` is false and model-needing calls raise
:class:`~atlas.errors.ModelUnavailable` (503).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from atlas import analysis, changes, job_store, space_io
from atlas import repository as repo
from atlas.db import make_engine, session_factory, upgrade
from atlas.errors import (
    AtlasError,
    Conflict,
    IncompatibleSpace,
    InvalidInput,
    ModelUnavailable,
    NotFound,
    NotReady,
    PayloadTooLarge,
    QueueFull,
)
from atlas.index import IndexManager
from atlas.models import (
    JOB_FINAL_STATUSES,
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_STATUSES,
    JOB_SUCCEEDED,
    TASK_READY,
    Job,
    SketchStateRow,
    Space,
    Task,
)
from atlas.samples import Sample
from atlas.settings import Settings
from service.auth import check_bind_allowed, count_active_keys, keys_required
from service.caches import PROMPT_CACHE_BYTES, STATE_CACHE_BYTES, PromptCache, StateCache
from service.metrics import Metrics
from workers.inprocess import InProcessRunner
from workers.jobs import progress_view

logger = logging.getLogger("fisher_atlas.service")

MAX_PENDING_PROMPTS = 256
"""Prompts waiting for the model beyond which ``/v1/route`` answers 429 (overload)."""


@dataclass
class Timings:
    """Server-side stage timings of one request, in seconds."""

    wait_s: float = 0.0
    forward_s: float = 0.0
    search_s: float = 0.0
    cached: int = 0

    def header(self) -> str:
        """``Server-Timing`` value in ms: ``wait`` for the model, its ``forward`` (``desc``: prompt states
        taken from the cache instead), ``search`` (FAISS + state loading + exact re-rank)."""
        return (f"wait;dur={self.wait_s * 1e3:.3f}, forward;dur={self.forward_s * 1e3:.3f};"
                f'desc="cached={self.cached}", search;dur={self.search_s * 1e3:.3f}')


@dataclass
class Loaded:
    """A task with its deserialised state (and the state's cached route view)."""

    task_id: int
    name: str
    state: Any
    view: Any = None


class AtlasEngine:
    """HTTP-agnostic service core (see the module docstring).

    Parameters
    ----------
    settings
        Validated settings.
    overrides
        Test and benchmark hooks: ``lm`` (an already loaded :class:`workers.model_loading.LoadedModel`,
        or ``None`` to simulate a model that failed to load), ``migrate`` (bool, default true),
        ``start_runner`` (bool, default true: run queued jobs in-process when ``queue="inprocess"``).
    """

    def __init__(self, settings: Settings, overrides: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.overrides = dict(overrides or {})
        self.metrics = Metrics()
        self.keys_required = keys_required(settings)
        self.lm: Any = None
        self.model_error: str | None = None
        self.sketcher: Any = None
        self.spec: Any = None
        self.extractor: Any = None
        self.space_id: int | None = None
        self.db: Engine | None = None
        self.index: IndexManager | None = None
        self.queue: Any = None  # InProcessRunner or workers.celery_app.CeleryJobQueue
        self.runner: InProcessRunner | None = None
        self.started = False
        self._forward_lock = threading.Lock()
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._bg: threading.Thread | None = None
        self._specs: dict[int, Any] = {}
        self.states = StateCache(1)
        self.prompts = PromptCache(0)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Migrate, load the model, open the index, start the queue (the app lifespan calls this).

        If any step fails, what the earlier steps opened (pool, runner threads) is closed again.
        """
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        url = s.resolved_database_url()
        if self.overrides.get("migrate", True):
            upgrade(url)
        self.db = make_engine(url, pool_size=8)
        self.write: sessionmaker[Session] = session_factory(self.db)
        self.read: sessionmaker[Session] = session_factory(self.db, readonly=True)
        with self.read() as session:
            check_bind_allowed(s, count_active_keys(session))
        self.states = StateCache(STATE_CACHE_BYTES // (48 * s.sketch_dim))
        self.prompts = PromptCache(PROMPT_CACHE_BYTES // (48 * s.sketch_dim))
        self._load_model()
        self.index = IndexManager(self.read, s.data_dir / "index", kind=s.index_kind, nprobe=s.index_nprobe,
                                  ivf_min_size=s.index_ivf_min_size)
        self.index.open()
        self._start_queue()
        self.metrics.watch_store(self.store_stats)
        self._bg = threading.Thread(target=self._background, name="atlas-index-sync", daemon=True)
        self._bg.start()
        self.started = True

    def stop(self) -> None:
        """Stop the runner and the background thread, persist the index, close the broker and the pool."""
        self._stop.set()
        try:
            if self.runner is not None:  # in-process: the runner is the queue
                self.runner.stop()
            elif self.queue is not None:  # Celery: release the broker connections
                self.queue.close()
        except Exception:
            logger.warning("stopping the job queue failed", exc_info=True)
        if self._bg is not None:
            self._bg.join(timeout=5)
        if self.index is not None:
            try:
                self.index.catch_up()
                self.index.persist()
            except Exception:
                logger.warning("persisting the index failed", exc_info=True)
        if self.db is not None:
            self.db.dispose()
        self.started = False

    def _load_model(self) -> None:
        from fishersketch import Sketcher, SketchSpec
        from workers.extraction import Extractor

        s = self.settings
        if "lm" in self.overrides:
            self.lm = self.overrides["lm"]
            if self.lm is None:
                self.model_error = "no model loaded (disabled by the caller)"
        else:
            from workers.model_loading import load_configured_model

            try:
                self.lm = load_configured_model(s)
            except Exception as exc:
                self.model_error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                logger.error("model %r could not be loaded: %s", s.model, self.model_error)
        if self.lm is None:
            return
        self.spec = SketchSpec(d=self.lm.d, K=self.lm.K, m=s.sketch_dim, seed=s.sketch_seed,
                               error_projection=s.error_projection)
        self.sketcher = Sketcher(self.spec, device=str(self.lm.device))
        self.extractor = Extractor(self.lm, self.sketcher, max_tokens_per_sample=s.max_tokens_per_sample)
        fp = self.lm.fingerprint
        with self.write.begin() as session:
            space = repo.get_or_create_space(
                session, model_fingerprint=fp.key(), spec_fingerprint=self.spec.fingerprint(),
                model_name=fp.name, d=self.spec.d, K=self.spec.K, m=self.spec.m, seed=self.spec.seed,
                spec=self.spec.to_dict(),
            )
            self.space_id = int(space.id)
        self._specs[self.space_id] = self.spec

    def _start_queue(self) -> None:
        from service.jobqueue import make_queue

        self.queue, self.runner = make_queue(self)

    def _background(self) -> None:
        """Keep the index caught up with SQL (other replicas, workers) and persisted."""
        last_persist = time.monotonic()
        while not self._stop.wait(1.0):
            try:
                self.index.catch_up(wait=False)
                if time.monotonic() - last_persist > 30:
                    self.index.persist()
                    last_persist = time.monotonic()
            except Exception:
                logger.warning("index sync failed", exc_info=True)

    # -- sessions --------------------------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A read-write transaction (committed on success)."""
        with self.write.begin() as session:
            yield session

    # -- health ----------------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, bool], dict[str, Any]]:
        """Whether the service can answer every request: database, model, index."""
        checks = {"database": False, "model": self.lm is not None, "index": self.index is not None}
        detail: dict[str, Any] = {}
        try:
            with self.read() as session:
                session.execute(text("SELECT 1"))
            checks["database"] = True
        except Exception as exc:
            detail["database"] = f"{type(exc).__name__}"
        if self.lm is None:
            detail["model"] = self.model_error or "not loaded"
        else:
            detail["model"] = self.lm.name
        ready = all(checks.values())
        return ready, checks, detail

    def store_stats(self) -> dict[str, Any]:
        """Job and queue figures for ``/metrics`` (read from SQL at scrape time)."""
        out: dict[str, Any] = {"by_status": {s: 0 for s in JOB_STATUSES}}
        with self.read() as session:
            from sqlalchemy import func

            for status, n in session.execute(select(Job.status, func.count()).group_by(Job.status)):
                out["by_status"][str(status)] = int(n)
            rows = session.execute(
                select(Job.started_at, Job.finished_at, Job.progress).where(Job.status == JOB_SUCCEEDED)
                .order_by(Job.finished_at)
            ).all()
        durations = [(f - s).total_seconds() for s, f, _ in rows if s is not None and f is not None]
        out["duration_count"] = len(durations)
        out["duration_sum"] = float(sum(durations))
        out["tokens_total"] = int(sum(int((p or {}).get("tokens", 0) or 0) for _, _, p in rows))
        out["last_tokens_per_s"] = float((rows[-1][2] or {}).get("tokens_per_s", 0.0) or 0.0) if rows else 0.0
        out["queue_depth"] = out["by_status"].get(JOB_QUEUED, 0) + out["by_status"].get(JOB_RUNNING, 0)
        if self.space_id is not None and self.index is not None:
            out["index_size"] = int(self.index.stats(self.space_id)["count"])
        return out

    # -- spaces ----------------------------------------------------------------------------------

    @property
    def route_threshold(self) -> float:
        """Default open-set threshold (``settings.route_threshold``, see
        :data:`atlas.analysis.DEFAULT_ROUTE_THRESHOLD`)."""
        return float(self.settings.route_threshold)

    def require_model(self) -> None:
        """Raise :class:`ModelUnavailable` unless a model is loaded."""
        if self.lm is None or self.space_id is None:
            raise ModelUnavailable(
                f"the model {self.settings.model!r} is not loaded: {self.model_error or 'unknown reason'}",
                {"model": self.settings.model},
            )

    def resolve_space(self, session: Session, ref: str | int | None) -> Space:
        """A space by id, ``"default"``/``None`` (the loaded model's) or model name (if unique)."""
        if ref is None or (isinstance(ref, str) and ref.strip().lower() in ("", "default")):
            self.require_model()
            assert self.space_id is not None
            return repo.get_space(session, self.space_id)
        if isinstance(ref, int) or (isinstance(ref, str) and ref.isascii() and ref.isdigit()):
            space_id = int(ref)
            if space_id > 2**62:
                raise NotFound(f"space {ref} does not exist", {"space": str(ref)})
            return repo.get_space(session, space_id)
        rows = list(session.execute(select(Space).where(Space.model_name == ref).order_by(Space.id)).scalars())
        if not rows:
            raise NotFound(f"no space named {ref!r}", {"space": ref})
        if len(rows) > 1:
            if self.space_id is not None and any(r.id == self.space_id for r in rows):
                return next(r for r in rows if r.id == self.space_id)
            raise Conflict(f"several spaces use model {ref!r}; pass the space id", {"ids": [r.id for r in rows]})
        return rows[0]

    def spec_of(self, space: Space) -> Any:
        """The :class:`fishersketch.SketchSpec` of a space."""
        spec = self._specs.get(space.id)
        if spec is None:
            from fishersketch import SketchSpec

            spec = SketchSpec.from_dict(space.spec)
            self._specs[space.id] = spec
        return spec

    def list_spaces(self) -> list[dict[str, Any]]:
        """Every space with its task count."""
        from sqlalchemy import func

        with self.read() as session:
            counts = dict(session.execute(select(Task.space_id, func.count()).group_by(Task.space_id)).all())
            return [
                {"id": s.id, "model_name": s.model_name, "model_fingerprint": s.model_fingerprint,
                 "spec_fingerprint": s.spec_fingerprint, "d": s.d, "K": s.K, "m": s.m, "seed": s.seed,
                 "spec": s.spec, "n_tasks": int(counts.get(s.id, 0)), "default": s.id == self.space_id}
                for s in repo.list_spaces(session)
            ]

    # -- tasks and jobs --------------------------------------------------------------------------

    def check_samples(self, samples: Sequence[Sample]) -> None:
        """Enforce the sample-count and sample-length limits (413) and non-emptiness (422)."""
        s = self.settings
        if not samples:
            raise InvalidInput("the upload holds no samples")
        if len(samples) > s.max_samples:
            raise PayloadTooLarge(
                f"{len(samples)} samples exceed the limit of {s.max_samples} per upload",
                {"samples": len(samples), "max_samples": s.max_samples},
            )
        for i, smp in enumerate(samples):
            n = sum(len(v) for v in (smp.text, smp.prompt, smp.completion) if v is not None)
            if n > s.max_sample_chars:
                raise PayloadTooLarge(
                    f"sample {i} has {n} characters; the limit is {s.max_sample_chars}",
                    {"sample": i, "chars": n, "max_sample_chars": s.max_sample_chars},
                )

    def _check_queue(self, session: Session, idempotency_key: str | None = None) -> None:
        if idempotency_key is not None and session.execute(
            select(Job.id).where(Job.idempotency_key == idempotency_key)
        ).first() is not None:
            return  # a repeated request: answered from the store, it queues nothing new
        depth = job_store.count_jobs(session, (JOB_QUEUED,))
        if depth >= self.settings.max_queued_jobs:
            raise QueueFull(
                f"the job queue is full ({depth} queued jobs); retry later",
                {"queued": depth, "max_queued_jobs": self.settings.max_queued_jobs},
            )

    def _enqueue(self, job_id: int, task_id: int | None, *, created: bool) -> None:
        try:
            self.queue.enqueue(job_id)
        except Exception as exc:
            # Nothing half-stored: take back what this request wrote.
            with self.write.begin() as session:
                if created and task_id is not None:
                    repo.delete_task(session, task_id)
                else:
                    session.execute(Job.__table__.delete().where(Job.id == job_id))
                    repo.purge_orphan_uploads(session)
            if isinstance(exc, AtlasError):
                raise
            raise QueueFull(f"the job could not be queued: {exc}") from exc

    def create_task(
        self, name: str, mode: str, metadata: dict[str, Any] | None, samples: Sequence[Sample],
        space_ref: str | None = None, idempotency_key: str | None = None,
    ) -> tuple[Task, Job]:
        """Validate, store the task and its samples, and queue its job (all or nothing)."""
        self.check_samples(samples)
        with self.write.begin() as session:
            space = self.resolve_space(session, space_ref)
            self._require_computable(space)
            self._check_queue(session, idempotency_key)
            task, job = repo.create_task_with_job(
                session, space.id, name, mode, metadata, samples, idempotency_key=idempotency_key
            )
            fresh = job.status == JOB_QUEUED and job.attempts == 0
        if fresh:
            self._enqueue(job.id, task.id, created=True)
        return task, job

    def append_samples(self, task_id: int, samples: Sequence[Sample], idempotency_key: str | None = None) -> Job:
        """Store more samples for a task and queue an ``append`` job."""
        self.check_samples(samples)
        with self.write.begin() as session:
            task = repo.get_task(session, task_id)
            self._require_computable(task.space)
            self._check_queue(session, idempotency_key)
            job = repo.append_samples(session, task_id, samples, idempotency_key=idempotency_key)
            fresh = job.status == JOB_QUEUED and job.attempts == 0
        if fresh:
            self._enqueue(job.id, task_id, created=False)
        return job

    def _require_computable(self, space: Space) -> None:
        self.require_model()
        if space.id != self.space_id:
            raise IncompatibleSpace(
                f"space {space.id} (model {space.model_name!r}) is not the space of the loaded model; "
                "this service can only compute signatures in its own space",
                {"space_id": space.id, "default_space_id": self.space_id},
            )

    def list_tasks(
        self, *, space_ref: str | None, name: str | None, name_prefix: str | None, status: str | None,
        offset: int, limit: int,
    ) -> repo.Page[Task]:
        """List tasks with filters (``name``: exact, ``name_prefix``: prefix)."""
        from sqlalchemy import func

        with self.read() as session:
            space_id = self.resolve_space(session, space_ref).id if space_ref is not None else None
            if name is None:
                return repo.list_tasks(session, space_id=space_id, name_prefix=name_prefix, status=status,
                                       offset=offset, limit=limit)
            conds = [Task.name == name]
            if space_id is not None:
                conds.append(Task.space_id == space_id)
            if status is not None:
                conds.append(Task.status == status)
            if name_prefix:
                conds.append(Task.name.startswith(name_prefix, autoescape=True))
            total = int(session.execute(select(func.count()).select_from(Task).where(*conds)).scalar_one())
            # default space first, then oldest
            order = (Task.space_id != (self.space_id or -1), Task.id)
            items = list(session.execute(select(Task).where(*conds).order_by(*order).offset(offset).limit(limit))
                         .scalars())
            return repo.Page(items=items, total=total, offset=offset, limit=limit)

    def get_task(self, task_id: int) -> Task:
        """One task."""
        with self.read() as session:
            return repo.get_task(session, task_id)

    def patch_task(self, task_id: int, metadata: dict[str, Any]) -> Task:
        """Merge ``metadata`` into a task's metadata."""
        with self.write.begin() as session:
            return repo.update_task(session, task_id, metadata=metadata)

    def delete_task(self, task_id: int) -> None:
        """Delete a task from the store, then from the index."""
        with self.write.begin() as session:
            space_id = repo.get_task(session, task_id).space_id
            repo.delete_task(session, task_id)
        self.states.drop(task_id)
        try:
            self.index.catch_up(space_id)
        except Exception:
            logger.warning("index catch-up after delete failed (the background sync retries)", exc_info=True)

    def get_job(self, job_id: int) -> Job:
        """One job."""
        with self.read() as session:
            return job_store.get_job(session, job_id)

    def list_jobs(self, *, task_id: int | None, status: str | None, offset: int, limit: int) -> repo.Page[Job]:
        """Jobs, newest first."""
        with self.read() as session:
            return job_store.list_jobs(session, task_id=task_id, status=status, offset=offset, limit=limit)

    def cancel_job(self, job_id: int) -> Job:
        """Cancel a queued job or ask a running one to stop."""
        with self.write.begin() as session:
            return job_store.request_cancel(session, job_id)

    # -- loading states ---------------------------------------------------------------------------

    def _fresh_index(self, space_id: int, session: Session | None = None) -> None:
        """Apply committed changes the index has not seen (read-your-writes for queries)."""
        if session is None:
            with self.read() as s:
                head = changes.last_seq(s)
        else:
            head = changes.last_seq(session)
        if head > self.index.watermark(space_id):
            self.index.catch_up(space_id)

    def load_states(self, session: Session, space: Space, task_ids: Sequence[int]) -> list[Loaded]:
        """Ready tasks of ``task_ids`` (in that order, missing ones left out) with their states."""
        from fishersketch import SketchState

        if not task_ids:
            return []
        ids = [int(i) for i in task_ids]
        rows = session.execute(
            select(Task.id, Task.name, Task.space_id, SketchStateRow.version)
            .join(SketchStateRow, SketchStateRow.task_id == Task.id)
            .where(Task.id.in_(ids))
        ).all()
        meta = {int(r[0]): (str(r[1]), int(r[2]), int(r[3])) for r in rows}
        spec = self.spec_of(space)
        entries = {i: self.states.get(i, meta[i][2]) for i in meta}
        need = [i for i, e in entries.items() if e is None]
        if need:
            for tid, version, blob in session.execute(
                select(SketchStateRow.task_id, SketchStateRow.version, SketchStateRow.blob)
                .where(SketchStateRow.task_id.in_(need))
            ):
                entry = self.states.put(int(tid), int(version), SketchState.from_bytes(blob, spec=spec))
                if int(version) == meta[int(tid)][2]:
                    entries[int(tid)] = entry
        out = []
        for i in ids:
            if i not in meta:
                continue
            name, sid, version = meta[i]
            if sid != space.id:
                raise IncompatibleSpace(
                    f"task {i} belongs to space {sid}, not {space.id}", {"task_id": i, "space_id": sid}
                )
            entry = entries.get(i)
            if entry is None:  # replaced between the two reads: read it once more
                blob = repo.get_state_blob(session, i)
                if blob is None:
                    continue
                state = SketchState.from_bytes(blob, spec=spec)
                entry = (state, analysis.state_view(state))
            out.append(Loaded(i, name, entry[0], entry[1]))
        return out

    def _ready_task(self, session: Session, task_id: int) -> Task:
        task = repo.get_task(session, task_id)
        if task.status != TASK_READY:
            raise NotReady(
                f"task {task_id} ({task.name}) has no signature yet (status {task.status})",
                {"task_id": task_id, "status": task.status},
            )
        return task

    # -- queries ---------------------------------------------------------------------------------

    def route(
        self, prompts: Sequence[str], *, k: int, threshold: float | None, candidates: int | None,
        space_ref: str | None,
    ) -> tuple[list[analysis.RouteAnswer], Timings]:
        """Route prompts to the nearest tasks (see :func:`atlas.analysis.rerank_route`)."""
        s = self.settings
        for i, p in enumerate(prompts):
            if len(p) > s.max_prompt_chars:
                raise PayloadTooLarge(
                    f"prompt {i} has {len(p)} characters; the limit is {s.max_prompt_chars}",
                    {"prompt": i, "chars": len(p), "max_prompt_chars": s.max_prompt_chars},
                )
        self.require_model()
        with self.read() as session:
            space = self.resolve_space(session, space_ref)
        if space.id != self.space_id:
            raise IncompatibleSpace(
                f"routing needs the space's model; space {space.id} is not the loaded model's space",
                {"space_id": space.id, "default_space_id": self.space_id},
            )
        thr = float(threshold) if threshold is not None else self.route_threshold
        n_cand = candidates or analysis.default_candidates(k)
        timings = Timings()
        with self._pending_lock:
            if self._pending + len(prompts) > MAX_PENDING_PROMPTS:
                raise QueueFull(
                    f"too many prompts waiting for the model ({self._pending}); retry later",
                    {"pending": self._pending},
                )
            self._pending += len(prompts)
        try:
            states = []
            for p in prompts:
                state = self.prompts.get(p)
                if state is None:
                    t_wait = time.perf_counter()
                    with self._forward_lock:
                        t0 = time.perf_counter()
                        timings.wait_s += t0 - t_wait
                        state = self.extractor.prompt(p).state
                        dt_fwd = time.perf_counter() - t0
                    self.prompts.put(p, state)
                    self.metrics.forward_seconds.observe(dt_fwd)
                    timings.forward_s += dt_fwd
                else:
                    timings.cached += 1
                states.append(state)
        finally:
            with self._pending_lock:
                self._pending -= len(prompts)
        t0 = time.perf_counter()
        answers = self.search_states(space, states, k=k, threshold=thr, candidates=n_cand)
        timings.search_s = time.perf_counter() - t0
        self.metrics.search_seconds.labels(kind="route").observe(timings.search_s)
        return answers, timings

    def search_states(
        self, space: Space, states: Sequence[Any], *, k: int, threshold: float, candidates: int
    ) -> list[analysis.RouteAnswer]:
        """FAISS candidates by signature, then the exact re-rank, for each query state."""
        answers = []
        queries = np.stack([np.asarray(st.signature(), dtype=np.float32) for st in states])
        with self.read() as session:
            self._fresh_index(space.id, session)
            scores, ids = self.index.search(space.id, queries, candidates)
            for qi, st in enumerate(states):
                faiss_score = {int(t): float(sc) for t, sc in zip(ids[qi], scores[qi], strict=True) if t >= 0}
                loaded = self.load_states(session, space, list(faiss_score))
                cands = [analysis.Candidate(x.task_id, x.name, x.state, faiss_score[x.task_id], x.view)
                         for x in loaded]
                answers.append(analysis.rerank_route(st, cands, k=k, threshold=threshold))
        return answers

    def _neighbours(self, session: Session, space: Space, task_id: int, n: int) -> list[int]:
        """Up to ``n`` other ready tasks near ``task_id``: all of them when the space is small."""
        total = repo.count_signatures(session, space.id)
        if total <= n + 1:
            ids = session.execute(
                select(Task.id).where(Task.space_id == space.id, Task.status == TASK_READY, Task.id != task_id)
                .order_by(Task.id)
            ).scalars()
            return [int(i) for i in ids][:n]
        sig_ids, vectors = repo.get_signatures(session, task_ids=[task_id])
        if len(sig_ids) == 0:
            raise NotReady(f"task {task_id} has no signature yet", {"task_id": task_id})
        _, ids = self.index.search(space.id, vectors, n + 1)
        return [int(i) for i in ids[0] if i >= 0 and int(i) != task_id][:n]

    def sources(self, task_id: int, *, k: int, candidates: int | None) -> tuple[Loaded, list[analysis.Source], int]:
        """Recommended fine-tuning sources for a target task."""
        cap = max(1, self.settings.max_matrix_tasks - 1)
        n = min(candidates or analysis.default_candidates(k), cap)
        t0 = time.perf_counter()
        with self.read() as session:
            target = self._ready_task(session, task_id)
            space = target.space
            self._fresh_index(space.id, session)
            others = self._neighbours(session, space, task_id, n)
            loaded = self.load_states(session, space, [task_id, *others])
        if not loaded or loaded[0].task_id != task_id:
            raise NotReady(f"task {task_id} has no state yet", {"task_id": task_id})
        tgt = analysis.TaskState(loaded[0].task_id, loaded[0].name, loaded[0].state)
        cands = [analysis.TaskState(x.task_id, x.name, x.state) for x in loaded[1:]]
        out = analysis.recommend_sources(tgt, cands, k=k)
        self.metrics.search_seconds.labels(kind="sources").observe(time.perf_counter() - t0)
        return loaded[0], out, len(cands)

    def align(self, a: int, b: int) -> tuple[Loaded, Loaded, analysis.Factors]:
        """Alignment of one pair; EB shrinkage over ``a``'s nearest neighbours (as in ``sources``)."""
        t0 = time.perf_counter()
        with self.read() as session:
            ta, tb = self._ready_task(session, a), self._ready_task(session, b)
            if ta.space_id != tb.space_id:
                raise IncompatibleSpace(
                    f"tasks {a} and {b} belong to different spaces ({ta.space_id}, {tb.space_id})",
                    {"space_ids": [ta.space_id, tb.space_id]},
                )
            space = ta.space
            self._fresh_index(space.id, session)
            context = self._neighbours(session, space, a, min(analysis.default_candidates(5),
                                                              self.settings.max_matrix_tasks - 2))
            loaded = self.load_states(session, space, [a, b, *[c for c in context if c != b]])
        by_id = {x.task_id: x for x in loaded}
        if a not in by_id or b not in by_id:
            raise NotReady("both tasks need a stored state", {"task_ids": [a, b]})
        ctx = [analysis.TaskState(x.task_id, x.name, x.state) for x in loaded if x.task_id not in (a, b)]
        if a == b:
            ctx = []
        f = analysis.pair_factors(
            analysis.TaskState(a, by_id[a].name, by_id[a].state),
            analysis.TaskState(b, by_id[b].name, by_id[b].state),
            ctx,
        )
        self.metrics.search_seconds.labels(kind="align").observe(time.perf_counter() - t0)
        return by_id[a], by_id[b], f

    def align_matrix(self, task_ids: Sequence[int]) -> analysis.Matrices:
        """Alignment matrices of the given tasks (one space, all ready)."""
        ids = [int(i) for i in task_ids]
        if len(set(ids)) != len(ids):
            raise InvalidInput("task_ids must be distinct", {"task_ids": ids})
        cap = self.settings.max_matrix_tasks
        if len(ids) > cap:
            raise PayloadTooLarge(f"{len(ids)} tasks exceed the matrix limit of {cap}", {"max_matrix_tasks": cap})
        t0 = time.perf_counter()
        with self.read() as session:
            tasks = repo.get_tasks(session, ids)
            spaces = {t.space_id for t in tasks}
            if len(spaces) > 1:
                raise IncompatibleSpace("the tasks belong to different spaces", {"space_ids": sorted(spaces)})
            not_ready = [t.id for t in tasks if t.status != TASK_READY]
            if not_ready:
                raise NotReady(f"tasks without a signature yet: {not_ready}", {"task_ids": not_ready})
            loaded = self.load_states(session, tasks[0].space, ids)
        mats = analysis.alignment_matrix([analysis.TaskState(x.task_id, x.name, x.state) for x in loaded])
        self.metrics.search_seconds.labels(kind="matrix").observe(time.perf_counter() - t0)
        return mats

    def atlas(self, space_ref: str | None) -> tuple[Space, analysis.AtlasMap, int, bool]:
        """2-D map of a space's ready tasks (an even subset when above ``max_matrix_tasks``)."""
        t0 = time.perf_counter()
        with self.read() as session:
            space = self.resolve_space(session, space_ref)
            ids = [int(i) for i in session.execute(
                select(Task.id).where(Task.space_id == space.id, Task.status == TASK_READY).order_by(Task.id)
            ).scalars()]
            chosen = analysis.even_sample(ids, self.settings.max_matrix_tasks)
            loaded = self.load_states(session, space, chosen)
        amap = analysis.atlas_layout([analysis.TaskState(x.task_id, x.name, x.state) for x in loaded])
        self.metrics.search_seconds.labels(kind="atlas").observe(time.perf_counter() - t0)
        return space, amap, len(ids), len(chosen) < len(ids)

    # -- export / import -------------------------------------------------------------------------

    def export_lines(self, space_ref: str | None) -> tuple[Space, Iterator[bytes]]:
        """A space as JSON lines (:func:`atlas.space_io.export_lines`): a header, then one line per
        ready task (state, signature, baselines)."""
        with self.read() as session:
            space = self.resolve_space(session, space_ref)
            ids = space_io.ready_task_ids(session, space.id)
            session.expunge(space)
        return space, space_io.export_lines(self.read, space, ids)

    def import_space(self, data: bytes, *, on_conflict: str = "fail") -> tuple[int, int, list[str]]:
        """Restore an export (all or nothing, :func:`atlas.space_io.import_space`), then bring the
        index up to date: returns ``(space_id, imported, skipped_names)``."""
        space_id, imported, skipped = space_io.import_space(self.write, data, on_conflict=on_conflict)
        self.index.catch_up(space_id)
        return space_id, imported, skipped


def job_view(job: Job) -> dict[str, Any]:
    """A job row as the API's ``JobOut`` fields."""
    progress = progress_view(job.progress)  # workers.jobs: counted and streamed tokens, rates, ETA
    return {
        "id": job.id, "kind": job.kind, "task_id": job.task_id, "status": job.status, "progress": progress,
        "error": job.error, "created_at": job.created_at, "started_at": job.started_at,
        "finished_at": job.finished_at, "attempts": job.attempts, "cancel_requested": job.cancel_requested,
    }


def task_view(task: Task) -> dict[str, Any]:
    """A task row as the API's ``TaskOut`` fields."""
    return {
        "id": task.id, "name": task.name, "space_id": task.space_id, "mode": task.mode, "status": task.status,
        "metadata": task.meta or {}, "n_samples": task.n_samples, "n_tokens": task.n_tokens,
        "version": task.version, "created_at": task.created_at, "updated_at": task.updated_at,
    }


def is_final(status: str) -> bool:
    """Whether a job status is terminal."""
    return status in JOB_FINAL_STATUSES
