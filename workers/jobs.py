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
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy.exc import InterfaceError, OperationalError

from atlas import db, job_store, lexicon_repo, repository
from atlas.baselines import BaselineSums
from atlas.errors import AtlasError
from atlas.models import JOB_CANCELLED, JOB_FAILED, JOB_SUCCEEDED, Task
from atlas.vocabulary import ModeName
from workers import calibration, job_progress
from workers.extraction_results import Counts
from workers.worker_context import WorkerContext

if TYPE_CHECKING:
    from atlas.samples import Sample
    from workers.extraction import ExtractionResult, Extractor

log = logging.getLogger(__name__)

_TRANSIENT = (OperationalError, InterfaceError)
"""Database errors that mean "unreachable or busy", not "bad data": the job is retried."""


class TransientJobError(RuntimeError):
    """The store was unreachable; the job was given back (or will go stale) and should be retried."""


class LeaseLost(RuntimeError):
    """Another worker took the job over (this one was presumed dead); stop without writing."""


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
        return _finish_or_release(ctx, claim, JOB_FAILED, f"gave up after {claim.attempts - 1} attempts; the worker "
                                  "stopped each time without finishing (out of memory or killed?)")
    if claim.cancel_requested:
        return _finish_or_release(ctx, claim, JOB_CANCELLED, "cancelled by request")
    log.info("job %s (%s of task %s): claimed by %s (attempt %s)", job_id, claim.kind, claim.task_id, ctx.worker_id,
             claim.attempts)  # the task named, so a job's lines can be found from it (an operations review)
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
        return _finish_or_release(ctx, claim, JOB_FAILED, exc.message)
    except Exception as exc:
        log.error("job %s failed:\n%s", job_id, traceback.format_exc())
        return _finish_or_release(ctx, claim, JOB_FAILED, f"{type(exc).__name__}: {exc}")


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
    log.info("job %s (task %s): %s (%s)", claim.job_id, claim.task_id, status, error)
    return status


def _finish_or_release(ctx: WorkerContext, claim: job_store.Claim, status: str, error: str) -> str:
    """:func:`_finish`, or, when the store fails (down, full, read-only), the job given back as after any store error
    (:func:`_release_after_store_error`): its end is written by its next claim (a cancel asked is kept). Before, a job
    cancelled on a full disk stayed ``running`` until a sweep found it stale, and the sweep counted an attempt."""
    try:
        return _finish(ctx, claim, status, error)
    except _TRANSIENT as exc:
        _release_after_store_error(ctx, claim, exc)
        raise TransientJobError(f"job {claim.job_id}: store unavailable while ending it: {exc}") from exc


def _try_release(ctx: WorkerContext, claim: job_store.Claim, error: str, *, count_attempt: bool = True) -> None:
    try:
        with ctx.factory.begin() as s:
            job_store.release_job(s, claim.job_id, claim.lease, error, count_attempt=count_attempt)
    except _TRANSIENT:
        pass  # still down: the heartbeat goes stale and a sweep re-queues the job


RELEASE_RETRY_S = 1.0
"""Seconds between a job's release attempts while the store is down (:func:`_release_after_store_error`)."""
RELEASE_WAIT_S = 300.0
"""Longest a worker keeps trying to give back a job whose store is down (then a sweep re-queues it, counted); a worker
asked to stop waits half the stale window only."""


def _release_after_store_error(ctx: WorkerContext, claim: job_store.Claim, exc: BaseException) -> None:
    """Give the job back to the queue after a store error, not counting an outage as an attempt: the error broke a
    connection (``connection_invalidated``: a restart) or the release cannot reach the store, and is then tried every
    :data:`RELEASE_RETRY_S` while the outage lasts (:data:`RELEASE_WAIT_S` at most). Before, five restarts during one
    job failed it ("the worker stopped each time"), and a failed release left the job running under this lease: its
    retry was skipped until a sweep found it stale. An outage past the stale window, where another process's sweep
    re-queued the job first, is not counted either (``release_job``'s ``worker``); retries stopped at half that
    window, and it counted. A storage fault (a full disk, a read-only data directory: :func:`atlas.db.storage_fault`)
    is an outage too — an operator mends it and the job resumes from its checkpoint; each failed checkpoint counted,
    and two minutes of a full disk failed a job for good, "out of memory or killed?". Another store error (a lock
    wait, a statement timeout) counts, as before."""
    # a restart, a dropped link, a refused connection; a full or read-only disk
    fault = db.storage_fault(exc)
    outage = db.is_unreachable_error(exc) or fault is not None
    said = (f"store unavailable: {exc}" if fault is None else
            f"the store cannot be written ({fault}): the job is retried, uncounted, until its data directory is "
            "mended (free space, make it writable) — cancel it to stop")
    if fault is not None:
        log.error("job %s: %s", claim.job_id, said)
    start = time.monotonic()
    while True:
        try:
            with ctx.factory.begin() as s:
                job_store.release_job(s, claim.job_id, claim.lease, said,
                                      count_attempt=not outage, worker=ctx.worker_id)
            return
        except _TRANSIENT:
            outage = True
            # a worker stopping (a deploy, Ctrl-C) waits half the stale window, as before, not the long wait
            stopping = ctx.shutdown.is_set()
            wait = ctx.settings.job_stale_after_s / 2 if stopping else max(ctx.settings.job_stale_after_s / 2,
                                                                          RELEASE_WAIT_S)
            if time.monotonic() - start >= wait:
                return  # still down: the heartbeat goes stale and a sweep re-queues the job
            if stopping:
                time.sleep(RELEASE_RETRY_S)
            else:
                ctx.shutdown.wait(RELEASE_RETRY_S)  # a stop asked meanwhile ends the long wait at once


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
    with ctx.factory.begin() as s:  # the progress starts where this attempt does (never ahead of it)
        if not job_store.heartbeat(s, claim.job_id, claim.lease, job_progress.of_start(
                start, len(samples), counts.tokens if counts else 0, counts.tokens_streamed if counts else 0)).alive:
            raise LeaseLost(claim.job_id)

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
            job_store.mark_succeeded(s, job, summary | {"change_seq": seq, "task_samples": merged.n_samples},
                                     final or job_progress.of_result(res, final=True))
        else:
            job_store.finish_locked(s, job, outcome, error)
    if outcome != JOB_SUCCEEDED:
        log.info("job %s (task %s): %s (%s)", claim.job_id, claim.task_id, outcome, error)
        return outcome
    log.info("job %s (task %s): succeeded (%s samples used, %s tokens)", claim.job_id, claim.task_id,
             res.samples_used, res.tokens)
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
