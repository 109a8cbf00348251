"""The composition root: builds the object graph of one service process, once.

    settings → Store (SQL, migrations) → IndexManager (FAISS, derived) → StateLoader (cache)
             → PromptSketcher (in-process batcher over the loaded model, or Redis to remote workers)
             → JobQueue (in-process runner sharing the model, or Celery queues per model)
             → services: tasks, jobs, queries, spaces

Two shapes, chosen by ``settings.resolved_prompt_service()``:

* **embedded** (``inprocess``, the default): the model is loaded here once; the same model serves the
  prompt batcher and the job runner threads. If it fails to load the service still starts and answers
  503 where a model is needed.
* **scale-out** (``redis``, with ``queue="celery"``): this process loads **no model**; prompts and jobs
  go to ``fisher-atlas worker`` processes, each announcing the model it serves.

The HTTP app (:func:`service.app.create_app`) and library mode (:class:`fisher_atlas.Atlas`) both build
a :class:`Container` and call its services.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from atlas.errors import AtlasError, ModelUnavailable
from atlas.index import IndexManager
from atlas.models import Space
from atlas.ports import PromptSketcher, SpaceKey
from atlas.queue import JobQueue
from atlas.services import JobService, KeyService, QueryService, SpaceService, StateLoader, TaskService
from atlas.services.tasks import require_same_space
from atlas.services.thresholds import ThresholdService
from atlas.settings import Settings
from atlas.state_cache import StateCache
from atlas.store import Store
from service.auth import keys_required, prepare_keys
from service.metrics import Metrics
from service.streams import StreamSlots
from service.upload_slots import UploadSlots

log = logging.getLogger("fisher_atlas.service")

STATE_CACHE_BYTES = 512 * 1024 * 1024
"""Memory budget of the deserialised-state cache of a process."""


def remote_mode_notes(settings: Settings) -> list[str]:
    """What a front end without a model (prompts sketched by workers over Redis) does not do of what its settings
    ask, said at start (both were ignored silently): it runs no job itself, so the in-process queue is replaced by
    the workers' Celery queue; and it sketches nothing, so its error projection chooses nothing (its sketch size and
    seed still choose which of a model's announced spaces is the default, :meth:`atlas.store.Store.default_space`)."""
    notes = []
    if settings.queue != "celery":
        notes.append("FISHER_ATLAS_QUEUE=inprocess is not used: with prompts sketched by workers over Redis "
                     "(FISHER_ATLAS_PROMPT_SERVICE=redis) this process loads no model, so its jobs go to the "
                     "workers' Celery queue (set FISHER_ATLAS_QUEUE=celery to say so)")
    if "error_projection" in settings.model_fields_set:
        notes.append("FISHER_ATLAS_ERROR_PROJECTION has no effect on a front end without a model: each worker's "
                     "settings choose how it sketches")
    return notes


class Container:
    """Everything one service process holds (see the module docstring).

    Parameters
    ----------
    settings : Settings
    overrides : dict, optional
        Test and benchmark hooks: ``lm`` (an already loaded :class:`workers.model_loading.LoadedModel`,
        or ``None`` for a model that failed to load), ``migrate`` (bool, default true),
        ``start_runner`` (bool, default true: run queued jobs in-process).
    """

    def __init__(self, settings: Settings, overrides: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.overrides = dict(overrides or {})
        self.metrics = Metrics()
        self.keys_required = keys_required(settings)
        self.event_streams = StreamSlots(settings.max_event_streams_per_client, settings.max_event_streams)
        self.upload_slots = UploadSlots(settings.max_concurrent_uploads, settings.upload_slot_wait_s)
        self.lm: Any = None
        self.model_error: str | None = None
        self.store: Store | None = None
        self.index: IndexManager | None = None
        self.prompts: PromptSketcher | None = None
        self.queue: JobQueue | None = None
        self.runner: Any = None
        self.started = False
        self._stop = threading.Event()
        self._bg: threading.Thread | None = None
        self._lifecycle = threading.Lock()
        self._stop_asked = False  # a signal came: the job runner is not started any more
        self._runner_running = False

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Container:
        """Build and start the graph; on failure, close what was opened and re-raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # uploads and key hashes: owner only
        if self.overrides.get("migrate", True):
            from migrations import upgrade

            upgrade(s.resolved_database_url())
        self.store = store = Store(s)
        prepare_keys(store, s)
        self._drop_final_checkpoints()
        self.index = IndexManager(store.read, s.data_dir / "index", kind=s.index_kind, nprobe=s.index_nprobe,
                                  ivf_min_size=s.index_ivf_min_size, use_gpu=s.index_gpu)
        self.index.open()
        self.state_loader = StateLoader(store, StateCache(STATE_CACHE_BYTES))
        if s.resolved_prompt_service() == "redis":
            self._start_remote()
        else:
            self._start_embedded()
        assert self.prompts is not None and self.queue is not None
        observe = self.metrics.search_seconds
        self.tasks = TaskService(store, self.index, self.state_loader, self.queue, self.require_computable)
        self.jobs = JobService(store)
        self.keys = KeyService(store, on_change=self._keys_changed)
        self.queries = QueryService(store, self.index, self.state_loader, self.prompts,
                                    observe=lambda kind, seconds: observe.labels(kind=kind).observe(seconds),
                                    observe_forward=self.metrics.forward_seconds.observe)
        self.spaces = SpaceService(store, self.index)
        self.thresholds = ThresholdService(store, self.queries)
        self.metrics.watch_store(self.store_stats)
        self.metrics.watch_cache(self.state_loader.cache.stats)
        self._bg = threading.Thread(target=self._background, name="atlas-index-sync", daemon=True)
        self._bg.start()
        self.started = True

    def _load_model(self) -> None:
        if "lm" in self.overrides:
            self.lm = self.overrides["lm"]
            if self.lm is None:
                self.model_error = "no model loaded (disabled by the caller)"
            return
        from workers.model_loading import load_configured_model

        try:
            self.lm = load_configured_model(self.settings)
        except Exception as exc:
            self.model_error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            log.error("model %r could not be loaded: %s", self.settings.model, self.model_error)

    def _start_embedded(self) -> None:
        """The model here: prompt batcher + in-process job runner on the same model."""
        from fishersketch import SketchSpec
        from workers.extraction import Extractor
        from workers.inprocess import InProcessRunner
        from workers.prompt_batcher import InProcessPromptSketcher
        from workers.worker_context import WorkerContext, ensure_space

        s = self.settings
        assert self.store is not None
        self._load_model()
        self.store.model_error = self.model_error
        extractor = None
        if self.lm is not None:
            with self.store.session() as session:
                space = ensure_space(session, self.lm, s)
                self.store.default_space_id = int(space.id)
                for previous in self.lm.fingerprint.previous_keys:  # an export of before imports into this space
                    self.store.fingerprint_aliases[previous] = self.lm.fingerprint.key()
                _warn_if_elsewhere(session, space)
                sketcher = self.lm.make_sketcher(SketchSpec.from_dict(space.spec))
            extractor = Extractor(self.lm, sketcher, max_tokens_per_sample=s.max_tokens_per_sample)
        self.prompts = InProcessPromptSketcher(
            extractor, model_name=s.model, model_error=self.model_error, max_batch=s.prompt_max_batch,
            max_wait_ms=s.prompt_max_wait_ms, max_pending=s.prompt_max_pending)
        if s.queue == "celery":  # embedded prompts, jobs on Celery workers
            from workers.celery_app import CeleryJobQueue
            from workers.celery_app import create_app as create_celery

            self.queue = CeleryJobQueue(create_celery(s))
            return
        ctx = WorkerContext(settings=s, factory=self.store.write, index=self.index, lm=self.lm)
        self.runner = InProcessRunner(ctx)
        self.queue = self.runner
        if self.overrides.get("start_runner", True) and self.lm is not None:
            with self._lifecycle:
                if not self._stop_asked:  # a SIGTERM during the model's load: no job is claimed on the way out
                    self.runner.start()
                    self._runner_running = True

    def _start_remote(self) -> None:
        """No model here: prompts over Redis, jobs on the Celery queue of each space's model."""
        from workers.celery_app import CeleryJobQueue
        from workers.celery_app import create_app as create_celery
        from workers.prompt_remote import RedisPromptSketcher

        s = self.settings
        for note in remote_mode_notes(s):
            log.warning(note)
        self.prompts = prompts = RedisPromptSketcher(s.redis_url, timeout_s=s.prompt_timeout_s,
                                                     max_pending=s.prompt_max_pending)
        self.require_store().is_served = lambda space: bool(prompts.workers(SpaceKey.of(space).serving_key))
        self.queue = CeleryJobQueue(create_celery(s))

    def begin_stop(self) -> bool:
        """The first step of a stop, at the signal (non-blocking): the job runner releases its running jobs at their
        next batch and takes no new one, while the service lets its open requests finish; a runner not started yet
        (the model still loads) is not started at all. Returns whether no job can be running here — nothing of this
        process then needs a clean stop, and it may exit at once (a model's load of minutes held a SIGTERM until it
        ended, then started the runner and served before it stopped: a lifecycle review, 2026-12-07)."""
        with self._lifecycle:
            self._stop_asked = True
            running = self._runner_running
        if running and self.runner is not None:
            self.runner.begin_stop()
        return not running and not self.started

    def stop(self) -> None:
        """Stop the runner, the prompt loop and the index thread; persist the index; close the pool."""
        self._stop.set()
        closers: list[tuple[str, Any]] = [("job runner", self.runner.stop if self.runner is not None else None),
                                          ("prompt service", self.prompts.close if self.prompts is not None else None)]
        if self.runner is None:
            closers.append(("job queue", getattr(self.queue, "close", None)))
        for name, close in closers:
            if close is None:
                continue
            try:
                close()
            except Exception:
                log.warning("stopping the %s failed", name, exc_info=True)
        if self._bg is not None:
            self._bg.join(timeout=5)
        if self.index is not None:
            try:
                self.index.catch_up()
                self.index.persist()
            except Exception:
                log.warning("persisting the index failed", exc_info=True)
        queries = getattr(self, "queries", None)  # not made when the store could not be opened
        if queries is not None:  # a space's background re-fit reads the store: let it end first
            queries.wait_refits(timeout_s=5)
        if self.store is not None:
            self.store.close()
        self.started = False

    def _background(self) -> None:
        """Keep the index caught up with SQL (other replicas, workers) and persisted; a failing step is logged when it
        starts failing (with its traceback) and when it works again, not every second of an outage."""
        from workers.redis_options import OutageLog

        assert self.index is not None and self.store is not None
        syncing, saving = OutageLog(log, "keeping the index caught up with SQL"), OutageLog(log, "saving the index")
        pruning = OutageLog(log, "pruning the change log")
        last_persist = last_requeue = time.monotonic()
        while not self._stop.wait(1.0):
            try:
                self.index.catch_up(wait=False)
                self.state_loader.sync()
                if self.runner is None and time.monotonic() - last_requeue > self.settings.job_stale_after_s / 2:
                    self._requeue_dead_jobs()
                    last_requeue = time.monotonic()
                syncing.ok()
            except Exception as exc:
                syncing.failed(exc)
            if time.monotonic() - last_persist > 30:
                last_persist = time.monotonic()  # a failed save is tried again next period, not every second
                try:
                    self.index.persist()
                    saving.ok()
                except Exception as exc:
                    saving.failed(exc)
                try:  # behind the last saved index (its persisted watermarks), whether this save worked or not
                    self.index.compact(self.store.write)
                    pruning.ok()
                except Exception as exc:
                    pruning.failed(exc)

    def _drop_final_checkpoints(self) -> None:
        """Once at start: finished jobs' checkpoints left by earlier versions (a failure here is no reason not to
        start: a read-only database is reported by /readyz)."""
        from atlas import job_store

        try:
            with self.require_store().write.begin() as session:
                n = job_store.drop_final_checkpoints(session)
        except Exception:
            log.warning("dropping finished jobs' checkpoints failed", exc_info=True)
            return
        if n:
            log.info("dropped the checkpoints of %d finished job(s)", n)

    def _requeue_dead_jobs(self) -> None:
        """Jobs run on workers elsewhere: put a dead worker's jobs back to ``queued`` (workers re-run their own
        model's; this covers a model none of whose workers is left, where the job stayed ``running``)."""
        from atlas import job_store

        try:
            with self.require_store().write.begin() as session:
                done = job_store.requeue_dead_jobs(session, stale_after_s=self.settings.job_stale_after_s)
        except Exception:
            log.warning("re-queueing dead workers' jobs failed (retried at the next period)", exc_info=True)
            return
        if done.queued:
            log.warning("%d job(s) of a worker that stopped heartbeating are queued again", done.queued)
        if done.cancelled:
            log.warning("%d job(s) of a worker that stopped heartbeating were asked to cancel: cancelled",
                        done.cancelled)

    # -- policies shared by the services ---------------------------------------------------------

    def require_store(self) -> Store:
        """The store (started)."""
        if self.store is None:
            raise RuntimeError("the container is not started")
        return self.store

    def require_computable(self, space: Space) -> None:
        """Raise 503/409 unless some model of this deployment can compute signatures in ``space``."""
        assert self.prompts is not None
        if self.runner is not None or self.settings.resolved_prompt_service() == "inprocess":
            if self.lm is None:
                raise ModelUnavailable(
                    f"the model {self.settings.model!r} is not loaded: {self.model_error or 'unknown reason'}",
                    {"model": self.settings.model},
                )
            require_same_space(space, self.store.default_space_id if self.store else None)
            return
        self.prompts.check_served(SpaceKey.of(space))

    def unserved_reason(self, space_id: int) -> str | None:
        """Why this deployment cannot sketch in space ``space_id`` (what an import into it must say: an import into
        a service of another model or sketch dimension said only "imported", and its tasks then received no
        prompt), or ``None`` when it can."""
        store = self.require_store()
        with store.read() as session:
            space = store.resolve_space(session, space_id)
            try:
                self.require_computable(space)
            except AtlasError as exc:
                return (f"space {space_id} is not served by this service ({exc.message}): its tasks are stored, "
                        "aligned and recommended, but prompts route to them, and samples append to them, only where "
                        "a model of the space runs")
        return None

    # -- health ----------------------------------------------------------------------------------

    def database_ready(self) -> tuple[bool, str | None]:
        """Whether the database answers (``(False, exception name)`` when not)."""
        try:
            self.require_store().ping()
        except AtlasError as exc:  # read-only: say so
            return False, exc.message
        except Exception as exc:
            return False, type(exc).__name__
        return True, None

    def model_ready(self) -> tuple[bool, str]:
        """Whether prompts can be sketched (a loaded model, or a live worker over Redis), with a public reason
        (no model paths)."""
        if self.settings.resolved_prompt_service() == "redis":
            assert self.queries is not None and self.prompts is not None
            try:  # the default space first: a database that does not answer is not Redis's fault
                space = self.queries.space_key(None)
            except AtlasError as exc:  # no space yet (no worker ever announced one): said as the routes say it
                return False, exc.message
            except Exception:
                return False, "the default space cannot be read (see the database's check)"
            try:  # workers announce in Redis: ready when one serves the default space (and Redis answers)
                self.prompts.check_served(space)
            except Exception as exc:
                return False, ("the worker registry (Redis) is unreachable" if exc.__cause__ is not None
                               else "no live worker serves the default space (start `fisher-atlas worker`)")
            return True, "served by workers over Redis"
        if self.lm is None:
            return False, self.model_error or "not loaded"
        return True, self.lm.name

    def _keys_changed(self) -> None:
        """Make the key gate (:func:`service.auth.key_gate`, made on first use) see a created or revoked key at once
        (other replicas within its TTL)."""
        gate = getattr(self, "key_gate", None)
        if gate is not None:
            gate.invalidate()

    def store_stats(self) -> dict[str, Any]:
        """Job and queue figures for ``/metrics`` (aggregated in SQL at scrape time)."""
        out = self.jobs.stats()
        sid = self.store.default_space_id if self.store else None
        if sid is None and self.queries is not None:  # a replica without a model: the space it routes to by default
            with contextlib.suppress(AtlasError):
                sid = self.queries.space_key(None).space_id
        if sid is not None and self.index is not None:
            out["index_size"] = int(self.index.stats(sid)["count"])
        return out


def _warn_if_elsewhere(session: Any, space: Any) -> None:
    """Log a warning when the space this process serves is empty but the store holds other spaces' tasks (a
    restart with another model or ``--sketch-dim``: routes would answer none, ``tasks list`` shows them all)."""
    from atlas.space_repository import task_counts

    counts = task_counts(session)
    others = {sid: n for sid, n in sorted(counts.items()) if sid != space.id and n}
    if counts.get(int(space.id)) or not others:
        return
    log.warning("this process serves space %s (model %r, m=%s), which holds no task; the store's other tasks are "
                "in space(s) %s (by id: tasks), of another model or sketch spec: queries here do not see them. "
                "Start with that space's model and sketch settings to serve it.", space.id, space.model_name,
                space.m, others)
