"""The in-process runner against the real store (SQLite and PostgreSQL) and a tiny real model: it recovers queued
jobs at start, resumes a stopped one, keeps a bounded record of outcomes, and its queue has a capacity."""

from __future__ import annotations

import time

import pytest

from atlas import job_store
from atlas.queue import JobQueue
from tests.workers.job_helpers import create, make_samples, reference, stored_state
from workers.inprocess import InProcessRunner
from workers.worker_context import WorkerContext


def test_inprocess_runner_recovers_and_resumes(ctx: WorkerContext, space_id: int) -> None:
    # Jobs queued while no runner was up (e.g. the embedded service crashed) run at start.
    jobs = [create(ctx, space_id, f"r{i}", make_samples(3, seed=10 + i)) for i in range(3)]
    runner = InProcessRunner(ctx, threads=2)
    assert isinstance(runner, JobQueue)
    assert runner.start() == 3
    assert runner.join(timeout=60)
    assert [runner.outcomes[j] for _, j in jobs] == ["succeeded"] * 3

    # Stopping mid-job releases it with its checkpoint; the next start resumes it.
    samples = make_samples(300, seed=7)
    task_id, job_id = create(ctx, space_id, "stop-me", samples)
    runner.enqueue(job_id)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with ctx.factory() as s:
            if job_store.get_checkpoint(s, job_id) is not None:
                break
        time.sleep(0.02)
    runner.stop()
    with ctx.factory() as s:
        job = job_store.get_job(s, job_id)
        assert job.status == "queued" and job_store.get_checkpoint(s, job_id) is not None
        assert job.attempts == 0  # a graceful stop is not an attempt (restarts would exhaust job_max_attempts)
    fresh = InProcessRunner(ctx, threads=1)
    assert fresh.start() == 1
    assert fresh.join(timeout=60)
    fresh.stop()
    assert fresh.outcomes[job_id] == "succeeded"
    assert stored_state(ctx, task_id) == reference(ctx, space_id, samples).state.to_bytes()


def test_inprocess_runner_keeps_a_bounded_record_of_outcomes(ctx: WorkerContext, space_id: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived process runs jobs without end: the runner keeps only the last ``OUTCOMES_KEPT`` outcomes."""
    import workers.inprocess as inprocess

    monkeypatch.setattr(inprocess, "OUTCOMES_KEPT", 2)
    jobs = [create(ctx, space_id, f"bounded-{i}", make_samples(2, seed=40 + i)) for i in range(3)]
    runner = InProcessRunner(ctx, threads=1)
    try:
        assert runner.start() == 3
        assert runner.join(timeout=60)
    finally:
        runner.stop()
    assert len(runner.outcomes) == 2 and set(runner.outcomes.values()) == {"succeeded"}
    assert set(runner.outcomes) < {j for _, j in jobs}


def test_queue_capacity(ctx: WorkerContext, space_id: int) -> None:
    runner = InProcessRunner(ctx, threads=1)  # not started: jobs wait
    ids = [create(ctx, space_id, f"q{i}", make_samples(2, seed=20 + i))[1] for i in range(3)]
    for job_id in ids + ids[:1]:  # a duplicate wake-up is ignored
        runner.enqueue(job_id)
    assert runner.depth() == 3


def test_a_failing_sweep_logs_its_outage_once_not_a_traceback_each_time(
        ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A resource review (2026-12-07): with the database full or read-only, every sweep (every few seconds) logged
    "job sweep failed" with a 55-line traceback."""
    import sqlite3

    runner = InProcessRunner(ctx, threads=1)  # not started: sweeps called by hand

    def locked(*args: object, **kwargs: object) -> list[int]:
        raise sqlite3.OperationalError("database or disk is full")

    real = job_store.recoverable_jobs
    monkeypatch.setattr(job_store, "recoverable_jobs", locked)
    with caplog.at_level("DEBUG", logger="workers.inprocess"):
        assert [runner.sweep() for _ in range(5)] == [0] * 5
        monkeypatch.setattr(job_store, "recoverable_jobs", real)
        runner.sweep()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warnings and warnings[0].getMessage() == "the job sweep failed; retrying until it works"
    assert warnings[0].exc_info is not None and len(warnings) == 2  # one traceback, then "works again"
    assert warnings[1].getMessage().startswith("the job sweep works again after")
