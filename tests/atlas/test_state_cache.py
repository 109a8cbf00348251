"""The state cache: bounded in bytes, served without SQL on hits, invalidated by the change log."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import event

from atlas import repository
from atlas.caches import StateCache
from atlas.index import IndexManager
from atlas.services.states import StateLoader
from atlas.settings import Settings
from atlas.store import Store
from fishersketch import Sketcher, SketchSpec
from tests.atlas.fixtures import unit_vectors

SPEC = SketchSpec(d=8, K=16, m=64, seed=0)


def _state(seed: int):
    rng = np.random.default_rng(seed)
    sk = Sketcher(SPEC)
    return sk.sketch(rng.normal(size=(30, 8)).astype(np.float32), rng.normal(size=(30, 16)).astype(np.float32),
                     np.repeat(np.arange(6), 5))


def test_bounded_in_bytes_lru() -> None:
    entry_bytes = StateCache(10**9).put(0, "x", 1, 1, _state(0)).nbytes
    cache = StateCache(3 * entry_bytes + entry_bytes // 2)
    for t in range(5):
        cache.put(t, f"t{t}", 1, 1, _state(t))
        assert cache.nbytes <= cache.max_bytes
    assert len(cache) == 3 and cache.get(0) is None and cache.get(1) is None
    assert cache.get(2) is not None  # now most recent: 3 is evicted next
    cache.put(5, "t5", 1, 1, _state(5))
    assert cache.get(3) is None and cache.get(2) is not None


def test_hits_need_no_sql_and_changes_invalidate(db_url: str, tmp_path: Path) -> None:
    store = Store(Settings(data_dir=tmp_path, database_url=db_url))
    with store.session() as s:
        space = repository.get_or_create_space(
            s, model_fingerprint="m", spec_fingerprint=SPEC.fingerprint(), model_name="tiny", d=8, K=16, m=64,
            seed=0, spec=SPEC.to_dict())
        space_id = space.id
    vecs = unit_vectors(3, 64)
    ids = []
    from atlas.samples import Sample

    for i in range(3):
        with store.session() as s:
            task, _ = repository.create_task_with_job(s, space_id, f"t{i}", "text", {}, [Sample(text=f"t{i}")])
            repository.store_task_result(s, task, state=_state(i).to_bytes(), signature=vecs[i], baselines=None,
                                         n_samples=6, n_tokens=30)
            ids.append(task.id)
    index = IndexManager(store.read, tmp_path / "index")
    index.open()
    cache = StateCache()
    index.listeners.append(cache.on_changes)
    loader = StateLoader(store, cache)
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with store.read() as s:
        sp = repository.get_space(s, space_id)
        first = loader.load(s, sp, ids)
        assert [x.name for x in first] == ["t0", "t1", "t2"]
        n_first = len(statements)
        assert n_first > 0
        again = loader.load(s, sp, ids[::-1])
        assert len(statements) == n_first, "cache hits ran SQL"
        assert [x.task_id for x in again] == ids[::-1] and again[0].state is first[2].state
    # An append replaces t1's state: the change log reaches the index, the index drops the entry.
    new = _state(99)
    with store.session() as s:
        task = repository.lock_task(s, ids[1])
        repository.store_task_result(s, task, state=new.to_bytes(), signature=vecs[1], baselines=None,
                                     n_samples=6, n_tokens=30)
    index.catch_up(space_id)
    assert cache.get(ids[1]) is None and cache.get(ids[0]) is not None
    with store.read() as s:
        fresh = loader.load(s, repository.get_space(s, space_id), [ids[1]])
    np.testing.assert_array_equal(fresh[0].state.sums, new.sums)
    with store.session() as s:
        repository.delete_task(s, ids[2])
    index.catch_up(space_id)
    with store.read() as s:
        assert [x.task_id for x in loader.load(s, repository.get_space(s, space_id), ids)] == ids[:2]
    index.rebuild(space_id)
    assert len(cache) == 0
    store.close()


@pytest.mark.parametrize("epoch_moves", [False, True])
def test_a_read_older_than_an_invalidation_is_not_cached(epoch_moves: bool) -> None:
    cache = StateCache()
    epoch = cache.epoch
    if epoch_moves:
        cache.on_changes(1, [7])
    cache.put(7, "t", 1, 1, _state(1), epoch=epoch)
    assert (cache.get(7) is None) == epoch_moves
