"""FAISS index derived from SQL: brute-force oracle, persistence, catch-up, rebuilds, IVF recall."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from atlas import changes, repository
from atlas.index import IndexManager
from tests.atlas.fixtures import add_ready_task, bulk_ready_tasks, make_space, unit_vectors

M = 48


def _oracle(factory: sessionmaker[Session], space_id: int, queries: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Exact top-k straight from the signatures table."""
    with factory() as s:
        ids, vecs = repository.get_signatures(s, space_id=space_id)
    scores = queries @ vecs.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


def _assert_matches(index: IndexManager, factory: sessionmaker[Session], space_id: int, k: int = 10) -> None:
    queries = unit_vectors(20, M, seed=99)
    scores, ids = index.search(space_id, queries, k)
    exp_scores, exp_ids = _oracle(factory, space_id, queries, k)
    np.testing.assert_array_equal(ids, exp_ids)
    np.testing.assert_allclose(scores, exp_scores, rtol=1e-5, atol=1e-5)


def _populate(factory: sessionmaker[Session], space_id: int, n: int, seed: int = 0, prefix: str = "t") -> list[int]:
    vecs = unit_vectors(n, M, seed=seed)
    return [add_ready_task(factory, space_id, f"{prefix}{i}", vecs[i]) for i in range(n)]


def test_flat_equals_bruteforce_with_updates_and_deletes(factory, ro_factory, tmp_path: Path) -> None:
    space = make_space(factory, m=M)
    ids = _populate(factory, space.id, 60)
    index = IndexManager(ro_factory, tmp_path / "idx")
    assert [r.action for r in index.open()] == ["rebuilt"]
    _assert_matches(index, factory, space.id)

    # Deletes, re-stored signatures (appends) and new tasks are caught up from the change sequence.
    new = unit_vectors(5, M, seed=7)
    for tid in ids[:5]:
        with factory.begin() as s:
            repository.delete_task(s, tid)
    for i, tid in enumerate(ids[5:10]):
        with factory.begin() as s:
            task = repository.lock_task(s, tid)
            repository.store_task_result(s, task, state=b"m", signature=new[i], baselines=None, n_samples=2,
                                         n_tokens=6)
    _populate(factory, space.id, 7, seed=3, prefix="late")
    assert index.catch_up() == 17
    assert index.catch_up() == 0
    _assert_matches(index, factory, space.id, k=100)  # k beyond N returns all N
    with factory() as s:
        assert index.watermark(space.id) == changes.last_seq(s)
        assert index.ids(space.id).tolist() == repository.get_signatures(s, space_id=space.id)[0].tolist()


def _saved_index(factory: sessionmaker[Session], ro_factory: sessionmaker[Session], tmp_path: Path,
                 n: int) -> tuple[Any, Path, IndexManager]:
    """A space of ``n`` ready tasks, its index opened and saved under ``tmp_path / "idx"``."""
    space = make_space(factory, m=M)
    _populate(factory, space.id, n)
    directory = tmp_path / "idx"
    index = IndexManager(ro_factory, directory)
    index.open()
    assert index.persist() == [space.id]
    return space, directory, index


def test_an_index_directory_removed_while_running_is_made_again_by_the_next_save(factory, ro_factory,
                                                                                  tmp_path: Path) -> None:
    """An outage review removed the index directory under a running API: every save failed (a traceback a second)
    until the directory was made by hand."""
    space, directory, index = _saved_index(factory, ro_factory, tmp_path, 12)
    shutil.rmtree(directory)
    _populate(factory, space.id, 3, seed=4, prefix="later")
    assert index.catch_up() == 3
    assert index.persist() == [space.id]  # raised "could not open .../.space-1.faiss...tmp for writing"
    reopened = IndexManager(ro_factory, directory)
    assert [(r.action, r.applied) for r in reopened.open()] == [("loaded", 0)]  # the saved file, whole
    _assert_matches(reopened, factory, space.id)


def test_persisted_index_is_loaded_caught_up_or_rebuilt(factory, ro_factory, tmp_path: Path) -> None:
    space, directory, first = _saved_index(factory, ro_factory, tmp_path, 40)
    assert first.persist() == []  # nothing changed since
    queries = unit_vectors(8, M, seed=5)
    reference = first.search(space.id, queries, 10)

    # Watermark matches SQL: loaded as is.
    again = IndexManager(ro_factory, directory)
    assert [(r.action, r.applied) for r in again.open()] == [("loaded", 0)]
    for got, exp in zip(again.search(space.id, queries, 10), reference, strict=True):
        np.testing.assert_array_equal(got, exp)

    # Stale file: catch up from the change sequence.
    _populate(factory, space.id, 4, seed=11, prefix="new")
    stale = IndexManager(ro_factory, directory)
    report = stale.open()[0]
    assert (report.action, report.applied) == ("caught_up", 4)
    _assert_matches(stale, factory, space.id)
    stale.persist()
    expected = stale.search(space.id, queries, 10)

    # Corrupt file, missing file, foreign metadata: rebuilt from SQL with identical answers.
    path = stale.index_path(space.id)
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    corrupt = IndexManager(ro_factory, directory)
    assert corrupt.open()[0].action == "rebuilt" and "checksum" in corrupt.reports[space.id].reason
    for got, exp in zip(corrupt.search(space.id, queries, 10), expected, strict=True):
        np.testing.assert_array_equal(got, exp)

    path.unlink()
    missing = IndexManager(ro_factory, directory)
    assert missing.open()[0].action == "rebuilt"
    for got, exp in zip(missing.search(space.id, queries, 10), expected, strict=True):
        np.testing.assert_array_equal(got, exp)
    missing.persist()

    meta = json.loads(stale.meta_path(space.id).read_text())
    meta["instance_id"] = "another-database"
    stale.meta_path(space.id).write_text(json.dumps(meta))
    foreign = IndexManager(ro_factory, directory)
    assert foreign.open()[0].action == "rebuilt"
    foreign.persist()

    meta = json.loads(stale.meta_path(space.id).read_text())
    meta["watermark"] += 1000  # ahead of SQL: the database was restored from an older backup
    stale.meta_path(space.id).write_text(json.dumps(meta))
    ahead = IndexManager(ro_factory, directory)
    assert ahead.open()[0].action == "rebuilt"
    _assert_matches(ahead, factory, space.id)
    ahead.persist()

    # Valid JSON of the wrong types (a null count stopped the service from starting), or a field missing.
    for field, value in (("count", None), ("watermark", None), ("count", "40"), ("m", True), ("kind", 3),
                         ("space_id", None), ("checksum", None)):
        meta = json.loads(stale.meta_path(space.id).read_text())
        meta[field] = value
        stale.meta_path(space.id).write_text(json.dumps(meta))
        typed = IndexManager(ro_factory, directory)
        assert typed.open()[0].action == "rebuilt" and "metadata" in typed.reports[space.id].reason, (field, value)
        _assert_matches(typed, factory, space.id)
        typed.persist()


def test_pruned_changes_force_rebuild(factory, ro_factory, tmp_path: Path) -> None:
    space = make_space(factory, m=M)
    _populate(factory, space.id, 10)
    index = IndexManager(ro_factory, tmp_path)
    index.open()
    index.persist()
    _populate(factory, space.id, 3, seed=2, prefix="n")
    with factory.begin() as s:
        assert changes.prune(s, changes.last_seq(s)) == 13
    reopened = IndexManager(ro_factory, tmp_path)
    assert reopened.open()[0].action == "rebuilt"
    _assert_matches(reopened, factory, space.id)
    # A live index behind the pruned point rebuilds on catch-up too.
    _populate(factory, space.id, 2, seed=4, prefix="p")
    with factory.begin() as s:
        changes.prune(s, changes.last_seq(s))
    index.catch_up()
    _assert_matches(index, factory, space.id)


def test_spaces_are_separate_and_discovered(factory, ro_factory) -> None:
    a = make_space(factory, m=M)
    index = IndexManager(ro_factory, None)
    assert [r.action for r in index.open()] == ["rebuilt"]
    _populate(factory, a.id, 5)
    b = make_space(factory, m=M, key="model-b")
    _populate(factory, b.id, 3, seed=1, prefix="b")
    index.catch_up()
    assert index.stats(a.id)["count"] == 5 and index.stats(b.id)["count"] == 3
    _assert_matches(index, factory, b.id)
    empty = make_space(factory, m=16, key="model-c")
    scores, ids = index.search(empty.id, np.zeros(16, np.float32), 3)
    assert scores.shape == (1, 0) and ids.shape == (1, 0)
    with pytest.raises(Exception, match="shape"):
        index.search(a.id, np.zeros(7, np.float32), 3)


def test_content_mark_moves_with_the_space_s_own_changes_only(factory, ro_factory, tmp_path: Path) -> None:
    """Derived per-space state (the ranking's whitening) is keyed on the content mark: a change in
    another space moves the watermark of every space's index but not this mark, and nothing re-fits."""
    from atlas.whitening import WhiteningCache

    a, b = make_space(factory, m=M), make_space(factory, m=M, key="model-b")
    ids_a = _populate(factory, a.id, 20)
    _populate(factory, b.id, 3, seed=1, prefix="b")
    index = IndexManager(ro_factory, tmp_path / "idx")
    index.open()
    loads: list[list[int]] = []

    def load(task_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        loads.append(task_ids)
        vecs = unit_vectors(len(task_ids), M, seed=len(loads))
        return vecs, vecs, np.full(len(task_ids), np.nan)

    cache = WhiteningCache()

    def fit_a() -> object:
        return cache.get(a.id, index.content_mark(a.id), lambda: index.ids(a.id), load)

    first = fit_a()
    assert first is not None and len(loads) == 1
    mark_a = index.content_mark(a.id)
    _populate(factory, b.id, 2, seed=2, prefix="b2")  # another space changes
    index.catch_up()
    assert index.watermark(a.id) > mark_a and index.content_mark(a.id) == mark_a
    assert fit_a() is first and len(loads) == 1  # not re-fitted
    with factory.begin() as s:  # the space's own change moves its mark and re-fits
        repository.delete_task(s, ids_a[0])
    index.catch_up()
    assert index.content_mark(a.id) > mark_a
    assert fit_a() is not first and len(loads) == 2 and ids_a[0] not in loads[1]
    reopened = IndexManager(ro_factory, tmp_path / "idx")  # a load or rebuild starts from its watermark
    index.persist()
    reopened.open()
    assert reopened.content_mark(a.id) == reopened.watermark(a.id)


def test_ivf_recall_against_flat(factory, ro_factory, tmp_path: Path) -> None:
    """IVF on clustered signatures (like real task families) keeps recall@10 high vs flat."""
    space = make_space(factory, m=M)
    rng = np.random.default_rng(0)
    centers = unit_vectors(20, M, seed=1)
    n = 1200
    vecs = centers[rng.integers(0, 20, n)] + 0.35 * rng.standard_normal((n, M)).astype(np.float32) / np.sqrt(M)
    vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
    bulk_ready_tasks(factory, space.id, vecs)
    flat = IndexManager(ro_factory, None)
    ivf = IndexManager(ro_factory, tmp_path, kind="ivf", nprobe=8, ivf_min_size=500)
    flat.open()
    ivf.open()
    assert ivf.stats(space.id)["kind"] == "ivf" and ivf.stats(space.id)["nlist"] == 35
    queries = vecs[rng.choice(n, 50, replace=False)] + 0.1 * rng.standard_normal((50, M)).astype(np.float32)
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    _, exact = flat.search(space.id, queries, 10)
    _, approx = ivf.search(space.id, queries, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact, strict=True)])
    assert recall >= 0.9, recall
    # Persisted IVF reloads to the same answers; deletes apply to IVF too.
    ivf.persist()
    again = IndexManager(ro_factory, tmp_path, kind="ivf", nprobe=8, ivf_min_size=500)
    assert again.open()[0].action == "loaded"
    np.testing.assert_array_equal(again.search(space.id, queries, 10)[1], approx)
    victim = int(approx[0, 0])
    with factory.begin() as s:
        repository.delete_task(s, victim)
    again.catch_up()
    assert victim not in again.search(space.id, queries[:1], 10)[1]
    assert again.stats(space.id)["count"] == n - 1


def test_compaction_and_a_replica_behind_the_prune_point(factory, ro_factory, tmp_path: Path) -> None:
    """Replica A persists and compacts; replica B (behind the pruned point) rebuilds from SQL, also
    from its persisted file after a restart, and both equal the signatures table."""
    space = make_space(factory, m=M)
    _populate(factory, space.id, 10)
    a = IndexManager(ro_factory, tmp_path / "a")
    b = IndexManager(ro_factory, tmp_path / "b")
    a.open()
    b.open()
    b.persist()
    ids = _populate(factory, space.id, 6, seed=4, prefix="late")
    with factory.begin() as s:
        repository.delete_task(s, ids[0])
    assert a.compact(factory, retain=100) == 0  # inside the retained window: nothing pruned
    a.catch_up()
    a.persist()
    assert a.compact(factory, retain=2) > 0
    with factory() as s:
        pruned, head = changes.pruned_seq(s), changes.last_seq(s)
    assert pruned == head - 2 and b.watermark(space.id) < pruned
    assert b.catch_up() > 0  # rebuilt from SQL, not caught up from a log with a hole
    _assert_matches(b, factory, space.id, k=100)
    restarted = IndexManager(ro_factory, tmp_path / "b")
    assert [r.action for r in restarted.open()] == ["rebuilt"]
    assert "pruned" in restarted.reports[space.id].reason
    _assert_matches(restarted, factory, space.id, k=100)
    again = IndexManager(ro_factory, tmp_path / "a")  # A's own file is at the floor: it just loads
    assert [r.action for r in again.open()] == ["loaded"]
    _assert_matches(again, factory, space.id, k=100)


def test_an_index_of_a_history_the_database_no_longer_has_is_rebuilt(
        sqlite_template: Path, tmp_path: Path) -> None:
    """A database restored from a backup and written again reuses sequence numbers for other changes: an index
    file persisted before the restore has a watermark SQL passes, yet describes the lost history. It was loaded
    and caught up (searches returned lost tasks' vectors under reused ids); the mark of the change at the
    watermark tells the histories apart, and the index is rebuilt."""
    import shutil

    from atlas import db

    path, backup = tmp_path / "atlas.sqlite", tmp_path / "backup.sqlite"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    v = unit_vectors(40, 48)

    def connect() -> tuple[Any, sessionmaker[Session], sessionmaker[Session]]:
        eng = db.make_engine(url)
        return eng, db.session_factory(eng), db.session_factory(eng, readonly=True)

    eng, f, _ = connect()
    space = make_space(f, m=48)
    for i in range(3):
        add_ready_task(f, space.id, f"base{i}", v[i])
    eng.dispose()
    shutil.copyfile(path, backup)
    eng, f, ro = connect()
    for i in range(3, 8):  # the history the restore will lose
        add_ready_task(f, space.id, f"lost{i}", v[i])
    first = IndexManager(ro, tmp_path / "idx")
    first.open()
    first.persist()
    eng.dispose()
    shutil.copyfile(backup, path)  # restored, then written again past the file's watermark
    eng, f, ro = connect()
    new = [add_ready_task(f, space.id, f"new{i}", v[i]) for i in range(20, 26)]
    again = IndexManager(ro, tmp_path / "idx")
    (report,) = again.open()
    assert report.action == "rebuilt" and "restored" in report.reason, report
    scores, ids = again.search(space.id, v[20][None], 1)
    assert ids[0][0] == new[0] and scores[0][0] > 0.999
    with ro() as s:
        sql_ids, _ = repository.get_signatures(s, space_id=space.id)
    assert sorted(again.ids(space.id).tolist()) == sorted(sql_ids.tolist())
    eng.dispose()


def test_a_crashed_persists_temporary_file_is_removed_at_the_next_open(tmp_path: Path) -> None:
    """A process killed between writing an index's temporary file and renaming it (its ``finally`` never runs) left
    a file the index's size, one per crash, never removed. The next open removes those of dead processes; a live
    process's file (a library writing into the same directory) and a fresh one are kept."""
    import os
    import subprocess
    import sys
    import time

    from atlas.index_files import IndexFiles

    directory = tmp_path / "index"
    directory.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead_pid = int(dead.stdout)
    old = time.time() - 120
    crashed = directory / f".space-1.faiss.{dead_pid}.{'a' * 32}.tmp"
    live = directory / f".space-1.faiss.{os.getpid()}.{'b' * 32}.tmp"
    fresh = directory / f".space-2.faiss.{dead_pid}.{'c' * 32}.tmp"
    ancient = directory / f".space-3.faiss.{os.getpid()}.{'d' * 32}.tmp"
    for path, mtime in ((crashed, old), (live, old), (fresh, time.time()), (ancient, time.time() - 7200)):
        path.write_bytes(b"x" * 1000)
        os.utime(path, (mtime, mtime))
    files = IndexFiles(directory)
    assert files.removed_temp_files == 2
    assert sorted(p.name for p in directory.iterdir()) == sorted([live.name, fresh.name])
