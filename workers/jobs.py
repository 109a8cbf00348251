"""``run_job``: one job, end to end, idempotent — the same function behind every runner.

Steps

1. **Claim** the job with a fresh lease (``queued``, or ``running`` with a stale heartbeat:
   its worker died). Not claimable → nothing to do (finished, or a live worker has it).
2. **Load** the task, its space and the upload's samples; build (once per space) the extractor for
   the space's model fingerprint and sketch spec; resume from the job's checkpoint if there is one.
3. **Extract** with ``Extractor.extract``: every ``checkpoint_every`` samples the mergeable state and
   baseline sums are saved (conditional on the lease); a heartbeat thread refreshes ``heartbeat_at``,
   writes progress at most once a second and polls the cancel flag.
4. **Finish** in one transaction: lock the job (still ours, running, not asked to cancel?) and the task, merge the
   job's state into the task's stored state (states are sums, so an append is exact and order does
   not matter), store state, signature and baselines, mark the task ready and the job succeeded, and
   log the change for the index. A duplicate or superseded run finds the job finished or re-leased
   and writes nothing — so a retried job never merges twice.

A worker killed at any point leaves the job ``running`` with a heartbeat that goes stale; the next
claim resumes from the last checkpoint and, because windows are processed deterministically, ends
with exactly the state of an uninterrupted run.

Errors: domain and data errors fail the job with a clear message (a failed ``create`` leaves its
task ``failed``); unexpected exceptions are recorded the same way with their type; only database
connectivity errors propagate (:class:`TransientJobError`) so that the runner retries later.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from atlas import db, job_store, lexicon_repo, repository
from atlas.baselines import BaselineSums
from atlas.errors import AtlasError, IncompatibleSpace
from atlas.models import JOB_CANCELLED, JOB_FAILED, JOB_SUCCEEDED, Space, Task
from atlas.settings import Settings
from atlas.vocabulary import ModeName
from workers import calibration, job_progress
from workers.extraction_results import Counts

if TYPE_CHECKING:
    from atlas.index import IndexManager
    from atlas.samples import Sample
    from workers.extraction import ExtractionResult, Extractor
    from workers.model_loading import LoadedModel

log = logging.getLogger(__name__)

_TRANSIENT = (OperationalError, InterfaceError)
"""Database errors that mean "unreachable or busy", not "bad data": the job is retried."""

"""Claims after which a job that never finished (its worker died each time) is failed."""


class TransientJobError(RuntimeError):
    """The store was unreachable; the job was given back (or will go stale) and should be retried."""


class LeaseLost(RuntimeError):
    """Another worker took the job over (this one was presumed dead); stop without writing."""


# --------------------------------------------------------------------------------------------------
# Context
# --------------------------------------------------------------------------------------------------


@dataclass
class WorkerContext:
    """What a worker needs to run jobs: settings, the store, the model, optionally the index.

    Parameters
    ----------
    settings
        Runtime configuration (model, device, ``checkpoint_every``, ``job_stale_after_s``, ...).
    factory
        Read-write session factory of the store.
    index
        When given (embedded mode), the index is caught up right after a job stores a signature.
    lm
        A loaded model to use (e.g. the one the API already holds); else loaded on first use from
        ``settings.model``.
    max_attempts
        Attempts before a job fails for good (default ``settings.job_max_attempts``).
    """

    settings: Settings
    factory: sessionmaker[Session]
    index: IndexManager | None = None
    lm: LoadedModel | None = None
    max_attempts: int | None = None
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    shutdown: threading.Event = field(default_factory=threading.Event)
    _extractors: dict[int, Extractor] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts is None:
            self.max_attempts = self.settings.job_max_attempts
        self.ro_factory: sessionmaker[Session] = db.session_factory(self.factory.kw["bind"], readonly=True)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, lm: LoadedModel | None = None, index: IndexManager | None = None
    ) -> WorkerContext:
        """Context with its own engine for ``settings.resolved_database_url()`` (schema must exist)."""
        engine = db.make_engine(settings.resolved_database_url())
        return cls(settings=settings, factory=db.session_factory(engine), index=index, lm=lm)

    @property
    def heartbeat_every_s(self) -> float:
        """Heartbeat period: a quarter of the staleness threshold, at most 10 s."""
        return max(0.05, min(self.settings.job_stale_after_s / 4.0, 10.0))

    def model(self) -> LoadedModel:
        """The worker's model, loaded on first use."""
        with self._lock:
            if self.lm is None:
                from workers.model_loading import load_configured_model

                self.lm = load_configured_model(self.settings)
            return self.lm

    def extractor_for(self, space: Space) -> Extractor:
        """The extractor of a space (its model fingerprint and sketch spec), built once.

        Raises
        ------
        IncompatibleSpace
            This worker's model is not the space's model, or the stored spec is not reproducible.
        """
        with self._lock:
            cached = self._extractors.get(space.id)
        if cached is not None:
            return cached
        from fishersketch import SketchSpec
        from workers.extraction import Extractor

        lm = self.model()
        if lm.fingerprint.key() != space.model_fingerprint:
            raise IncompatibleSpace(
                f"this worker serves model {lm.name!r} (fingerprint {lm.fingerprint.key()}), but the job's "
                f"space {space.id} needs model {space.model_name!r} (fingerprint {space.model_fingerprint}); "
                "run a worker with that model",
                {"space_id": space.id, "worker_model": lm.fingerprint.key(), "space_model": space.model_fingerprint},
            )
        spec = SketchSpec.from_dict(space.spec)
        if spec.fingerprint() != space.spec_fingerprint:
            raise IncompatibleSpace(
                f"space {space.id} was created with sketch spec {space.spec_fingerprint}, which this version "
                f"of fishersketch reproduces as {spec.fingerprint()}",
                {"space_id": space.id},
            )
        extractor = Extractor(lm, lm.make_sketcher(spec),
                              max_tokens_per_sample=self.settings.max_tokens_per_sample)
        with self._lock:
            return self._extractors.setdefault(space.id, extractor)


def ensure_space(session: Session, lm: LoadedModel, settings: Settings) -> Space:
    """The space of ``lm`` with the sketch spec of ``settings`` (created on first use; one stored under the model's
    previous fingerprint is re-keyed, see :func:`atlas.space_repository.get_or_create_space`)."""
    spec = lm.make_spec(m=settings.sketch_dim, seed=settings.sketch_seed, error_projection=settings.error_projection)
    return repository.get_or_create_space(
        session, model_fingerprint=lm.fingerprint.key(), spec_fingerprint=spec.fingerprint(), model_name=lm.name,
        d=spec.d, K=spec.K, m=spec.m, seed=spec.seed, spec=spec.to_dict(),
        previous_fingerprint=lm.fingerprint.previous_key,
    )


# --------------------------------------------------------------------------------------------------
# Heartbeat
# --------------------------------------------------------------------------------------------------


class _Heartbeat:
    """Background thread: heartbeat, throttled progress, cancel flag, lease check."""

    def __init__(self, ctx: WorkerContext, job_id: int, lease: str) -> None:
        self.ctx, self.job_id, self.lease = ctx, job_id, lease
        self.cancel = threading.Event()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._progress: dict[str, Any] | None = None
        self._progress_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def set_progress(self, progress: dict[str, Any]) -> None:
        with self._progress_lock:
            self._progress = progress

    def take_progress(self) -> dict[str, Any] | None:
        with self._progress_lock:
            progress, self._progress = self._progress, None
            return progress

    def should_stop(self) -> bool:
        """Passed to the extractor: cancel requested, lease lost, or the runner is shutting down."""
        return self.cancel.is_set() or self.lost.is_set() or self.ctx.shutdown.is_set()

    def _run(self) -> None:
        last_beat = time.monotonic()
        period = self.ctx.heartbeat_every_s
        poll = min(1.0, period)
        while not self._stop.wait(poll):
            progress = self.take_progress()
            due = time.monotonic() - last_beat >= period
            try:
                if due or progress is not None:
                    with self.ctx.factory.begin() as s:
                        beat = job_store.heartbeat(s, self.job_id, self.lease, progress)
                    last_beat = time.monotonic()
                    if not beat.alive:
                        self.lost.set()
                    if beat.cancel_requested:
                        self.cancel.set()
                else:
                    with self.ctx.ro_factory() as s:
                        if job_store.is_cancel_requested(s, self.job_id):
                            self.cancel.set()
            except _TRANSIENT as exc:  # keep trying; the job goes stale if it persists
                log.warning("heartbeat of job %s failed: %s", self.job_id, exc)


# --------------------------------------------------------------------------------------------------
# run_job
# --------------------------------------------------------------------------------------------------


def run_job(job_id: int, ctx: WorkerContext) -> str:
    """Run job ``job_id`` to completion if it is claimable; return the outcome.

    Returns
    -------
    str
        ``"succeeded"``, ``"failed"``, ``"cancelled"``; ``"skipped"`` (not claimable: finished, or
        held by a live worker), ``"lost"`` (taken over by another worker meanwhile), ``"released"``
        (the runner is shutting down; the job is queued again and resumes from its checkpoint).

    Raises
    ------
    TransientJobError
        The store could not be reached; retry later.
    """
    try:
        if not _serves(ctx, job_id):
            return "skipped"  # another model's job: left queued for a worker with that model, not failed
        with ctx.factory.begin() as s:
            claim = job_store.claim_job(s, job_id, worker=ctx.worker_id, stale_after_s=ctx.settings.job_stale_after_s)
    except _TRANSIENT as exc:
        raise TransientJobError(f"cannot claim job {job_id}: {exc}") from exc
    if claim is None:
        return "skipped"
    if claim.attempts > (ctx.max_attempts or ctx.settings.job_max_attempts):
        return _finish(ctx, claim, JOB_FAILED, f"gave up after {claim.attempts - 1} attempts; the worker "
                       "stopped each time without finishing (out of memory or killed?)")
    if claim.cancel_requested:
        return _finish(ctx, claim, JOB_CANCELLED, "cancelled by request")
    log.info("job %s: claimed by %s (attempt %s)", job_id, ctx.worker_id, claim.attempts)
    try:
        with _Heartbeat(ctx, job_id, claim.lease) as beat:
            return _execute(ctx, claim, beat)
    except LeaseLost:
        log.warning("job %s: taken over by another worker; stopping", job_id)
        return "lost"
    except _TRANSIENT as exc:
        _release_after_store_error(ctx, claim, exc)
        raise TransientJobError(f"job {job_id}: store unavailable: {exc}") from exc
    except AtlasError as exc:
        return _finish(ctx, claim, JOB_FAILED, exc.message)
    except Exception as exc:
        log.error("job %s failed:\n%s", job_id, traceback.format_exc())
        return _finish(ctx, claim, JOB_FAILED, f"{type(exc).__name__}: {exc}")


def _serves(ctx: WorkerContext, job_id: int) -> bool:
    """Whether this worker's model is the one of the job's space (the model is loaded first if it is not yet:
    a plain Celery worker loads it lazily; one that cannot load it claims the job, which then fails saying why)."""
    try:
        lm = ctx.model()
    except Exception:
        return True
    with ctx.ro_factory() as s:
        fingerprints = job_store.space_fingerprints_of(s, [job_id]).get(job_id)
    return fingerprints is None or fingerprints[0] == lm.fingerprint.key()


def _finish(ctx: WorkerContext, claim: job_store.Claim, status: str, error: str) -> str:
    with ctx.factory.begin() as s:
        done = job_store.finish_job(s, claim.job_id, claim.lease, status, error)
    if not done:
        return "lost"
    log.info("job %s: %s (%s)", claim.job_id, status, error)
    return status


def _try_release(ctx: WorkerContext, claim: job_store.Claim, error: str, *, count_attempt: bool = True) -> None:
    try:
        with ctx.factory.begin() as s:
            job_store.release_job(s, claim.job_id, claim.lease, error, count_attempt=count_attempt)
    except _TRANSIENT:
        pass  # still down: the heartbeat goes stale and a sweep re-queues the job


RELEASE_RETRY_S = 1.0
"""Seconds between a job's release attempts while the store is down (:func:`_release_after_store_error`)."""


def _release_after_store_error(ctx: WorkerContext, claim: job_store.Claim, exc: BaseException) -> None:
    """Give the job back to the queue after a store error, not counting an outage as an attempt: the error broke a
    connection (``connection_invalidated``: a restart) or the release cannot reach the store, and is then tried every
    :data:`RELEASE_RETRY_S` for half the stale window. Before, five restarts during one job failed it ("the worker
    stopped each time"), and a failed release left the job running under this lease: its retry was skipped until a
    sweep found it stale. Another store error (a lock wait, a statement timeout) counts, as before."""
    outage = db.is_unreachable_error(exc)  # a restart, a dropped link, a refused connection
    deadline = time.monotonic() + ctx.settings.job_stale_after_s / 2
    while True:
        try:
            with ctx.factory.begin() as s:
                job_store.release_job(s, claim.job_id, claim.lease, f"store unavailable: {exc}",
                                      count_attempt=not outage)
            return
        except _TRANSIENT:
            outage = True
            if time.monotonic() >= deadline:
                return  # still down: the heartbeat goes stale and a sweep re-queues the job
            time.sleep(RELEASE_RETRY_S)


def _execute(ctx: WorkerContext, claim: job_store.Claim, beat: _Heartbeat) -> str:
    from fishersketch import SketchState

    settings = ctx.settings
    with ctx.ro_factory() as s:
        task = None if claim.task_id is None else s.get(Task, claim.task_id)
        if task is None:
            return _finish(ctx, claim, JOB_CANCELLED, "the task was deleted")
        mode = task.mode
        space = repository.get_space(s, claim.space_id)
        s.expunge(space)
        samples = repository.load_upload_samples(s, claim.upload_id)
        checkpoint = job_store.get_checkpoint(s, claim.job_id)
        resume = None if checkpoint is None else (checkpoint.samples_done, checkpoint.state, checkpoint.baselines,
                                                  Counts.from_dict((checkpoint.extra or {}).get("counts"),
                                                                   tokens=checkpoint.tokens))

    extractor = ctx.extractor_for(space)
    assert extractor.sketcher is not None
    spec = extractor.sketcher.spec
    state = baselines = counts = None
    start = 0
    if resume is not None:
        start = resume[0]
        state = SketchState.from_bytes(resume[1], spec=spec)
        baselines = BaselineSums.from_bytes(resume[2]) if resume[2] is not None else None
        counts = resume[3]
        log.info("job %s: resuming after %s of %s samples", claim.job_id, start, len(samples))

    def on_checkpoint(res: ExtractionResult, *, last: bool = False) -> None:
        if res.samples_done >= res.samples_total and not last:
            return  # the final transaction follows at once (or the routing pass's checkpoint, below)
        with ctx.factory.begin() as s:
            ok = job_store.save_checkpoint(
                s, claim.job_id, claim.lease, samples_done=res.samples_done, tokens=res.tokens,
                state=res.state.to_bytes(), baselines=res.baselines.to_bytes(), progress=job_progress.of_result(res),
                extra={"counts": res.counts().to_dict()},
            )
        if not ok:
            raise LeaseLost(claim.job_id)

    res = extractor.extract(
        samples, mode=cast(ModeName, mode), state=state, baselines=baselines, start=start,
        checkpoint_every=settings.checkpoint_every, on_checkpoint=on_checkpoint,
        progress=lambda p: beat.set_progress(job_progress.of_progress(p)), should_cancel=beat.should_stop,
        counts=counts,
    )
    if beat.lost.is_set():
        raise LeaseLost(claim.job_id)
    if res.cancelled:
        return _stopped(ctx, claim, beat)
    side: calibration.PromptSide | None = None
    final = job_progress.of_result(res, final=True)
    if res.state.n_tokens:
        if start < len(samples):  # a pass that can be long (a text task's too: 32 long calibration samples and their
            on_checkpoint(res, last=True)  # prefixes took 45 s after 20 s of extraction): a stop keeps the extraction
        side, final = _routing_pass(beat, extractor, samples, mode, final)
        if beat.lost.is_set():
            raise LeaseLost(claim.job_id)
        if side is None and beat.should_stop():  # stopped between windows of the pass
            return _stopped(ctx, claim, beat)
    lexical = lexicon_repo.LexicalDelta.of_samples(samples, mode) if res.state.n_tokens else None
    return _store(ctx, claim, res, None if side is None else (mode, side), lexical, final)


def _stopped(ctx: WorkerContext, claim: job_store.Claim, beat: _Heartbeat) -> str:
    """A job its extractor or routing pass stopped: cancelled by request, or released by a shutting-down
    runner (not an attempt; it resumes from its last checkpoint)."""
    if beat.cancel.is_set():
        return _finish(ctx, claim, JOB_CANCELLED, "cancelled by request")
    _try_release(ctx, claim, "worker shut down; the job resumes from its last checkpoint", count_attempt=False)
    return "released"


def _routing_pass(beat: _Heartbeat, extractor: Extractor, samples: list[Sample], mode: str, base: dict[str, Any]
                  ) -> tuple[calibration.PromptSide | None, dict[str, Any]]:
    """The prompt-side pass after the samples (:func:`calibration.prompt_side`), reported as the job's
    ``routing`` phase (prompts sketched of the pass's total, its own ETA) and stopped by cancel or shutdown;
    returns the pass's result and the job's final progress (``base``, the extraction's, with the phase)."""
    phase: dict[str, Any] = {"phase": "routing", "routing_done": 0, "routing_total": 0}
    t0 = time.monotonic()

    def report(done: int, total: int) -> None:
        rate = done / max(time.monotonic() - t0, 1e-9)
        phase.update(routing_done=done, routing_total=total)
        beat.set_progress(base | phase | {"eta_s": round((total - done) / rate, 3) if done else None})

    side = calibration.prompt_side_or_none(extractor, samples, mode, progress=report, should_stop=beat.should_stop)
    return side, base | phase


def _store(ctx: WorkerContext, claim: job_store.Claim, res: ExtractionResult,
           routing_side: tuple[str, calibration.PromptSide] | None = None,
           lexical: lexicon_repo.LexicalDelta | None = None, final: dict[str, Any] | None = None) -> str:
    """The final transaction: merge into the task (state, routing side, lexical record), store, mark done, log
    the change."""
    from fishersketch import SketchState

    summary = res.summary()
    with ctx.factory.begin() as s:
        job = job_store.lock_held_job(s, claim.job_id, claim.lease)
        if job is None:
            raise LeaseLost(claim.job_id)
        task = repository.lock_task(s, claim.task_id) if claim.task_id is not None else None
        if task is None:
            outcome, error = JOB_CANCELLED, "the task was deleted"
        elif job.cancel_requested:  # asked after the last batch (or during the calibration pass): honoured here
            outcome, error = JOB_CANCELLED, "cancelled by request"
        elif res.state.n_tokens == 0:  # an append too: the task keeps its state, the caller learns why (not 'done')
            outcome, error = JOB_FAILED, _nothing_usable(res)
        else:
            outcome, error = JOB_SUCCEEDED, None
        if outcome == JOB_SUCCEEDED:
            assert task is not None
            stored = repository.get_state_blob(s, task.id)
            stored_base = repository.get_baseline_blob(s, task.id)
            spec = res.state.spec
            merged = res.state if stored is None else SketchState.from_bytes(stored, spec=spec).merge(res.state)
            merged_base = res.baselines if stored_base is None else BaselineSums.from_bytes(stored_base).merge(
                res.baselines
            )
            if routing_side is not None:  # a completion task's prompt vectors (its novelty test)
                merged_base = routing_side[1].add_vectors(merged_base)
            seq = repository.store_task_result(
                s, task, state=merged.to_bytes(), signature=merged.signature(), baselines=merged_base.to_bytes(),
                n_samples=merged.n_samples, n_tokens=merged.n_tokens,
            )
            if routing_side is not None:
                calibration.store_routing_side(s, task.id, routing_side[0], merged, routing_side[1])
            if lexical is not None:
                lexicon_repo.add_delta(s, task.id, lexical)
            job_store.mark_succeeded(s, job, summary | {"change_seq": seq},
                                     final or job_progress.of_result(res, final=True))
        else:
            job_store.finish_locked(s, job, outcome, error)
    if outcome != JOB_SUCCEEDED:
        log.info("job %s: %s (%s)", claim.job_id, outcome, error)
        return outcome
    log.info("job %s: succeeded (%s samples used, %s tokens)", claim.job_id, res.samples_used, res.tokens)
    if ctx.index is not None:
        try:
            ctx.index.catch_up(claim.space_id)
        except Exception:  # the index is derived: a later catch-up repairs it
            log.exception("index catch-up after job %s failed", claim.job_id)
    return JOB_SUCCEEDED


def _nothing_usable(res: ExtractionResult) -> str:
    reasons = ", ".join(f"{k}: {v}" for k, v in res.skipped_reasons.items()) or "none"
    return (
        f"no usable tokens: all {res.samples_total} samples were skipped (reasons — {reasons}); "
        "each sample needs at least 2 tokens (completion mode: a non-empty completion)"
    )
