"""Job lifecycle edges found in review (2026-11-28), on SQLite and PostgreSQL; each failed before its fix.

* A job whose task was deleted while its worker was dead, put back to ``queued`` by an API replica and then
  cancelled, stayed ``cancelled`` for good with its samples (every other job of a deleted task is removed when it
  stops, with the uploads no job references).
* An append racing a delete of its task (two replicas, PostgreSQL) answered 409 "a request with this idempotency
  key is being processed" — no key had been sent; the task was gone (404).
* A create that lost the race for its idempotency key was answered with the winner's task as if it had created it,
  so the service woke the job again and, had that failed, took back (deleted) the winner's task.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from atlas import job_store, repository
from atlas.errors import NotFound
from atlas.models import JOB_CANCELLED, Job, Upload
from atlas.samples import Sample
from tests.atlas.fixtures import make_space

SAMPLES = [Sample(text="alpha beta gamma"), Sample(text="delta epsilon")]


def _count(factory: sessionmaker[Session], model: type) -> int:
    with factory() as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


def test_cancelling_a_requeued_job_of_a_deleted_task_removes_it_and_its_samples(
        factory: sessionmaker[Session]) -> None:
    space = make_space(factory)
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "t", "text", {}, SAMPLES)
        task_id, job_id = int(task.id), int(job.id)
    with factory.begin() as s:  # a worker takes it and dies
        assert job_store.claim_job(s, job_id, worker="dead", stale_after_s=60.0) is not None
    with factory.begin() as s:  # the task is deleted meanwhile: its running job stays, task-less
        repository.delete_task(s, task_id)
    time.sleep(0.3)
    with factory.begin() as s:  # a job asked to cancel (the delete asked it): taken back as it was
        s.execute(update(Job).where(Job.id == job_id).values(cancel_requested=False))
    with factory.begin() as s:  # an API replica puts the dead worker's job back
        assert job_store.requeue_dead_jobs(s, stale_after_s=0.1, except_model="another-model") == (1, 0)
    assert _count(factory, Upload) == 1
    with factory.begin() as s:
        answer = job_store.request_cancel(s, job_id)
    assert answer.status == JOB_CANCELLED and answer.id == job_id
    assert _count(factory, Job) == 0 and _count(factory, Upload) == 0
    # as it happens (the delete asked the running job to cancel): putting it back carries the cancel out at once
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "t", "text", {}, SAMPLES)
        task_id, job_id = int(task.id), int(job.id)
    with factory.begin() as s:
        assert job_store.claim_job(s, job_id, worker="dead", stale_after_s=60.0) is not None
    with factory.begin() as s:
        repository.delete_task(s, task_id)
    time.sleep(0.3)
    with factory.begin() as s:
        assert job_store.requeue_dead_jobs(s, stale_after_s=0.1, except_model="another-model") == (0, 1)
    assert _count(factory, Job) == 0 and _count(factory, Upload) == 0
    with factory() as s, pytest.raises(NotFound):
        job_store.get_job(s, job_id)


def test_a_cancel_sent_while_the_worker_was_dead_is_carried_out_when_its_job_is_put_back(
        factory: sessionmaker[Session]) -> None:
    """A running job asked to cancel after its worker died was put back to ``queued`` with its cancel requested and
    stayed there (an operator review, 2026-12-07): only a second cancel ended it, and its task's name stayed taken."""
    space = make_space(factory)
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "t", "text", {}, SAMPLES)
        _, other_job = repository.create_task_with_job(s, space.id, "u", "text", {}, SAMPLES)
        task_id, job_id, other_job_id = int(task.id), int(job.id), int(other_job.id)
    with factory.begin() as s:  # a worker takes both and dies; one is asked to cancel meanwhile
        for j in (job_id, other_job_id):
            assert job_store.claim_job(s, j, worker="dead", stale_after_s=60.0) is not None
    with factory.begin() as s:
        assert job_store.request_cancel(s, job_id).status == "running"  # asked: the worker would stop it
    time.sleep(0.3)
    with factory.begin() as s:
        assert job_store.requeue_dead_jobs(s, stale_after_s=0.1, except_model="another-model") == (1, 1)
    with factory() as s:
        assert job_store.get_job(s, job_id).status == JOB_CANCELLED
        assert job_store.get_job(s, other_job_id).status == "queued"  # not asked: put back to run again
        assert repository.get_task(s, task_id).status == "failed"  # its create was cancelled: no signature


@pytest.mark.postgres
def test_an_append_racing_the_delete_of_its_task_is_a_404(pg_database, factory: sessionmaker[Session]) -> None:
    if factory.kw["bind"].dialect.name != "postgresql":
        pytest.skip("SQLite serialises writers: no race")
    space = make_space(factory)
    with factory.begin() as s:
        task, _ = repository.create_task_with_job(s, space.id, "t", "text", {}, SAMPLES)
        task_id = int(task.id)
    deleting = factory()
    deleting.begin()
    repository.delete_task(deleting, task_id)  # one replica: deleted, not yet committed
    outcome: dict[str, object] = {}

    def append() -> None:  # another replica appends meanwhile
        with factory() as s:
            try:
                with s.begin():
                    outcome["job"] = repository.append_samples(s, task_id, [Sample(text="more words here")]).id
            except Exception as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=append)
    thread.start()
    time.sleep(0.5)
    deleting.commit()
    deleting.close()
    thread.join(20)
    assert isinstance(outcome.get("error"), NotFound), outcome
    assert _count(factory, Job) == 0 and _count(factory, Upload) == 0


@pytest.mark.postgres
def test_a_create_that_loses_the_race_for_its_key_is_reported_as_a_replay(
        pg_database, factory: sessionmaker[Session]) -> None:
    """Two requests with one key: the second found no job of its key, then lost the race for the task's name and
    was answered with the first's task — reported as created, so its caller would wake the job again and, had that
    failed, deleted the first request's task."""
    if factory.kw["bind"].dialect.name != "postgresql":
        pytest.skip("SQLite serialises writers: no race")
    space = make_space(factory)
    first = factory()
    first.begin()
    task, _, created_first = repository.create_or_replay_task(first, space.id, "t", "text", {}, SAMPLES,
                                                              idempotency_key="k")
    outcome: dict[str, object] = {}

    def second() -> None:
        with factory() as s, s.begin():
            got = repository.create_or_replay_task(s, space.id, "t", "text", {}, SAMPLES, idempotency_key="k")
            outcome["task"], outcome["created"] = got[0].id, got[2]

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.5)  # the second request waits on the first's name
    first.commit()
    first.close()
    thread.join(20)
    assert created_first is True
    assert outcome == {"task": task.id, "created": False}
