"""In-process job runner: worker threads in the API process (the embedded default).

Jobs are durable in SQL; this runner only holds job *ids* in memory. On :meth:`InProcessRunner.start`
it re-enqueues every queued job and every running job whose heartbeat went stale, so a crash of the
embedded service loses nothing; a sweeper thread repeats that periodically (jobs whose wake-up was
lost, or whose worker in another replica died). :meth:`InProcessRunner.stop` lets running jobs
release themselves at their next batch boundary — they are queued again and resume from their last
checkpoint on the next start.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict

from atlas import job_store
from workers.jobs import TransientJobError, run_job
from workers.redis_options import OutageLog
from workers.worker_context import WorkerContext

log = logging.getLogger(__name__)

_STOP = -1
OUTCOMES_KEPT = 1024


class InProcessRunner:
    """Runs jobs on ``threads`` background threads; implements :class:`atlas.queue.JobQueue`.

    Parameters
    ----------
    ctx
        The worker context (store, model, index).
    threads
        Worker threads (default ``settings.worker_threads``).
    sweep_every_s
        Period of the recovery sweep (default half of ``settings.job_stale_after_s``).
    """

    def __init__(self, ctx: WorkerContext, threads: int | None = None, *, sweep_every_s: float | None = None) -> None:
        self.ctx = ctx
        self.n_threads = threads or ctx.settings.worker_threads
        self.sweep_every_s = sweep_every_s or max(0.5, ctx.settings.job_stale_after_s / 2.0)
        self._queue: queue.Queue[int] = queue.Queue()
        self._pending: set[int] = set()
        self._running: set[int] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.outcomes: OrderedDict[int, str] = OrderedDict()  # the last OUTCOMES_KEPT jobs' (for tests and logs)
        # a database that cannot be written (full, read-only, locked) failed every sweep: one traceback per outage,
        # not 55 lines every few seconds
        self._sweep_outage = OutageLog(log, "the job sweep")

    # -- JobQueue ----------------------------------------------------------------------------

    def enqueue(self, job_id: int, serving_key: str | None = None) -> None:
        """Wake a thread for ``job_id`` (ignored if it is already waiting or running here; this runner
        serves one model, so ``serving_key`` is not needed)."""
        with self._lock:
            if job_id in self._pending or job_id in self._running:
                return
            self._pending.add(job_id)
        self._queue.put(job_id)

    def depth(self) -> int:
        """Jobs waiting for a thread."""
        with self._lock:
            return len(self._pending)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> int:
        """Recover queued and stale jobs from SQL, start the threads; return how many were recovered."""
        if self._threads:
            return 0
        self.ctx.shutdown.clear()
        self._stopping.clear()
        recovered = self.sweep(include_recent=True)
        for i in range(self.n_threads):
            t = threading.Thread(target=self._work, name=f"fisher-atlas-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        sweeper = threading.Thread(target=self._sweep_loop, name="fisher-atlas-sweeper", daemon=True)
        sweeper.start()
        self._threads.append(sweeper)
        return recovered

    def begin_stop(self) -> None:
        """Ask the threads to stop, without waiting: running jobs are released at their next batch (and resume later),
        queued ones stay queued in SQL. Safe from a signal handler (the service calls it at SIGTERM, before it lets
        its open requests finish)."""
        self._stopping.set()
        self.ctx.shutdown.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the threads; running jobs are released at their next batch and resume later."""
        self.begin_stop()
        for _ in range(self.n_threads):
            self._queue.put(_STOP)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads = []
        with self._lock:
            self._pending.clear()
        while not self._queue.empty():
            self._queue.get_nowait()

    def join(self, timeout: float = 60.0) -> bool:
        """Wait until no job is waiting or running here; return whether that happened in time."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def sweep(self, *, include_recent: bool = False) -> int:
        """Enqueue queued jobs (older than the staleness threshold unless ``include_recent``) and stale ones."""
        stale = self.ctx.settings.job_stale_after_s
        model = None if self.ctx.lm is None else self.ctx.lm.fingerprint.key()
        try:
            if model is not None:  # other models' jobs are left queued for their workers, not run nor failed here
                with self.ctx.factory.begin() as s:
                    job_store.requeue_dead_jobs(s, stale_after_s=stale, except_model=model)
            with self.ctx.ro_factory() as s:
                ids = job_store.recoverable_jobs(
                    s, stale_after_s=stale, queued_older_than_s=0.0 if include_recent else stale,
                    model_fingerprint=model)
        except Exception as exc:
            self._sweep_outage.failed(exc)
            return 0
        self._sweep_outage.ok()
        before = self.depth()
        for job_id in ids:
            self.enqueue(job_id)
        return self.depth() - before

    # -- threads -----------------------------------------------------------------------------

    def _sweep_loop(self) -> None:
        while not self._stopping.wait(self.sweep_every_s):
            n = self.sweep()
            if n:
                log.info("sweep re-queued %s jobs", n)

    def _work(self) -> None:
        while True:
            job_id = self._queue.get()
            if job_id == _STOP:
                return
            with self._lock:
                self._pending.discard(job_id)
                self._running.add(job_id)
            try:
                if self._stopping.is_set():
                    continue
                outcome = self._run(job_id)
                with self._lock:  # bounded: a long-lived process runs jobs without end
                    self.outcomes[job_id] = outcome
                    while len(self.outcomes) > OUTCOMES_KEPT:
                        self.outcomes.popitem(last=False)
            finally:
                with self._idle:
                    self._running.discard(job_id)
                    self._idle.notify_all()

    def _run(self, job_id: int) -> str:
        delay = 1.0
        while not self._stopping.is_set():
            try:
                return run_job(job_id, self.ctx)
            except TransientJobError as exc:
                log.warning("job %s: %s; retrying in %.0f s", job_id, exc, delay)
                if self._stopping.wait(delay):
                    break
                delay = min(delay * 2, 60.0)
            except Exception:  # run_job records failures itself; this is a bug guard
                log.exception("job %s: unexpected error in the runner", job_id)
                return "error"
        return "released"
