"""Celery over Redis: workers on other machines run the same ``run_job``.

Start a worker with ``fisher-atlas worker`` (:func:`run_worker`: it consumes the queue of the model it
loads, where the API sends that model's jobs, and serves routing prompts; it announces itself in Redis, and
an API without a model accepts uploads and prompts only for models a worker announces). A plain ``celery -A
workers.celery_app worker --pool=solo -c 1 -Q <celery_queue>.<serving key>`` runs jobs only: it announces
nothing, so it is an extra job consumer beside at least one ``fisher-atlas worker`` of the same model, not a
replacement for it (one process per GPU; the queue ``fisher-atlas worker`` logs). Configuration comes
from the ``FISHER_ATLAS_*`` environment (:func:`atlas.settings.get_settings`): ``redis_url`` is the
broker, ``database_url`` the store the jobs live in, ``model`` the model this worker serves.

Delivery guarantees

* ``task_acks_late`` + ``task_reject_on_worker_lost``: a message is acknowledged only after
  ``run_job`` returned, so a worker killed mid-job (even ``kill -9``) leaves it unacknowledged and
  Redis re-delivers it after the ``visibility_timeout``.
* Much sooner, a **sweep** — at worker start and every ``job_stale_after_s / 2`` seconds, by one
  worker at a time (a Redis lock) — re-enqueues running jobs whose heartbeat went stale, and queued
  jobs when the broker queue is empty (their wake-up was lost). Duplicate messages are harmless:
  ``run_job`` claims with a lease, so a job runs once at a time and finishes once.
* Store outages raise :class:`~workers.jobs.TransientJobError` and are retried with exponential
  backoff and jitter.
* A warm shutdown (SIGTERM) releases the running job at its next batch — not counted as an attempt — and
  re-sends it to its model's queue; it resumes from its last checkpoint on the next worker. This needs the
  job to run in the worker's main process: the ``solo`` pool (the default, one job per process); a ``prefork``
  child finishes its job first (Celery signals only the main process).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import Celery, signals

from atlas import job_store
from atlas.models import JOB_RUNNING
from atlas.ports import SpaceKey, serving_key
from atlas.settings import Settings, get_settings
from atlas.space_repository import get_space
from workers.jobs import TransientJobError, run_job
from workers.worker_context import WorkerContext, ensure_space

log = logging.getLogger(__name__)

TASK_NAME = "fisher_atlas.run_job"
SWEEP_TASK_NAME = "fisher_atlas.sweep"


def queue_name(settings: Settings, serving_key: str | None = None) -> str:
    """Broker queue of the jobs of one (model, spec): ``<FISHER_ATLAS_CELERY_QUEUE>.<serving key>``.

    Queues per model let several models be served at once: a worker consumes only the queue of the
    model it loaded, so a job never reaches a worker that cannot compute its space.
    """
    return settings.celery_queue if serving_key is None else f"{settings.celery_queue}.{serving_key}"


BROKER_SOCKET_TIMEOUT_S = 5.0
"""Seconds a broker (Redis) read, write or connect may take."""
PUBLISH_RETRY = {"max_retries": 1, "interval_start": 0.0, "interval_step": 0.2, "interval_max": 0.2}
"""Celery's publish retry policy for a job's wake-up (its default is 3 retries)."""


def create_app(settings: Settings | None = None, *, queue: str | None = None) -> Celery:
    """Build the Celery app for ``settings`` (default: from the environment).

    Parameters
    ----------
    settings
        Broker URL (``redis_url``), staleness threshold, and what the workers load.
    queue
        Broker queue name (default :func:`queue_name`); producers and workers must agree.
    """
    settings = settings or get_settings()
    visibility = float(settings.celery_visibility_timeout_s)
    app = Celery("fisher_atlas", broker=settings.redis_url)
    app.conf.update(
        task_default_queue=queue or queue_name(settings),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        # a hung Redis (accepting connections, answering nothing) held a publish — and the upload that waits for
        # it — forever: bounded reads and connects (above BRPOP's 1 s poll, which a worker's consumer blocks in)
        broker_transport_options={"visibility_timeout": visibility, "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
                                  "socket_connect_timeout": BROKER_SOCKET_TIMEOUT_S},
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    app.fisher_atlas_settings = settings  # type: ignore[attr-defined]
    return app


app = create_app()

# One worker context per process (prefork children get their own engine and model).
_ctx: WorkerContext | None = None
_ctx_pid: int | None = None
_ctx_lock = threading.Lock()


def get_context() -> WorkerContext:
    """This process's worker context, created on first use from the app's settings."""
    global _ctx, _ctx_pid
    with _ctx_lock:
        if _ctx is None or _ctx_pid != os.getpid():
            _ctx = WorkerContext.from_settings(app.fisher_atlas_settings)  # type: ignore[attr-defined]
            _ctx_pid = os.getpid()
        return _ctx


@app.task(
    name=TASK_NAME,
    bind=True,
    acks_late=True,
    autoretry_for=(TransientJobError,),
    retry_backoff=2,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=12,
)
def run_job_task(self: Any, job_id: int) -> str:
    """Celery task: ``run_job(job_id)`` in this worker's context."""
    outcome = run_job(int(job_id), get_context())
    log.info("job %s: %s", job_id, outcome)
    if outcome == "released":  # this worker is stopping: the job waits in its queue for the next one
        try:
            ctx = get_context()
            with ctx.ro_factory() as s:
                keys = _serving_keys(s, [int(job_id)])
            CeleryJobQueue().enqueue(int(job_id), keys.get(int(job_id)))
        except Exception:
            log.warning("job %s: released, but not re-sent (the next sweep queues it)", job_id, exc_info=True)
    return outcome


class CeleryJobQueue:
    """:class:`atlas.queue.JobQueue` that sends job ids to the Celery workers through Redis."""

    def __init__(self, celery_app: Celery | None = None) -> None:
        self.app = celery_app or app

    def enqueue(self, job_id: int, serving_key: str | None = None) -> None:
        """Send ``fisher_atlas.run_job(job_id)`` to the queue of the job's model."""
        settings = self.app.fisher_atlas_settings  # type: ignore[attr-defined]
        queue = queue_name(settings, serving_key) if serving_key else self.app.conf.task_default_queue
        # one retry (a pooled connection gone stale across a Redis restart fails at once, the next connects): an
        # upload waits at most about two socket timeouts for an unreachable broker, then is taken back (503)
        self.app.send_task(TASK_NAME, args=[int(job_id)], queue=queue, retry=True, retry_policy=PUBLISH_RETRY)

    def depth(self, serving_key: str | None = None) -> int:
        """Messages waiting in the queue of the model of ``serving_key`` (default: this app's default queue, a
        worker's: the queue of its model)."""
        settings = self.app.fisher_atlas_settings  # type: ignore[attr-defined]
        queue = queue_name(settings, serving_key) if serving_key else self.app.conf.task_default_queue
        with self.app.connection_for_write() as conn:
            client = conn.default_channel.client
            return int(client.llen(queue))

    def close(self) -> None:
        """Close the app's broker connection pool (reopened on the next use)."""
        self.app.close()


_served: SpaceKey | None = None
"""The space this worker process serves (set by :func:`run_worker`)."""


def _serving_keys(session: Any, job_ids: list[int]) -> dict[int, str]:
    """The serving key of each job's queue: this worker's (:func:`run_worker`), else that of the job's own space
    (a worker started with plain ``celery … worker`` does not know its space; the base queue is consumed by none)."""
    if _served is not None:
        return dict.fromkeys(job_ids, _served.serving_key)
    return {job_id: serving_key(*fps) for job_id, fps in job_store.space_fingerprints_of(session, job_ids).items()}


def sweep(ctx: WorkerContext, jobs: CeleryJobQueue) -> list[int]:
    """Re-enqueue stale running jobs, and queued jobs whose model's broker queue is empty; return their ids.

    A worker that serves one space (:func:`run_worker`) sweeps only the jobs of that space and sends
    them to the queue of its model. A worker started with plain ``celery … worker`` serves no space it
    knows of: it sends each job to the queue of the job's own model (the base queue, which no worker
    consumes, kept a killed worker's job waiting for Redis's six-hour redelivery).
    """
    stale = ctx.settings.job_stale_after_s
    space_id = _served.space_id if _served is not None else None
    with ctx.ro_factory() as s:
        found = job_store.recoverable_job_statuses(s, stale_after_s=stale, queued_older_than_s=stale,
                                                   space_id=space_id)
        every = [job_id for job_id, _ in found]
        running = {job_id for job_id, status in found if status == JOB_RUNNING}
        keys = _serving_keys(s, every)
    # A queued job's wake-up may have been lost only when its model's queue is empty (each queue measured: the
    # base queue a plain worker reports is always empty, and re-sent every queued job at every sweep).
    idle = {key: jobs.depth(key) == 0 for key in set(keys.values())}
    ids = [job_id for job_id in every if job_id in running or idle.get(keys.get(job_id, ""), False)]
    for job_id in ids:
        jobs.enqueue(job_id, keys.get(job_id))
    if ids:
        log.info("sweep re-enqueued jobs %s", ids)
    return ids


@app.task(name=SWEEP_TASK_NAME, ignore_result=True)
def sweep_task() -> list[int]:
    """Celery task form of :func:`sweep` (for ``celery beat`` schedules)."""
    return sweep(get_context(), CeleryJobQueue())


def _sweep_loop(stop: threading.Event) -> None:
    """Sweep at start and periodically; one worker sweeps per period (Redis ``SET NX EX`` lock)."""
    ctx = get_context()
    jobs = CeleryJobQueue()
    period = max(1.0, ctx.settings.job_stale_after_s / 2.0)
    first = True
    while True:
        try:
            with app.connection_for_write() as conn:
                client = conn.default_channel.client
                key = f"{app.conf.task_default_queue}:sweep-lock"
                if first or client.set(key, ctx.worker_id, nx=True, ex=max(1, int(period))):
                    sweep(ctx, jobs)
        except Exception:
            log.exception("job sweep failed")
        first = False
        if stop.wait(period):
            return


_sweeper_stop = threading.Event()


@signals.worker_ready.connect
def _start_sweeper(**_: Any) -> None:
    threading.Thread(target=_sweep_loop, args=(_sweeper_stop,), name="fisher-atlas-sweeper", daemon=True).start()


@signals.worker_shutting_down.connect
def _release_running_job(**_: Any) -> None:
    """A warm shutdown (SIGTERM) began: the running job is released at its next batch, not an attempt, and
    re-sent to its queue (a solo worker kept sketching to the job's end, and the redeploy's SIGKILL then cost
    an attempt: five redeploys during one long job failed it). Called in the signal handler: no lock taken (a
    process without a context runs no job)."""
    ctx = _ctx
    if ctx is not None and _ctx_pid == os.getpid():
        ctx.shutdown.set()


@signals.worker_shutdown.connect
def _stop_sweeper(**_: Any) -> None:
    _sweeper_stop.set()


def serve_space(ctx: WorkerContext) -> SpaceKey:
    """Load this worker's model, create its space if new, and point the app at the model's queue."""
    global _served
    lm = ctx.model()
    with ctx.factory.begin() as session:
        space = ensure_space(session, lm, ctx.settings)
        key = SpaceKey.of(space)
    _served = key
    app.conf.task_default_queue = queue_name(ctx.settings, key.serving_key)
    return key


def run_worker(concurrency: int = 1, pool: str | None = None, loglevel: str = "INFO", banner: bool = True) -> None:
    """Run a worker in this process (``fisher-atlas worker``); returns when it stops.

    The worker loads its model at once, announces it, and serves both kinds of work of its space:
    upload jobs from the Celery queue of its model (:func:`queue_name`) and routing prompts from Redis
    (:class:`workers.prompt_remote.PromptServer`, one micro-batching loop). ``pool`` defaults to
    ``solo`` for one job at a time (one process per GPU) and ``prefork`` for more. The settings are
    read from the environment when this module is imported; set the ``FISHER_ATLAS_*`` variables first.
    ``banner=False`` leaves out Celery's start banner (stdout lines outside the log: JSON logs are objects only).
    """
    from workers.prompt_batcher import PromptBatcher
    from workers.prompt_remote import PromptServer

    ctx = get_context()
    key = serve_space(ctx)
    settings = ctx.settings
    with ctx.ro_factory() as session:
        space = get_space(session, key.space_id)
        extractor = ctx.extractor_for(space)
    batcher = PromptBatcher(extractor, max_batch=settings.prompt_max_batch, max_wait_ms=settings.prompt_max_wait_ms,
                            max_pending=settings.prompt_max_pending)
    server = PromptServer(settings.redis_url, batcher, key, worker_id=ctx.worker_id).start()
    log.info("worker %s serves model %s (space %s) on queue %s", ctx.worker_id, key.model_name, key.space_id,
             app.conf.task_default_queue)
    pool = pool or ("solo" if concurrency == 1 else "prefork")
    try:
        _worker_main(concurrency, pool, loglevel, banner)
    finally:
        server.stop()
        batcher.close()


@signals.worker_ready.connect
def _sighup_stops(sender: Any = None, **_: Any) -> None:
    """``worker_ready``: SIGHUP becomes a warm shutdown, as SIGTERM is. Celery makes it a restart (``exec`` of the same
    command, model load and all) whenever its output is not a terminal — a container, a unit, a log file: a worker
    told to stop went on serving (a review, 2026-12-07)."""
    from celery.apps.worker import install_worker_term_handler

    controller = getattr(sender, "controller", None)
    if controller is not None:
        install_worker_term_handler(controller, sig="SIGHUP")


def _worker_main(concurrency: int, pool: str, loglevel: str, banner: bool = True) -> None:
    app.worker_main([
        *([] if banner else ["--quiet"]),  # celery's own option, before its sub-command
        "worker", f"--pool={pool}", f"--concurrency={concurrency}", f"--loglevel={loglevel}",
        f"--queues={app.conf.task_default_queue}", "--without-gossip", "--without-mingle",
    ])
