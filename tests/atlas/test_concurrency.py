"""8 concurrent appenders and 16 concurrent searchers: no lost or duplicate rows, no exceptions."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from atlas import changes, repository
from atlas.index import IndexManager
from atlas.models import Change, Task
from atlas.samples import Sample
from tests.atlas.fixtures import make_space, unit_vectors

M = 32
APPENDERS, SEARCHERS, ROUNDS = 8, 16, 12


def test_appenders_and_searchers(factory: sessionmaker[Session], ro_factory: sessionmaker[Session],
                                 tmp_path: Path) -> None:
    space = make_space(factory, m=M)
    shared = []
    with factory.begin() as s:  # a few tasks every appender merges into (read-modify-write races)
        for i in range(3):
            task, _ = repository.create_task_with_job(s, space.id, f"shared{i}", "text", {}, [Sample(text=str(i))])
            repository.store_task_result(s, task, state=b"s", signature=unit_vectors(1, M, 1000 + i)[0],
                                         baselines=None, n_samples=0, n_tokens=0)
            shared.append(task.id)
    index = IndexManager(ro_factory, tmp_path, catch_up_interval_s=0.0)
    index.open()

    errors: list[BaseException] = []
    created: list[int] = []
    created_lock = threading.Lock()
    done = threading.Event()
    start = threading.Barrier(APPENDERS + SEARCHERS + 1)

    def appender(w: int) -> None:
        try:
            start.wait()
            vecs = unit_vectors(ROUNDS, M, seed=w)
            merged = unit_vectors(ROUNDS, M, seed=100 + w)  # distinct, so the final oracle has no ties
            for r in range(ROUNDS):
                with factory.begin() as s:  # a new task finishing its create job
                    task, _ = repository.create_task_with_job(
                        s, space.id, f"w{w}-r{r}", "text", {}, [Sample(text=f"{w}/{r}")]
                    )
                    repository.store_task_result(s, task, state=b"x", signature=vecs[r], baselines=None,
                                                 n_samples=1, n_tokens=1)
                with created_lock:
                    created.append(task.id)
                with factory.begin() as s:  # an append merging into a shared task
                    target = repository.lock_task(s, shared[(w + r) % len(shared)])
                    repository.store_task_result(s, target, state=b"y", signature=merged[r], baselines=None,
                                                 n_samples=target.n_samples + 1, n_tokens=target.n_tokens + 2)
        except BaseException as exc:
            errors.append(exc)

    def searcher(q: int) -> None:
        try:
            start.wait()
            query = unit_vectors(2, M, seed=500 + q)
            while not done.is_set():
                scores, ids = index.search(space.id, query, 10, fresh=True)
                for row_scores, row_ids in zip(scores, ids, strict=True):
                    assert len(set(row_ids.tolist())) == len(row_ids), "duplicate id in one answer"
                    assert np.all(np.diff(row_scores) <= 1e-6), "scores not sorted"
                    assert np.all(row_ids >= 0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=appender, args=(w,)) for w in range(APPENDERS)]
    threads += [threading.Thread(target=searcher, args=(q,)) for q in range(SEARCHERS)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads[:APPENDERS]:
        t.join(timeout=120)
    done.set()
    for t in threads[APPENDERS:]:
        t.join(timeout=60)
    assert not errors, errors[:3]

    index.catch_up()
    with factory() as s:
        assert len(created) == len(set(created)) == APPENDERS * ROUNDS
        assert s.execute(select(func.count()).select_from(Task)).scalar_one() == APPENDERS * ROUNDS + 3
        # No lost update: every append's increment landed.
        assert sum(repository.get_task(s, t).n_samples for t in shared) == APPENDERS * ROUNDS
        assert sum(repository.get_task(s, t).version for t in shared) == APPENDERS * ROUNDS + 3
        # The change sequence is gap-free and each change is one row.
        seqs = s.execute(select(Change.seq).order_by(Change.seq)).scalars().all()
        assert seqs == list(range(1, changes.last_seq(s) + 1)) and len(seqs) == 3 + 2 * APPENDERS * ROUNDS
        sql_ids, sql_vecs = repository.get_signatures(s, space_id=space.id)
    assert index.ids(space.id).tolist() == sql_ids.tolist()
    assert index.stats(space.id)["count"] == len(sql_ids) == APPENDERS * ROUNDS + 3
    # And the index answers like the table.
    queries = unit_vectors(5, M, seed=77)
    _, got = index.search(space.id, queries, 5)
    expected = sql_ids[np.argsort(-(queries @ sql_vecs.T), axis=1)[:, :5]]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.postgres
def test_deleting_a_task_while_its_job_ends_does_not_deadlock(pg_database: str) -> None:
    """A job's final transaction locks its job row, then its task; a delete took the task first and then the
    running job rows, so the two could deadlock (PostgreSQL aborts one). Now the delete takes them in the job's
    order and waits for the job to end."""
    import time

    from atlas import db, job_store
    from tests.atlas.fixtures import reset_pg

    reset_pg(pg_database)
    engine = db.make_engine(pg_database)
    factory = db.session_factory(engine)
    try:
        space = make_space(factory)
        with factory.begin() as s:
            task, job = repository.create_task_with_job(s, space.id, "t", "text", {}, [Sample(text="hello there")])
            task_id, job_id = task.id, job.id
        with factory.begin() as s:
            claim = job_store.claim_job(s, job_id, worker="w", stale_after_s=60)
        assert claim is not None
        errors: list[BaseException] = []
        job_locked, deleted = threading.Event(), threading.Event()

        def final_transaction() -> None:
            try:
                with factory.begin() as s:
                    assert job_store.lock_held_job(s, job_id, claim.lease) is not None
                    job_locked.set()
                    time.sleep(1.5)  # the delete starts meanwhile
                    repository.lock_task(s, task_id)
            except BaseException as exc:
                errors.append(exc)

        def delete() -> None:
            try:
                job_locked.wait(10)
                with factory.begin() as s:
                    repository.delete_task(s, task_id)
                deleted.set()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=final_transaction), threading.Thread(target=delete)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert deleted.is_set()
        with factory() as s:
            assert s.get(Task, task_id) is None
    finally:
        engine.dispose()


def test_a_purge_never_deletes_an_upload_a_request_is_about_to_use(factory: sessionmaker[Session],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A request re-adding a deleted task's samples finds their (orphan) upload; a purge of orphan uploads (the
    end of the deleted task's job) runs before the request inserts its job: the upload stays and the request
    succeeds (it deleted the upload, and the job's insert failed as a false 409 on PostgreSQL)."""
    import time

    from atlas import upload_repository

    space = make_space(factory, m=M)
    samples = [Sample(text="the same samples once more")]
    with factory.begin() as s:  # an upload no job references
        upload_repository.get_or_create_upload(s, samples)
    found = threading.Event()
    real = repository._add_job

    def slow_add_job(*args: object, **kwargs: object) -> object:
        found.set()  # the upload was read; the purge runs now
        time.sleep(1.0)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(repository, "_add_job", slow_add_job)
    purged: list[int] = []

    def purge() -> None:
        assert found.wait(30)
        with factory.begin() as s:
            purged.append(upload_repository.purge_orphan_uploads_now(s))

    t = threading.Thread(target=purge)
    t.start()
    with factory.begin() as s:
        _task, job = repository.create_task_with_job(s, space.id, "re-added", "text", {}, samples)
        upload_id = job.upload_id
    t.join(timeout=60)
    assert purged == [0]
    with factory() as s:
        assert upload_repository.load_upload_samples(s, upload_id) == samples

