"""Repository functions on SQLite and PostgreSQL: tasks, uploads, results, deletes, API keys."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from atlas import apikeys, changes, job_store, repository
from atlas.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from atlas.models import BaselineRow, Change, Job, Signature, SketchStateRow, Task, Upload
from atlas.samples import Sample
from tests.atlas.fixtures import add_ready_task, make_space, unit_vectors

SAMPLES = [Sample(text="alpha beta"), Sample(text="gamma"), Sample(prompt="Q?", completion="A.")]


def _count(factory: sessionmaker[Session], model: type) -> int:
    with factory() as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


def test_space_get_or_create_is_idempotent(factory: sessionmaker[Session]) -> None:
    a = make_space(factory)
    b = make_space(factory)
    c = make_space(factory, key="model-b")
    assert a.id == b.id != c.id
    with factory() as s:
        assert [sp.id for sp in repository.list_spaces(s)] == [a.id, c.id]
        with pytest.raises(NotFound):
            repository.get_space(s, 999)


def test_create_task_with_job_is_atomic(factory: sessionmaker[Session]) -> None:
    space = make_space(factory)
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "qa", "text", {"src": "x"}, SAMPLES)
    assert task.status == "pending" and job.status == "queued" and job.kind == "create"
    assert job.progress["samples_total"] == 3
    with factory() as s:
        assert repository.load_upload_samples(s, job.upload_id) == SAMPLES

    # A duplicate name is rejected and nothing of the second request is stored.
    other = [Sample(text="different")]
    with pytest.raises(Conflict, match="already exists in this space: append to it, or delete it first"), \
            factory.begin() as s:
        repository.create_task_with_job(s, space.id, "qa", "text", {}, other)
    assert _count(factory, Task) == 1 and _count(factory, Job) == 1 and _count(factory, Upload) == 1

    # A failure after the rows were added rolls everything back.
    with pytest.raises(RuntimeError), factory.begin() as s:
        repository.create_task_with_job(s, space.id, "second", "text", {}, other)
        raise RuntimeError("rejected by a later check")
    assert _count(factory, Task) == 1 and _count(factory, Upload) == 1

    for bad in [dict(name=" "), dict(mode="poem"), dict(samples=[]), dict(space_id=999)]:
        args = dict(space_id=space.id, name="n", mode="text", metadata={}, samples=SAMPLES) | bad
        with pytest.raises((InvalidInput, NotFound)), factory.begin() as s:
            repository.create_task_with_job(s, **args)
    assert _count(factory, Task) == 1


def test_idempotency_key_replays(factory: sessionmaker[Session]) -> None:
    space = make_space(factory)
    with factory.begin() as s:
        t1, j1 = repository.create_task_with_job(s, space.id, "qa", "text", {}, SAMPLES, idempotency_key="k1")
    with factory.begin() as s:
        t2, j2 = repository.create_task_with_job(s, space.id, "qa", "text", {}, SAMPLES, idempotency_key="k1")
    assert (t1.id, j1.id) == (t2.id, j2.id)
    with pytest.raises(Conflict), factory.begin() as s:
        repository.create_task_with_job(s, space.id, "other", "text", {}, SAMPLES, idempotency_key="k1")
    with factory.begin() as s:
        a1 = repository.append_samples(s, t1.id, [Sample(text="more")], idempotency_key="k2")
    with factory.begin() as s:
        a2 = repository.append_samples(s, t1.id, [Sample(text="more")], idempotency_key="k2")
    assert a1.id == a2.id and a1.kind == "append"
    assert _count(factory, Job) == 2


def test_uploads_are_content_addressed(factory: sessionmaker[Session]) -> None:
    space = make_space(factory)
    with factory.begin() as s:
        _, j1 = repository.create_task_with_job(s, space.id, "a", "text", {}, SAMPLES)
        _, j2 = repository.create_task_with_job(s, space.id, "b", "text", {}, SAMPLES)
    assert j1.upload_id == j2.upload_id
    blob, digest = repository.encode_samples(SAMPLES)
    assert repository.decode_samples(blob) == SAMPLES
    assert repository.encode_samples(SAMPLES) == (blob, digest)  # deterministic bytes


def test_list_filter_paginate_update(factory: sessionmaker[Session]) -> None:
    space = make_space(factory)
    other = make_space(factory, key="model-b")
    with factory.begin() as s:
        for i in range(7):
            repository.create_task_with_job(s, space.id, f"math/{i}", "text", {"i": i}, [Sample(text=str(i))])
        repository.create_task_with_job(s, space.id, "code_x", "text", {}, SAMPLES)
        repository.create_task_with_job(s, space.id, "codeYx", "text", {}, SAMPLES)
        repository.create_task_with_job(s, other.id, "math/0", "text", {}, SAMPLES)
    with factory() as s:
        page = repository.list_tasks(s, space_id=space.id, name_prefix="math/", offset=2, limit=3)
        assert page.total == 7 and [t.name for t in page.items] == ["math/2", "math/3", "math/4"]
        assert repository.list_tasks(s, name_prefix="code_").total == 1  # '_' is literal
        assert repository.list_tasks(s).total == 10
        assert repository.list_tasks(s, status="ready").total == 0
        with pytest.raises(InvalidInput):
            repository.list_tasks(s, limit=0)
        task_id = repository.get_task_by_name(s, space.id, "math/1").id
    with factory.begin() as s:
        t = repository.update_task(s, task_id, metadata={"i": None, "tag": "algebra"})
        assert t.meta == {"tag": "algebra"}
        t = repository.update_task(s, task_id, name="math/one")
    with pytest.raises(Conflict), factory.begin() as s:
        repository.update_task(s, task_id, name="math/2")
    with factory() as s:
        t = repository.get_task(s, task_id)
        assert (t.name, t.meta) == ("math/one", {"tag": "algebra"})


def test_results_and_delete(factory: sessionmaker[Session]) -> None:
    space = make_space(factory, m=32)
    vecs = unit_vectors(3, 32)
    ids = [add_ready_task(factory, space.id, f"t{i}", vecs[i], state=bytes([i]) * 10) for i in range(3)]
    with factory() as s:
        t = repository.get_task(s, ids[0])
        assert (t.status, t.n_samples, t.n_tokens, t.version) == ("ready", 1, 3, 1)
        got_ids, got = repository.get_signatures(s, task_ids=ids)
        assert got_ids.tolist() == ids and np.array_equal(got, vecs)
        sp_ids, sp_vecs = repository.get_signatures(s, space_id=space.id)
        assert sp_ids.tolist() == ids and np.array_equal(sp_vecs, vecs)
        assert repository.get_states(s, ids) == {i: bytes([k]) * 10 for k, i in enumerate(ids)}
        assert repository.get_baselines(s, ids[:1]) == {ids[0]: b"B"}
        assert changes.last_seq(s) == 3

    # Storing again (an append merge) replaces the blobs and bumps versions.
    with factory.begin() as s:
        task = repository.lock_task(s, ids[0])
        repository.store_task_result(s, task, state=b"merged", signature=vecs[1], baselines=None, n_samples=5,
                                     n_tokens=9)
    with factory() as s:
        row = s.get(SketchStateRow, ids[0])
        assert (row.blob, row.version) == (b"merged", 2)
        assert repository.get_task(s, ids[0]).n_samples == 5
    with pytest.raises(InvalidInput), factory.begin() as s:
        task = repository.lock_task(s, ids[0])
        repository.store_task_result(s, task, state=b"x", signature=np.ones(31), baselines=None, n_samples=1,
                                     n_tokens=1)

    with factory.begin() as s:
        repository.delete_task(s, ids[1])
    with factory() as s:
        with pytest.raises(NotFound):
            repository.get_task(s, ids[1])
        for model in (SketchStateRow, Signature, BaselineRow):
            assert s.get(model, ids[1]) is None
        log = s.execute(select(Change.seq, Change.task_id, Change.op).order_by(Change.seq)).all()
        assert [tuple(r) for r in log][-1] == (5, ids[1], "delete")
        assert [r.seq for r in log] == [1, 2, 3, 4, 5]
        assert s.execute(select(func.count()).select_from(Job).where(Job.task_id == ids[1])).scalar_one() == 0
    with pytest.raises(NotFound), factory.begin() as s:
        repository.delete_task(s, ids[1])


def test_delete_failed_task_and_orphan_uploads(factory: sessionmaker[Session]) -> None:
    space = make_space(factory)
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "doomed", "text", {}, [Sample(text="zzz")])
    with factory.begin() as s:
        job_store.request_cancel(s, job.id)
    with factory() as s:
        assert repository.get_task(s, task.id).status == "failed"
    with factory.begin() as s:
        repository.delete_task(s, task.id)
    assert _count(factory, Upload) == 0 and _count(factory, Task) == 0
    with factory() as s:
        assert changes.last_seq(s) == 0  # no signature, no delete change


def test_api_keys(factory: sessionmaker[Session]) -> None:
    with factory.begin() as s:
        row, plain = apikeys.create_api_key(s, "ci", ["write"])
        admin, admin_plain = apikeys.create_api_key(s, "ops", ["admin"])
    assert plain.startswith("fa_") and row.key_hash == apikeys.hash_key(plain) and plain not in row.key_hash
    with factory.begin() as s:
        assert apikeys.verify_api_key(s, plain, "read").id == row.id
        assert apikeys.verify_api_key(s, plain, "write").last_used_at is not None
        with pytest.raises(Forbidden):
            apikeys.verify_api_key(s, plain, "admin")
        assert apikeys.verify_api_key(s, admin_plain, "admin").id == admin.id
        for bad in (None, "", "fa_nope"):
            with pytest.raises(Unauthorized):
                apikeys.verify_api_key(s, bad)
        with pytest.raises(InvalidInput):
            apikeys.create_api_key(s, "x", ["root"])
        apikeys.revoke_api_key(s, row.id)
    with factory.begin() as s:
        with pytest.raises(Unauthorized):
            apikeys.verify_api_key(s, plain)
        assert [k.id for k in apikeys.list_api_keys(s)] == [admin.id]
        assert len(apikeys.list_api_keys(s, include_revoked=True)) == 2


def test_create_ready_task_for_import(factory: sessionmaker[Session]) -> None:
    space = make_space(factory, m=16)
    vec = unit_vectors(1, 16)[0]
    with factory.begin() as s:
        task = repository.create_ready_task(s, space.id, "imported", "completion", {"src": "dump"}, state=b"st",
                                            signature=vec, baselines=None, n_samples=4, n_tokens=40)
    with factory() as s:
        t = repository.get_task(s, task.id)
        assert (t.status, t.mode, t.n_samples, t.version) == ("ready", "completion", 4, 1)
        assert repository.get_states(s, [task.id]) == {task.id: b"st"}
        assert changes.last_seq(s) == 1
    with pytest.raises(Conflict), factory.begin() as s:
        repository.create_ready_task(s, space.id, "imported", "text", {}, state=b"x", signature=vec,
                                     baselines=None, n_samples=1, n_tokens=1)
    assert _count(factory, Task) == 1 and _count(factory, Job) == 0


def test_tasks_with_equal_lexical_records_both_get_theirs_from_a_cold_cache(factory: sessionmaker[Session]) -> None:
    """The records are cached by digest: two tasks of equal samples share one; a cold read gave only one task its
    record (the other routed without terms and template until the cache was warm)."""
    from atlas import lexicon_repo
    from atlas.lexical_record import LexicalDelta
    from atlas.lru import ContentLru
    from atlas.samples import Sample

    space = make_space(factory)
    v = unit_vectors(2, 64)
    a = add_ready_task(factory, space.id, "a", v[0])
    b = add_ready_task(factory, space.id, "b", v[1])
    delta = LexicalDelta.of_samples([Sample(text=f"the quick brown fox number {i}") for i in range(3)], "text")
    with factory.begin() as s:
        lexicon_repo.add_delta(s, a, delta)
        lexicon_repo.add_delta(s, b, delta)
    cold = ContentLru(1 << 20, weigh=lambda t: int(t.terms.keys.size))
    old, lexicon_repo._LEXICAL = lexicon_repo._LEXICAL, cold  # a fresh process's cache
    try:
        with factory() as s:
            first = lexicon_repo.get_task_lexicon(s, [a, b])
            second = lexicon_repo.get_task_lexicon(s, [a, b])
    finally:
        lexicon_repo._LEXICAL = old
    assert sorted(first) == sorted(second) == sorted([a, b])
    assert first[a].terms.keys.tolist() == first[b].terms.keys.tolist()
