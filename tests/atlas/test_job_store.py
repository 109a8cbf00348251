"""Job leases: one claimer wins, stale jobs are re-claimed, a lost lease cannot write, finishing is once-only."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from atlas import job_store, repository
from atlas.models import Job, utcnow
from atlas.samples import Sample
from tests.atlas.fixtures import make_space


def _job(factory: sessionmaker[Session], name: str = "t") -> tuple[int, int]:
    space = make_space(factory)
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, name, "text", {}, [Sample(text=name)])
    return task.id, job.id


def _age_heartbeat(factory: sessionmaker[Session], job_id: int, seconds: float) -> None:
    with factory.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow() - dt.timedelta(seconds=seconds)))


def test_concurrent_claims_have_one_winner(factory: sessionmaker[Session]) -> None:
    _, job_id = _job(factory)
    barrier = threading.Barrier(6)
    wins: list[job_store.Claim] = []

    def claim(i: int) -> None:
        barrier.wait()
        with factory.begin() as s:
            got = job_store.claim_job(s, job_id, worker=f"w{i}", stale_after_s=60)
        if got is not None:
            wins.append(got)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and wins[0].attempts == 1
    with factory() as s:
        job = job_store.get_job(s, job_id)
        assert (job.status, job.lease, job.attempts) == ("running", wins[0].lease, 1)


def test_stale_job_is_reclaimed_and_old_lease_is_dead(factory: sessionmaker[Session]) -> None:
    _, job_id = _job(factory)
    with factory.begin() as s:
        first = job_store.claim_job(s, job_id, worker="a", stale_after_s=60)
    assert first is not None
    with factory.begin() as s:
        assert job_store.claim_job(s, job_id, worker="b", stale_after_s=60) is None  # alive
        assert job_store.recoverable_jobs(s, stale_after_s=60) == []
    _age_heartbeat(factory, job_id, 120)
    with factory.begin() as s:
        assert job_store.recoverable_jobs(s, stale_after_s=60) == [job_id]
        assert job_store.recoverable_job_statuses(s, stale_after_s=60) == [(job_id, "running")]
        second = job_store.claim_job(s, job_id, worker="b", stale_after_s=60)
    assert second is not None and second.attempts == 2 and second.lease != first.lease
    with factory.begin() as s:
        assert not job_store.heartbeat(s, job_id, first.lease).alive
        assert not job_store.save_checkpoint(s, job_id, first.lease, samples_done=1, tokens=1, state=b"x",
                                             baselines=None)
        assert job_store.lock_held_job(s, job_id, first.lease) is None
        assert job_store.save_checkpoint(s, job_id, second.lease, samples_done=2, tokens=5, state=b"y",
                                         baselines=b"b", progress={"samples_done": 2})
    with factory.begin() as s:
        cp = job_store.get_checkpoint(s, job_id)
        assert (cp.samples_done, cp.state, cp.baselines) == (2, b"y", b"b")
        job = job_store.lock_held_job(s, job_id, second.lease)
        job_store.mark_succeeded(s, job, {"ok": True})
    with factory.begin() as s:
        assert job_store.get_checkpoint(s, job_id) is None
        assert job_store.claim_job(s, job_id, worker="c", stale_after_s=0.0) is None  # finished for good
        assert job_store.lock_held_job(s, job_id, second.lease) is None
        assert job_store.get_job(s, job_id).status == "succeeded"


def _checkpoint(factory: sessionmaker[Session], job_id: int, lease: str) -> None:
    with factory.begin() as s:
        assert job_store.save_checkpoint(s, job_id, lease, samples_done=1, tokens=3, state=b"s" * 64, baselines=None)


def test_cancel_and_fail(factory: sessionmaker[Session]) -> None:
    """A final job keeps no checkpoint: a cancelled or failed job's state blob stayed for good."""
    task_id, job_id = _job(factory, "a")
    with factory.begin() as s:
        claim = job_store.claim_job(s, job_id, worker="w", stale_after_s=60)
        job_store.request_cancel(s, job_id)
    _checkpoint(factory, job_id, claim.lease)
    with factory.begin() as s:
        beat = job_store.heartbeat(s, job_id, claim.lease)
        assert beat.alive and beat.cancel_requested
        assert job_store.finish_job(s, job_id, claim.lease, "cancelled")
    with factory() as s:
        assert job_store.get_job(s, job_id).status == "cancelled"
        assert repository.get_task(s, task_id).status == "failed"
        assert job_store.get_checkpoint(s, job_id) is None

    task_b, job_b = _job(factory, "b")
    with factory.begin() as s:
        claim = job_store.claim_job(s, job_b, worker="w", stale_after_s=60)
    _checkpoint(factory, job_b, claim.lease)
    with factory.begin() as s:
        assert job_store.finish_job(s, job_b, claim.lease, "failed", "tokenizer exploded")
        assert not job_store.finish_job(s, job_b, claim.lease, "failed", "again")
    with factory() as s:
        job = job_store.get_job(s, job_b)
        assert (job.status, job.error) == ("failed", "tokenizer exploded")
        assert job_store.get_checkpoint(s, job_b) is None
        assert job_store.count_jobs(s, ["failed", "cancelled"]) == 2
        assert job_store.list_jobs(s, task_id=task_b).total == 1


def _released(factory: sessionmaker[Session], reason: str) -> int:
    """A job claimed by a worker and released (``reason``) back to the queue: its id."""
    _, job_id = _job(factory)
    with factory.begin() as s:
        claim = job_store.claim_job(s, job_id, worker="a", stale_after_s=60)
        assert job_store.release_job(s, job_id, claim.lease, reason)
    return job_id


def test_release_and_reclaim(factory: sessionmaker[Session]) -> None:
    job_id = _released(factory, "database hiccup")
    with factory.begin() as s:
        assert job_store.get_job(s, job_id).status == "queued"
        assert job_store.recoverable_jobs(s, stale_after_s=60) == [job_id]
        assert job_store.recoverable_job_statuses(s, stale_after_s=60) == [(job_id, "queued")]
        assert job_store.recoverable_jobs(s, stale_after_s=60, queued_older_than_s=3600) == []
        claim = job_store.claim_job(s, job_id, worker="w", stale_after_s=60)
    _checkpoint(factory, job_id, claim.lease)
    with factory() as s:
        assert job_store.get_job(s, job_id).attempts == 2 and job_store.get_checkpoint(s, job_id) is not None
    # giving up on a job whose worker died every time: workers.jobs.run_job (tests/workers/test_jobs.py)


def test_cancelling_a_released_job_drops_the_checkpoint_it_waited_with(factory: sessionmaker[Session]) -> None:
    _, job_id = _job(factory)
    with factory.begin() as s:
        claim = job_store.claim_job(s, job_id, worker="a", stale_after_s=60)
    _checkpoint(factory, job_id, claim.lease)
    with factory.begin() as s:
        assert job_store.release_job(s, job_id, claim.lease, "worker shut down")
    with factory.begin() as s:
        assert job_store.get_checkpoint(s, job_id) is not None  # kept to resume from
        assert job_store.request_cancel(s, job_id).status == "cancelled"
    with factory() as s:
        assert job_store.get_checkpoint(s, job_id) is None


def test_space_sweep_recovers_a_dead_job_whose_task_was_deleted(factory: sessionmaker[Session]) -> None:
    """A worker died mid-job, then the task was deleted: the job (task_id now NULL) is still found by the
    per-space sweep a Celery worker runs, so it is re-claimed and ends (removed with its samples) instead of
    staying ``running`` for good."""
    task_id, job_id = _job(factory, "gone")
    space_id = make_space(factory).id
    with factory.begin() as s:
        assert job_store.claim_job(s, job_id, worker="dead", stale_after_s=60) is not None
    with factory.begin() as s:
        repository.delete_task(s, task_id)
    _age_heartbeat(factory, job_id, 120)
    with factory.begin() as s:
        assert job_store.get_job(s, job_id).task_id is None
        assert job_store.recoverable_jobs(s, stale_after_s=60, space_id=space_id) == [job_id]
        assert job_store.recoverable_jobs(s, stale_after_s=60, space_id=space_id + 1) == []


def test_a_claim_right_after_the_cancels_read_does_not_lose_the_cancel(factory: sessionmaker[Session]) -> None:
    """A worker claims the job just after ``request_cancel`` read it as queued. The read was unlocked: on PostgreSQL
    the claim committed, the cancel's ``UPDATE … WHERE status = 'queued'`` matched nothing, and the job ran to the
    end with its task searchable. The read now locks the row: the claim waits and finds the job cancelled."""
    from sqlalchemy import event

    _, job_id = _job(factory, "raced")
    engine = factory.kw["bind"]
    claims: list[object] = []
    worker = threading.Thread(target=lambda: claims.append(_claim(factory, job_id)))

    def after(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM jobs" in statement and not worker.is_alive() \
                and not claims:
            worker.start()  # the claim, between the cancel's read and its update
            worker.join(timeout=1.5)  # done at once when the read held no lock

    event.listen(engine, "after_cursor_execute", after)
    try:
        with factory.begin() as s:
            answered = job_store.request_cancel(s, job_id)
    finally:
        event.remove(engine, "after_cursor_execute", after)
    worker.join(timeout=30)
    assert claims == [None]  # the job was cancelled before the claim could take it
    assert answered.status == "cancelled"
    with factory() as s:
        assert job_store.get_job(s, job_id).status == "cancelled"


def _claim(factory: sessionmaker[Session], job_id: int) -> object:
    with factory.begin() as s:
        return job_store.claim_job(s, job_id, worker="w", stale_after_s=60)


def test_a_job_that_succeeds_after_a_release_keeps_no_error(factory: sessionmaker[Session]) -> None:
    """A job released by a worker's graceful shutdown and finished by the next one showed ``succeeded`` with the
    error "worker shut down; the job resumes from its last checkpoint"."""
    job_id = _released(factory, "worker shut down; the job resumes")
    with factory.begin() as s:
        assert job_store.get_job(s, job_id).error == "worker shut down; the job resumes"
        claim = job_store.claim_job(s, job_id, worker="b", stale_after_s=60)
        assert job_store.get_job(s, job_id).error is None  # running again: the release note is past
        job_store.mark_succeeded(s, job_store.lock_held_job(s, job_id, claim.lease), {"samples_used": 1})
    with factory.begin() as s:
        job = job_store.get_job(s, job_id)
        assert (job.status, job.error) == ("succeeded", None)


def test_finished_jobs_checkpoints_left_by_older_versions_are_dropped(factory: sessionmaker[Session]) -> None:
    from sqlalchemy import update

    from atlas.models import Job

    _, old = _job(factory, "old")
    _, live = _job(factory, "live")
    leases = {}
    for job_id in (old, live):
        with factory.begin() as s:
            leases[job_id] = job_store.claim_job(s, job_id, worker="w", stale_after_s=60).lease
        _checkpoint(factory, job_id, leases[job_id])
    with factory.begin() as s:  # how a version before 2026-11-25 left a cancelled job: final, checkpoint kept
        s.execute(update(Job).where(Job.id == old).values(status="cancelled", lease=None))
    with factory.begin() as s:
        assert job_store.drop_final_checkpoints(s) == 1
    with factory() as s:
        assert job_store.get_checkpoint(s, old) is None
        assert job_store.get_checkpoint(s, live) is not None  # a running job resumes from it


def test_a_worker_whose_clock_runs_behind_keeps_its_jobs(factory: sessionmaker[Session],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats are written and judged on the database's clock: a worker 30 s behind the API host had every job
    taken back as "its worker stopped" and, after the attempts, failed as killed (a multi-replica review, 2026-12-07).
    On SQLite the database is a file on this host, its clock this host's."""
    from atlas import db_clock

    _, job_id = _job(factory)
    real = db_clock.utcnow
    db_clock.forget_offsets()
    monkeypatch.setattr(db_clock, "utcnow", lambda: real() - dt.timedelta(seconds=30))  # the worker's host
    with factory.begin() as s:
        claim = job_store.claim_job(s, job_id, worker="slow-clock", stale_after_s=15)
        assert claim is not None
        assert job_store.heartbeat(s, job_id, claim.lease).alive
    dialect = factory.kw["bind"].dialect.name
    monkeypatch.setattr(db_clock, "utcnow", real)  # the API host's clock, right
    db_clock.forget_offsets()
    with factory.begin() as s:
        requeued = job_store.requeue_dead_jobs(s, stale_after_s=15)
    if dialect == "postgresql":
        assert requeued == (0, 0)  # alive: its heartbeat is on the server's clock
        with factory.begin() as s:
            assert job_store.claim_job(s, job_id, worker="other", stale_after_s=15) is None
    else:  # one host, one clock: a clock moved back 30 s is a heartbeat 30 s old
        assert requeued == (1, 0)
    db_clock.forget_offsets()


def test_an_outage_past_the_stale_window_gives_the_attempt_back(factory: sessionmaker[Session]) -> None:
    """A worker blocked by a database outage longer than the stale window: another process's sweep re-queues its
    job first (the heartbeat could not be written), counting the attempt. The worker's release once the database is
    back gives the attempt back while nobody has claimed the job since — never once another worker holds it."""
    for claimed_since in (False, True):
        _, job_id = _job(factory, name=f"outage-{claimed_since}")
        with factory.begin() as s:
            claim = job_store.claim_job(s, job_id, worker="w1", stale_after_s=15)
            assert claim is not None and claim.attempts == 1
        _age_heartbeat(factory, job_id, 60)
        with factory.begin() as s:
            assert job_store.requeue_dead_jobs(s, stale_after_s=15).queued == 1
        if claimed_since:
            with factory.begin() as s:
                assert job_store.claim_job(s, job_id, worker="w2", stale_after_s=15) is not None
        with factory.begin() as s:
            assert not job_store.release_job(s, job_id, claim.lease, "store unavailable", count_attempt=False,
                                             worker="someone-else")  # not its job to give back
            given_back = job_store.release_job(s, job_id, claim.lease, "store unavailable: down",
                                               count_attempt=False, worker="w1")
        with factory() as s:
            job = job_store.get_job(s, job_id)
        if claimed_since:
            assert not given_back and (job.status, job.attempts, job.worker) == ("running", 2, "w2")
        else:
            assert given_back and (job.status, job.attempts) == ("queued", 0)
            assert "store unavailable" in (job.error or "")
