"""Celery workers against the real Redis: a worker killed with SIGKILL mid-job is recovered; a worker asked to
stop (SIGTERM) releases its job without counting an attempt.

Workers are started the plain-Celery way the module documents (``celery -A workers.celery_app worker -Q
<queue>.<serving key>``), consuming the queue of their model where the API sends its jobs. Each test uses its own
broker queue names, so it can share the Redis server with anything else.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from atlas import job_store, repository
from atlas.ports import SpaceKey
from atlas.settings import Settings
from tests.conftest import REDIS_URL
from tests.workers.job_helpers import make_samples
from workers.jobs import run_job
from workers.model_loading import LoadedModel
from workers.worker_context import WorkerContext, ensure_space

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
M, EVERY, STALE = 256, 40, 2.0


@pytest.fixture
def queue_name(redis_url: str) -> Iterator[str]:
    name = f"fa_test_{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{name}*"):
        client.delete(key)


@pytest.fixture
def settings(db_url: str, gpt2_dir: Path, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path, database_url=db_url, model=str(gpt2_dir), device="cpu", sketch_dim=M,
        checkpoint_every=EVERY, job_stale_after_s=STALE, max_tokens_per_sample=64, redis_url=REDIS_URL,
    )


class Worker:
    """A ``celery worker`` subprocess with the test's settings in its environment."""

    def __init__(self, settings: Settings, queue: str, log_path: Path, consume: str | None = None) -> None:
        """``queue``: the base queue name (``FISHER_ATLAS_CELERY_QUEUE``); ``consume``: the queue it consumes (``-Q``,
        default ``queue``)."""
        env = dict(os.environ)
        env.update({
            "FISHER_ATLAS_DATABASE_URL": settings.resolved_database_url(),
            "FISHER_ATLAS_REDIS_URL": settings.redis_url,
            "FISHER_ATLAS_MODEL": settings.model,
            "FISHER_ATLAS_DEVICE": "cpu",
            "FISHER_ATLAS_SKETCH_DIM": str(settings.sketch_dim),
            "FISHER_ATLAS_CHECKPOINT_EVERY": str(settings.checkpoint_every),
            "FISHER_ATLAS_JOB_STALE_AFTER_S": str(settings.job_stale_after_s),
            "FISHER_ATLAS_MAX_TOKENS_PER_SAMPLE": str(settings.max_tokens_per_sample),
            "FISHER_ATLAS_CELERY_QUEUE": queue,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p),
        })
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "--pool=solo", "-c", "1",
             "-Q", consume or queue, "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO"],
            cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def _wait(predicate, timeout: float, what: str, worker: Worker | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if worker is not None and worker.proc.poll() is not None:
            raise AssertionError(f"worker exited while waiting for {what}:\n{worker.log()}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{worker.log()}" if worker else ""))


def _claimed_by(factory, job_id: int, pid: int) -> bool:
    job = _job(factory, job_id)
    return bool(job.status == "running" and str(pid) in (job.worker or ""))


def _job(ctx_factory, job_id: int):
    with ctx_factory() as s:
        return job_store.get_job(s, job_id)


def _model_queue(settings: Settings, factory, queue_name: str, gpt2_lm: LoadedModel, name: str, samples) -> tuple:
    """A job queued as the API queues it: on its model's queue. (job queue, model queue name, space, task, job)"""
    from workers.celery_app import CeleryJobQueue, create_app

    with factory.begin() as s:
        space = ensure_space(s, gpt2_lm, settings)
        task, job = repository.create_task_with_job(s, space.id, name, "text", {}, samples)
        key = SpaceKey.of(space).serving_key
    model_queue = f"{queue_name}.{key}"
    jobs = CeleryJobQueue(create_app(settings.model_copy(update={"celery_queue": queue_name}), queue=model_queue))
    jobs.enqueue(job.id, key)
    assert jobs.depth() == 1
    return jobs, model_queue, space, task, job


def test_worker_killed_mid_job_is_recovered(settings: Settings, factory, queue_name: str,
                                            gpt2_lm: LoadedModel, tmp_path: Path) -> None:
    samples = make_samples(800, seed=42)
    ctx = WorkerContext(settings=settings, factory=factory, lm=gpt2_lm)
    _, model_queue, space, task, job = _model_queue(settings, factory, queue_name, gpt2_lm, "killed", samples)

    first = Worker(settings, queue_name, tmp_path / "worker1.log", model_queue)
    try:
        def has_checkpoint() -> bool:
            with factory() as s:
                return job_store.get_checkpoint(s, job.id) is not None

        _wait(has_checkpoint, 60, "the first checkpoint", first)
    finally:
        first.kill(signal.SIGKILL)  # kill -9 mid-job: no cleanup, no ack
    killed_at = _job(factory, job.id)
    assert killed_at.status == "running" and killed_at.attempts == 1
    with factory() as s:
        done_before = job_store.get_checkpoint(s, job.id).samples_done
    assert 0 < done_before < len(samples)

    # Its message is unacknowledged until Redis's redelivery (hours): the new worker's sweep sends the stale job to
    # its model's queue (it sent it to the base queue, which no worker consumes).
    second = Worker(settings, queue_name, tmp_path / "worker2.log", model_queue)
    try:
        _wait(lambda: _job(factory, job.id).status in ("succeeded", "failed"), 90, "the job to finish", second)
    finally:
        second.kill(signal.SIGTERM)
    final = _job(factory, job.id)
    assert final.status == "succeeded", final.error
    assert final.attempts == 2
    assert f"resuming after {done_before} of {len(samples)} samples" in second.log_path.read_text(errors="replace")
    assert final.result["samples_used"] == len(samples)  # the counts go on from the checkpoint's

    # The same samples, uninterrupted, in this process: bit-identical state.
    with factory.begin() as s:
        twin, twin_job = repository.create_task_with_job(s, space.id, "uninterrupted", "text", {}, samples)
    assert run_job(twin_job.id, ctx) == "succeeded"
    with factory() as s:
        assert repository.get_state_blob(s, task.id) == repository.get_state_blob(s, twin.id)
        _, vecs = repository.get_signatures(s, task_ids=[task.id, twin.id])
        assert (vecs[0] == vecs[1]).all()
        assert repository.get_task(s, task.id).n_samples == repository.get_task(s, twin.id).n_samples



@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the store's part is covered in test_jobs
def test_a_worker_asked_to_stop_releases_its_job_without_an_attempt(settings: Settings, factory, queue_name: str,
                                                                    gpt2_lm: LoadedModel, tmp_path: Path) -> None:
    """SIGTERM (a redeploy's stop) began a warm shutdown in which a solo worker sketched on to the job's end; the
    orchestrator's SIGKILL then cost an attempt, and five redeploys during one long job failed it. The worker now
    releases the job at its next batch (not an attempt) and re-sends it to its model's queue."""
    samples = make_samples(3000, seed=43)
    settings = settings.model_copy(update={"job_stale_after_s": 600.0})  # no sweep re-sends the job meanwhile
    jobs, model_queue, _, _, job = _model_queue(settings, factory, queue_name, gpt2_lm, "stopped", samples)
    for round_ in range(2):
        worker = Worker(settings, queue_name, tmp_path / f"worker{round_}.log", model_queue)
        try:
            _wait(functools.partial(_claimed_by, factory, job.id, worker.proc.pid), 60, "the claim", worker)
            worker.proc.send_signal(signal.SIGTERM)  # the main process: Celery's warm shutdown
            worker.proc.wait(timeout=90)
        finally:
            worker.kill(signal.SIGKILL)
        stopped = _job(factory, job.id)
        assert stopped.status == "queued" and stopped.attempts == 0, (stopped.status, stopped.attempts, worker.log())
        assert jobs.depth() == 1  # re-sent by the stopping worker: the next worker of the model takes it at once


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_plain_workers_sweep_resends_a_queued_job_only_to_an_empty_model_queue(
        settings: Settings, factory, queue_name: str) -> None:
    """A worker started with plain ``celery … worker`` measured the base queue (always empty) to decide whether a
    queued job's wake-up was lost, and re-sent every old queued job to its model's queue at every sweep: the queue
    grew by the backlog every few seconds."""
    import datetime as dt

    from sqlalchemy import update

    from atlas.models import Job
    from atlas.ports import serving_key
    from atlas.samples import Sample
    from workers import celery_app

    base = settings.model_copy(update={"celery_queue": queue_name})
    with factory.begin() as s:
        space = repository.get_or_create_space(s, model_fingerprint="m" * 20, spec_fingerprint="x", model_name="m",
                                               d=1, K=1, m=8, seed=0, spec={})
        key = serving_key(space.model_fingerprint, space.spec_fingerprint)
        for i in range(5):
            repository.create_task_with_job(s, space.id, f"t{i}", "text", {}, [Sample(text="a b c")])
        s.execute(update(Job).values(created_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)))  # lost wake-ups
    ctx = WorkerContext(settings=base, factory=factory)
    jobs = celery_app.CeleryJobQueue(celery_app.create_app(base))
    assert celery_app._served is None
    lengths = []
    for _ in range(3):
        celery_app.sweep(ctx, jobs)
        lengths.append(jobs.depth(key))
    assert lengths == [5, 5, 5]
