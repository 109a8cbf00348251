"""Celery workers against the real Redis: a job completes; a worker killed with SIGKILL mid-job is recovered.

Each test uses its own broker queue name, so it can share the Redis server with anything else.
"""

from __future__ import annotations

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
from atlas.settings import Settings
from tests.workers.test_jobs import make_samples
from workers.jobs import WorkerContext, ensure_space, run_job
from workers.model_loading import LoadedModel

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REDIS_URL = os.environ.get("FISHER_ATLAS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REPO = Path(__file__).resolve().parents[2]
M, EVERY, STALE = 256, 40, 2.0


@pytest.fixture(scope="module")
def redis_ok() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        pytest.skip(f"Redis at {REDIS_URL} is unreachable: {exc}")
    return REDIS_URL


@pytest.fixture
def queue_name(redis_ok: str) -> Iterator[str]:
    name = f"fa_test_{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_ok)
    client.delete(name, f"{name}:sweep-lock")


@pytest.fixture
def settings(db_url: str, gpt2_dir: Path, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path, database_url=db_url, model=str(gpt2_dir), device="cpu", sketch_dim=M,
        checkpoint_every=EVERY, job_stale_after_s=STALE, max_tokens_per_sample=64, redis_url=REDIS_URL,
    )


class Worker:
    """A ``celery worker`` subprocess with the test's settings in its environment."""

    def __init__(self, settings: Settings, queue: str, log_path: Path) -> None:
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
             "-Q", queue, "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO"],
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


def _job(ctx_factory, job_id: int):
    with ctx_factory() as s:
        return job_store.get_job(s, job_id)


def test_worker_killed_mid_job_is_recovered(settings: Settings, factory, queue_name: str,
                                            gpt2_lm: LoadedModel, tmp_path: Path) -> None:
    from workers.celery_app import CeleryJobQueue, create_app

    jobs = CeleryJobQueue(create_app(settings, queue=queue_name))
    samples = make_samples(800, seed=42)
    ctx = WorkerContext(settings=settings, factory=factory, lm=gpt2_lm)
    with factory.begin() as s:
        space = ensure_space(s, gpt2_lm, settings)
        task, job = repository.create_task_with_job(s, space.id, "killed", "text", {}, samples)
    jobs.enqueue(job.id)
    assert jobs.depth() == 1

    first = Worker(settings, queue_name, tmp_path / "worker1.log")
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

    second = Worker(settings, queue_name, tmp_path / "worker2.log")
    try:
        _wait(lambda: _job(factory, job.id).status in ("succeeded", "failed"), 90, "the job to finish", second)
    finally:
        second.kill(signal.SIGTERM)
    final = _job(factory, job.id)
    assert final.status == "succeeded", final.error
    assert final.attempts == 2
    assert final.result["samples_used"] < len(samples)  # resumed from the checkpoint, not restarted

    # The same samples, uninterrupted, in this process: bit-identical state.
    with factory.begin() as s:
        twin, twin_job = repository.create_task_with_job(s, space.id, "uninterrupted", "text", {}, samples)
    assert run_job(twin_job.id, ctx) == "succeeded"
    with factory() as s:
        assert repository.get_state_blob(s, task.id) == repository.get_state_blob(s, twin.id)
        _, vecs = repository.get_signatures(s, task_ids=[task.id, twin.id])
        assert (vecs[0] == vecs[1]).all()
        assert repository.get_task(s, task.id).n_samples == repository.get_task(s, twin.id).n_samples

