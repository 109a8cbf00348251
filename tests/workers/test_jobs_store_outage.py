"""A job whose database goes away for a few seconds: queued again for its retry, and the outage not counted.

Found by an outage review (2026-11-29): two PostgreSQL restarts during one long job (``job_max_attempts`` 2) failed
it with "the worker stopped each time without finishing (out of memory or killed?)" although the worker was alive;
each outage counted as an attempt, and the release after it failed while the database was still down, leaving the
job running under the worker's lease (its retry was skipped until a sweep found it stale). Real PostgreSQL: the
job's database refuses connections and its sessions are terminated, as in a restart; the server itself stays up.
"""

from __future__ import annotations

import threading
import time

import pytest

from atlas import job_store
from tests.store_helpers import pg_outage
from tests.workers.job_helpers import create, make_samples
from workers.jobs import TransientJobError, run_job
from workers.worker_context import WorkerContext

OUTAGE_S = 3.0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_database_outage_requeues_the_job_without_counting_an_attempt(ctx: WorkerContext, space_id: int,
                                                                        db_url: str) -> None:
    ctx = WorkerContext(settings=ctx.settings.model_copy(update={"job_stale_after_s": 4 * OUTAGE_S}),
                        factory=ctx.factory, lm=ctx.lm)  # the release waits out half the stale window
    _task_id, job_id = create(ctx, space_id, "long", make_samples(3000, seed=3))
    runner, outcome = _running_past_a_checkpoint(ctx, job_id)  # the outage strikes mid-job
    pg_outage(db_url, OUTAGE_S)
    runner.join(60)
    assert not runner.is_alive() and len(outcome) == 1
    assert isinstance(outcome[0], TransientJobError), outcome  # Celery retries it
    with ctx.factory() as s:
        job = job_store.get_job(s, job_id)
    assert job.status == "queued", (job.status, job.error)  # released, so its retry can claim it at once
    assert job.attempts == 0 and "store unavailable" in (job.error or "")  # the outage was not an attempt
    assert run_job(job_id, ctx) == "succeeded"  # the retry resumes it
    with ctx.factory() as s:
        assert job_store.get_job(s, job_id).attempts == 1


def _running_past_a_checkpoint(ctx: WorkerContext, job_id: int) -> tuple[threading.Thread, list[object]]:
    """The job run in a thread (its outcome, or its :class:`TransientJobError`, appended to the list), returned once
    it is running with a checkpoint stored."""
    outcome: list[object] = []
    runner = threading.Thread(target=lambda: outcome.append(_run(job_id, ctx)))
    runner.start()
    deadline = time.monotonic() + 60
    while True:
        with ctx.factory() as s:
            job = job_store.get_job(s, job_id)
        if job.status == "running" and job.progress.get("samples_done", 0) > 0:
            return runner, outcome
        assert job.status in ("queued", "running") and time.monotonic() < deadline, job.status
        time.sleep(0.05)


def _run(job_id: int, ctx: WorkerContext) -> object:
    try:
        return run_job(job_id, ctx)
    except TransientJobError as exc:
        return exc


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_full_disk_requeues_the_job_without_counting_an_attempt(ctx: WorkerContext, space_id: int) -> None:
    """A full disk is an outage an operator mends, not the job's fault: each failed checkpoint counted an attempt,
    and two minutes of a full disk failed a job for good as if its worker had died (a chaos review, 2026-12-07).
    SQLite's own "database or disk is full", made by capping the file's pages (``max_page_count``) at its size."""
    from sqlalchemy import event, text

    engine = ctx.factory.kw["bind"]
    full = threading.Event()

    @event.listens_for(engine, "checkout")
    def cap(dbapi_conn: object, _record: object, _proxy: object) -> None:
        cur = dbapi_conn.cursor()  # type: ignore[attr-defined]
        pages = cur.execute("PRAGMA page_count").fetchone()[0]
        cur.execute(f"PRAGMA max_page_count = {pages if full.is_set() else 1 << 30}")
        cur.close()

    _task_id, job_id = create(ctx, space_id, "long", make_samples(3000, seed=3))
    runner, outcome = _running_past_a_checkpoint(ctx, job_id)  # the disk fills mid-job
    full.set()
    runner.join(120)
    assert not runner.is_alive() and len(outcome) == 1
    assert isinstance(outcome[0], TransientJobError) and "disk is full" in str(outcome[0]), outcome
    full.clear()
    with ctx.factory() as s:
        job = job_store.get_job(s, job_id)
        assert s.execute(text("PRAGMA max_page_count")).scalar_one() == 1 << 30
    assert job.status == "queued" and job.attempts == 0, (job.status, job.attempts, job.error)
    assert "the store cannot be written (database or disk is full)" in (job.error or "")  # what the operator reads
    assert run_job(job_id, ctx) == "succeeded"  # the disk mended: the retry resumes it
    with ctx.factory() as s:
        assert job_store.get_job(s, job_id).attempts == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_cancel_the_store_cannot_write_gives_the_job_back_and_ends_it_later(ctx: WorkerContext,
                                                                             space_id: int) -> None:
    """A resource review (2026-12-07): a job whose cancel was asked, claimed while the disk was full, raised out of
    ``run_job`` when its end could not be written ("unexpected error in the runner"), stayed ``running`` until a
    sweep found it stale, and the sweep counted an attempt. The store's error comes from SQLite here ("database or
    disk is full", raised for the statement that writes the job's end)."""
    import sqlite3

    from sqlalchemy import event

    _task_id, job_id = create(ctx, space_id, "cancelled", make_samples(4, seed=5))
    with ctx.factory.begin() as s:  # running on a worker, asked to stop, then given back (its worker stopping)
        claim = job_store.claim_job(s, job_id, worker="w", stale_after_s=60)
        job_store.request_cancel(s, job_id)
        assert job_store.release_job(s, job_id, claim.lease, "worker shut down", count_attempt=False)
    engine = ctx.factory.kw["bind"]
    full = threading.Event()
    full.set()

    @event.listens_for(engine, "before_cursor_execute")
    def disk_full(_conn: object, _cursor: object, statement: str, params: object, *_: object) -> None:
        if full.is_set() and statement.lstrip().upper().startswith("UPDATE JOBS") and "cancelled" in str(params):
            raise sqlite3.OperationalError("database or disk is full")

    outcome = _run(job_id, ctx)
    assert isinstance(outcome, TransientJobError) and "disk is full" in str(outcome), outcome
    with ctx.factory() as s:
        job = job_store.get_job(s, job_id)
    assert job.status == "queued" and job.cancel_requested, (job.status, job.error)
    assert job.attempts == 0  # a full disk is not an attempt
    full.clear()  # space again: the next claim writes its end
    assert run_job(job_id, ctx) == "cancelled"
    with ctx.factory() as s:
        assert job_store.get_job(s, job_id).status == "cancelled"
