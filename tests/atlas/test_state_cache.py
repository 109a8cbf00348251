"""StateCache: byte-bounded, kept current by the change log, no SQL for cached reads (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from atlas import changes, repository
from atlas.errors import IncompatibleSpace
from atlas.models import Space
from atlas.samples import Sample
from atlas.state_cache import StateCache
from fishersketch import SketchSpec, SketchState
from tests.atlas.fixtures import random_state

M = 32


def _space(factory: sessionmaker[Session], key: str = "model-sc") -> Space:
    spec = SketchSpec(d=8, K=16, m=M, seed=0)
    with factory.begin() as s:
        return repository.get_or_create_space(
            s, model_fingerprint=key, spec_fingerprint=spec.fingerprint(), model_name="tiny", d=8, K=16, m=M,
            seed=0, spec=spec.to_dict(),
        )


def _state(space: Space, seed: int) -> SketchState:
    return random_state(SketchSpec.from_dict(space.spec), seed)


def _vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(M).astype(np.float32)
    return v / np.linalg.norm(v)


def _add(factory: sessionmaker[Session], space: Space, name: str, seed: int) -> int:
    with factory.begin() as s:
        task, _ = repository.create_task_with_job(s, space.id, name, "text", {}, [Sample(text=name)])
        repository.store_task_result(s, task, state=_state(space, seed).to_bytes(), signature=_vec(seed),
                                     baselines=None, n_samples=1, n_tokens=3)
        return int(task.id)


def _replace(factory: sessionmaker[Session], space: Space, task_id: int, seed: int) -> None:
    with factory.begin() as s:
        task = repository.lock_task(s, task_id)
        repository.store_task_result(s, task, state=_state(space, seed).to_bytes(), signature=_vec(seed),
                                     baselines=None, n_samples=2, n_tokens=6)


class _StatementCounter:
    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.n = 0
        event.listen(factory.kw["bind"], "before_cursor_execute", self._count)

    def _count(self, *args: object) -> None:
        self.n += 1


def test_cached_reads_run_no_sql_and_follow_replacements(factory, ro_factory) -> None:
    space = _space(factory)
    ids = [_add(factory, space, f"t{i}", seed=i) for i in range(6)]
    cache = StateCache(10 << 20, sync_interval_s=3600)
    first = cache.get_many(ro_factory, space, [ids[3], 999_999, ids[0], ids[3]])
    assert [e.task_id for e in first] == [ids[3], ids[0], ids[3]]  # order kept, missing left out
    np.testing.assert_array_equal(first[0].state.sums, _state(space, 3).sums)
    assert first[1].name == "t0" and first[0].view[0].shape == (3, M)

    counter = _StatementCounter(ro_factory)
    again = cache.get_many(ro_factory, space, [ids[0], ids[3]])
    assert counter.n == 0, "a cached read within the sync interval must not touch SQL"
    assert [e.task_id for e in again] == [ids[0], ids[3]]
    assert cache.stats().hits >= 2

    cache.get_many(ro_factory, space, [ids[1]])
    _replace(factory, space, ids[3], seed=103)
    with factory.begin() as s:
        repository.delete_task(s, ids[0])
        repository.update_task(s, ids[1], name="renamed")
    assert [e.name for e in cache.get_many(ro_factory, space, [ids[1]])] == ["t1"]  # stale until synced
    assert cache.sync(ro_factory) == 3  # ids[3] replaced, ids[0] deleted, ids[1] renamed
    with ro_factory() as s:
        assert cache.watermark == changes.last_seq(s)
    now = cache.get_many(ro_factory, space, [ids[0], ids[1], ids[3]])
    assert [(e.task_id, e.name) for e in now] == [(ids[1], "renamed"), (ids[3], "t3")]
    np.testing.assert_array_equal(now[1].state.sums, _state(space, 103).sums)
    assert now[1].version == 2


def test_fresh_read_sees_other_writers_at_once(factory, ro_factory) -> None:
    space = _space(factory)
    tid = _add(factory, space, "a", seed=1)
    cache = StateCache(10 << 20, sync_interval_s=0)
    assert cache.get_many(ro_factory, space, [tid])[0].version == 1
    _replace(factory, space, tid, seed=2)  # another process writes; this cache learns it from the log
    got = cache.get_many(ro_factory, space, [tid])[0]
    assert got.version == 2
    np.testing.assert_array_equal(got.state.sums, _state(space, 2).sums)


def test_budget_is_bounded_in_bytes(factory, ro_factory) -> None:
    space = _space(factory)
    ids = [_add(factory, space, f"t{i}", seed=i) for i in range(10)]
    one = StateCache(10 << 20).get_many(ro_factory, space, ids[:1])[0].nbytes
    assert one > 6 * M * 8  # at least the state's sums are charged
    cache = StateCache(3 * one + one // 2)
    for _ in range(2):
        got = cache.get_many(ro_factory, space, ids)
        assert [e.task_id for e in got] == ids  # answers stay complete when the budget is small
        for e, i in zip(got, range(10), strict=True):
            np.testing.assert_array_equal(e.state.sums, _state(space, i).sums)
        stats = cache.stats()
        assert stats.bytes <= stats.max_bytes and stats.entries == 3
    assert stats.evictions >= 14
    assert list(cache.get_many(ro_factory, space, ids[-3:])) and all(i in cache for i in ids[-3:])
    assert StateCache(0).get_many(ro_factory, space, ids[:2]) and len(StateCache(0)) == 0


def test_pruned_log_clears_the_cache(factory, ro_factory) -> None:
    space = _space(factory)
    ids = [_add(factory, space, f"t{i}", seed=i) for i in range(3)]
    cache = StateCache(10 << 20, sync_interval_s=3600)
    cache.get_many(ro_factory, space, ids)
    _replace(factory, space, ids[1], seed=50)
    with factory.begin() as s:
        changes.prune(s, changes.last_seq(s))  # the change that names ids[1] is gone
    cache.sync(ro_factory)
    assert len(cache) == 0 and cache.stats().clears >= 1
    got = cache.get_many(ro_factory, space, [ids[1]])[0]
    np.testing.assert_array_equal(got.state.sums, _state(space, 50).sums)


def test_entry_loaded_behind_the_watermark_is_not_cached(factory, ro_factory) -> None:
    space = _space(factory)
    tid = _add(factory, space, "a", seed=1)
    cache = StateCache(10 << 20, sync_interval_s=3600)
    cache.sync(ro_factory)
    cache.apply_changes([], head=cache.watermark + 5)  # as if a sync raced ahead of this load
    assert [e.task_id for e in cache.get_many(ro_factory, space, [tid], fresh=False)] == [tid]
    assert tid not in cache


def test_foreign_space_is_refused(factory, ro_factory) -> None:
    a, b = _space(factory, "model-a"), _space(factory, "model-b")
    tid = _add(factory, b, "x", seed=1)
    cache = StateCache(10 << 20)
    with pytest.raises(IncompatibleSpace):
        cache.get_many(ro_factory, a, [tid])
    assert cache.get_many(ro_factory, b, [tid])[0].space_id == b.id
    with pytest.raises(IncompatibleSpace):
        cache.get_many(ro_factory, a, [tid])  # refused from the cache too


_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "replace", "delete", "rename", "read", "prune"]), st.integers(0, 7)),
    min_size=1, max_size=25,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_cache_always_answers_what_sql_holds(factory, ro_factory, ops) -> None:
    """Any interleaving of writes, reads and prunes: every read equals a direct SQL read."""
    space = _space(factory, key=f"prop-{uuid.uuid4().hex}")
    cache = StateCache(3000, sync_interval_s=0)  # room for about two entries: evictions too
    live: dict[int, int] = {}  # slot -> task id
    seed = 1000
    for op, slot in ops:
        seed += 1
        if op == "add" and slot not in live:
            live[slot] = _add(factory, space, f"s{slot}-{seed}", seed)
        elif op == "replace" and slot in live:
            _replace(factory, space, live[slot], seed)
        elif op == "delete" and slot in live:
            with factory.begin() as s:
                repository.delete_task(s, live.pop(slot))
        elif op == "rename" and slot in live:
            with factory.begin() as s:
                repository.update_task(s, live[slot], name=f"r{slot}-{seed}")
        elif op == "prune":
            with factory.begin() as s:
                changes.prune(s, changes.last_seq(s) - slot)
        wanted = sorted(set(live.values()) | {slot + 10_000})
        got = cache.get_many(ro_factory, space, wanted)
        with ro_factory() as s:
            blobs = repository.get_states(s, wanted)
            names = {t.id: t.name for t in repository.get_tasks(s, list(blobs))}
        assert [e.task_id for e in got] == sorted(blobs)
        for e in got:
            assert e.name == names[e.task_id]
            np.testing.assert_array_equal(e.state.sums, SketchState.from_bytes(blobs[e.task_id]).sums)
