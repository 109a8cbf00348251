"""A database restored from a backup under a running replica (its index and its state cache).

A restore rewinds the change log; written again, the log reuses sequence numbers — and SQLite's
autoincrement reuses task ids — for other changes. A replica that was past the backup point used to
catch up from its old watermark: its index kept the lost tasks' vectors under ids now naming other tasks,
missed the new tasks written before that watermark, and its state cache served the lost tasks' states
for the reused ids, until a restart. The mark of the change at the watermark tells the histories apart.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from atlas import db, repository
from atlas.index import IndexManager
from atlas.models import Space
from atlas.samples import Sample
from atlas.state_cache import StateCache
from fishersketch import SketchSpec, SketchState
from tests.atlas.fixtures import random_state

M = 32


def _space(factory: sessionmaker[Session]) -> Space:
    spec = SketchSpec(d=8, K=16, m=M, seed=0)
    with factory.begin() as s:
        space = repository.get_or_create_space(
            s, model_fingerprint="model-r", spec_fingerprint=spec.fingerprint(), model_name="tiny", d=8, K=16, m=M,
            seed=0, spec=spec.to_dict(),
        )
        s.flush()
        s.expunge(space)
        return space


def _state(seed: int) -> SketchState:
    return random_state(SketchSpec(d=8, K=16, m=M, seed=0), seed)


def _add(factory: sessionmaker[Session], space: Space, name: str, seed: int) -> int:
    state = _state(seed)
    with factory.begin() as s:
        task, _ = repository.create_task_with_job(s, space.id, name, "text", {}, [Sample(text=name)])
        repository.store_task_result(s, task, state=state.to_bytes(), signature=state.signature(), baselines=None,
                                     n_samples=state.n_samples, n_tokens=state.n_tokens)
        return int(task.id)


def test_a_running_replica_notices_a_database_restored_under_it(sqlite_template: Path, tmp_path: Path) -> None:
    path, backup = tmp_path / "atlas.sqlite", tmp_path / "backup.sqlite"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    writer = db.make_engine(url)
    write = db.session_factory(writer)
    replica = db.make_engine(url)  # the running replica's own connections, kept across the restore
    read = db.session_factory(replica, readonly=True)

    space = _space(write)
    for i in range(3):
        _add(write, space, f"base{i}", i)
    writer.dispose()
    shutil.copyfile(path, backup)

    index, cache = IndexManager(read, None), StateCache(1 << 24, sync_interval_s=0.0)
    index.open()
    cache.sync(read)
    lost = [_add(write, space, f"lost{i}", i) for i in range(3, 8)]  # the history the restore loses
    index.catch_up(space.id)
    assert cache.get_many(read, space, lost)[0].state.n_samples == 3  # cached: lost3's state under its id
    assert index.ids(space.id).size == 8

    writer.dispose()
    replica.dispose()
    shutil.copyfile(backup, path)  # restored, then written again past the replica's watermark
    new = [_add(write, space, f"new{i}", i) for i in range(20, 26)]
    assert new[0] == lost[0]  # the restored autoincrement counter hands out the lost ids again

    index.catch_up(space.id)
    with read() as s:
        sql_ids, _ = repository.get_signatures(s, space_id=space.id)
    assert sorted(index.ids(space.id).tolist()) == sorted(sql_ids.tolist())
    scores, ids = index.search(space.id, _state(20).signature()[None], 1)
    assert ids[0][0] == new[0] and scores[0][0] > 0.999  # before: lost3's vector answered under that id
    (loaded,) = cache.get_many(read, space, [new[0]])
    np.testing.assert_array_equal(np.asarray(loaded.state.sums), np.asarray(_state(20).sums))
    writer.dispose()
    replica.dispose()


def test_a_restored_database_written_up_to_the_same_head_is_noticed(sqlite_template: Path, tmp_path: Path) -> None:
    """Restored and written again exactly as many times as it lost: the head equals the replica's watermark,
    and the background catch-up and cache sync ("nothing new") kept the lost tasks' vectors and states under
    the reused ids until some later write."""
    path, backup = tmp_path / "atlas.sqlite", tmp_path / "backup.sqlite"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    writer = db.make_engine(url)
    write = db.session_factory(writer)
    replica = db.make_engine(url)
    read = db.session_factory(replica, readonly=True)

    space = _space(write)
    _add(write, space, "base", 0)
    writer.dispose()
    shutil.copyfile(path, backup)

    index, cache = IndexManager(read, None), StateCache(1 << 24, sync_interval_s=0.0)
    index.open()
    lost = [_add(write, space, f"lost{i}", i) for i in range(3, 6)]
    index.catch_up()  # the background loop's form: every space
    cache.sync(read)
    assert cache.get_many(read, space, lost)[0].state.n_samples == 3

    writer.dispose()
    replica.dispose()
    shutil.copyfile(backup, path)
    new = [_add(write, space, f"new{i}", i) for i in range(20, 23)]  # as many changes as were lost
    assert new == lost

    index.catch_up()
    cache.sync(read)
    scores, ids = index.search(space.id, _state(20).signature()[None], 1)
    assert ids[0][0] == new[0] and scores[0][0] > 0.999
    (loaded,) = cache.get_many(read, space, [new[0]])
    np.testing.assert_array_equal(np.asarray(loaded.state.sums), np.asarray(_state(20).sums))
    writer.dispose()
    replica.dispose()


def test_compaction_keeps_the_change_at_each_floor(factory) -> None:
    """The change at a persisted index's watermark was pruned with the rest, and its file's history could no
    longer be checked (a restored database then passed for the file's own)."""
    from atlas import changes

    space = _space(factory)
    for i in range(5):
        _add(factory, space, f"t{i}", i)
    with factory() as s:
        head = changes.last_seq(s)
        before = changes.mark(s, head - 1)
    with factory.begin() as s:
        assert changes.compact(s, retain=0, floors=[head - 1]) > 0
    with factory() as s:
        assert changes.pruned_seq(s) == head - 2
        assert changes.mark(s, head - 1) == before is not None


def test_the_head_read_agrees_with_its_three_lookups(factory: sessionmaker[Session]) -> None:
    """``changes.head`` (one statement, polled by the state cache and the index catch-up) answers what
    ``last_seq``, ``mark(last_seq)`` and ``mark(at)`` answer, for every ``at``: before, inside and past the log,
    and at pruned rows."""
    from atlas import changes

    def agrees() -> None:
        with factory() as s:
            last = changes.last_seq(s)
            for at in range(-1, last + 3):
                assert changes.head(s, at) == changes.Head(seq=last, mark=changes.mark(s, last) or "", at=at,
                                                           at_mark=changes.mark(s, at))

    agrees()  # an empty log
    space = _space(factory)
    for i in range(4):
        _add(factory, space, f"t{i}", i)
    agrees()
    with factory.begin() as s:
        assert changes.prune(s, 2) == 2
    agrees()  # pruned rows: at_mark None
    with factory.begin() as s:
        changes.prune(s, changes.last_seq(s))
    agrees()  # the head itself pruned: mark ""


@pytest.mark.parametrize("rewritten", [1, 3])  # fewer writes than were lost (head behind), as many (same head)
def test_a_request_right_after_a_restore_reads_the_new_history(sqlite_template: Path, tmp_path: Path,
                                                                rewritten: int) -> None:
    """A request's read-your-writes step caught up only when the head had moved past the index's watermark: right
    after a restore (written fewer or as many times as it lost) a request searched the lost tasks' vectors, found
    under the reused ids, until the background loop's next pass."""
    import types

    from atlas.services.queries import QueryService
    from atlas.services.states import StateLoader
    from atlas.settings import Settings

    path, backup = tmp_path / "atlas.sqlite", tmp_path / "backup.sqlite"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    writer, replica = db.make_engine(url), db.make_engine(url)
    write, read = db.session_factory(writer), db.session_factory(replica, readonly=True)
    space = _space(write)
    _add(write, space, "base", 0)
    writer.dispose()
    shutil.copyfile(path, backup)

    index, cache = IndexManager(read, None), StateCache(1 << 24, sync_interval_s=3600.0)  # no periodic sync
    index.open()
    store = types.SimpleNamespace(read=read, settings=Settings())
    states = StateLoader(store, cache)  # type: ignore[arg-type]
    queries = QueryService(store, index, states, prompts=None)  # type: ignore[arg-type]
    lost = [_add(write, space, f"lost{i}", i) for i in range(3, 6)]
    with read() as s:
        queries._fresh_index(s, space.id)  # a request: current
        assert states.load(s, space, lost)[0].state.n_samples == 3

    writer.dispose()
    replica.dispose()
    shutil.copyfile(backup, path)
    new = [_add(write, space, f"new{i}", i) for i in range(20, 20 + rewritten)]
    assert new[0] == lost[0]
    with read() as s:
        queries._fresh_index(s, space.id)  # the next request
        sql_ids, _ = repository.get_signatures(s, space_id=space.id)
    assert sorted(index.ids(space.id).tolist()) == sorted(sql_ids.tolist())
    scores, ids = index.search(space.id, _state(20).signature()[None], 1)
    assert ids[0][0] == new[0] and scores[0][0] > 0.999
    with read() as s:
        (loaded,) = states.load(s, space, [new[0]])
    np.testing.assert_array_equal(np.asarray(loaded.state.sums), np.asarray(_state(20).sums))
    writer.dispose()
    replica.dispose()
