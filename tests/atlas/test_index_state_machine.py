"""Stateful property: after any sequence of writes, persists, prunes, crashes and file damage, the index
manager's index holds exactly what SQL holds (same ids, same vectors), for flat and two-stage kinds.

Real SQLite (a migrated file per example), real FAISS files on disk, small ``m``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import faiss
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

import migrations
from atlas import changes, db, repository
from atlas.index import IndexManager
from atlas.index_ann import TwoStageIndex
from tests.atlas.fixtures import add_ready_task, make_space

M = 16
IVF_MIN = 12  # spaces of 12+ signatures get the two-stage index: both kinds and the switch are exercised

_TEMPLATE: dict[str, Path] = {}


def _template() -> Path:
    if "path" not in _TEMPLATE:
        path = Path(tempfile.mkdtemp(prefix="fa-sm-template-")) / "atlas.sqlite"
        migrations.upgrade(f"sqlite:///{path}")
        _TEMPLATE["path"] = path
    return _TEMPLATE["path"]


def _vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(M).astype(np.float32)
    return v / np.linalg.norm(v)


def _stored_vectors(index: object) -> dict[int, np.ndarray]:
    """Every (id, vector) an index holds (the full-vector stage of a two-stage index)."""
    full = index.full if isinstance(index, TwoStageIndex) else index
    ids = [int(i) for i in faiss.vector_to_array(full.id_map)]
    return {i: full.reconstruct(i) for i in ids}


class IndexAgainstSQL(RuleBasedStateMachine):
    """Random add / replace / delete of signatures, persist, prune, crash, damage files, reopen."""

    @initialize()
    def init_store(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="fa-sm-"))
        shutil.copyfile(_template(), self.work / "atlas.sqlite")
        self.engine = db.make_engine(f"sqlite:///{self.work / 'atlas.sqlite'}")
        self.factory = db.session_factory(self.engine)
        self.ro = db.session_factory(self.engine, readonly=True)
        self.space_id = make_space(self.factory, m=M).id
        self.live: list[int] = []
        self.seed = 0
        self.manager = self._open()

    def _open(self) -> IndexManager:
        manager = IndexManager(self.ro, self.work / "idx", kind="auto", ivf_min_size=IVF_MIN, nprobe=4)
        manager.open()
        return manager

    def _next(self) -> int:
        self.seed += 1
        return self.seed

    @rule(n=st.integers(1, 6))
    def add(self, n: int) -> None:
        for _ in range(n):
            s = self._next()
            self.live.append(add_ready_task(self.factory, self.space_id, f"t{s}", _vec(s)))

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10_000))
    def replace(self, pick: int) -> None:
        tid = self.live[pick % len(self.live)]
        with self.factory.begin() as s:
            task = repository.lock_task(s, tid)
            repository.store_task_result(s, task, state=b"S", signature=_vec(self._next()), baselines=None,
                                         n_samples=2, n_tokens=4)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10_000))
    def delete(self, pick: int) -> None:
        tid = self.live.pop(pick % len(self.live))
        with self.factory.begin() as s:
            repository.delete_task(s, tid)

    @rule()
    def catch_up(self) -> None:
        self.manager.catch_up()

    @rule()
    def persist(self) -> None:
        self.manager.persist()

    @rule(retain=st.integers(0, 8), own=st.booleans())
    def prune(self, retain: int, own: bool) -> None:
        """Compact as this manager would, or prune as another replica might (past our watermark)."""
        if own:
            self.manager.compact(self.factory, retain=retain)
        else:
            with self.factory.begin() as s:
                changes.prune(s, changes.last_seq(s) - retain)

    @rule()
    def crash_and_reopen(self) -> None:
        """Drop the in-memory index without persisting, then reopen from files and the log."""
        self.manager = self._open()

    @rule(which=st.sampled_from(["faiss", "coarse.faiss", "meta.json"]),
          how=st.sampled_from(["truncate", "flip", "delete"]))
    def damage_files_and_reopen(self, which: str, how: str) -> None:
        path = self.work / "idx" / f"space-{self.space_id}.{which}"
        if path.exists():
            data = bytearray(path.read_bytes())
            if how == "truncate":
                path.write_bytes(bytes(data[: len(data) // 2]))
            elif how == "flip" and data:
                data[len(data) // 3] ^= 0xFF
                path.write_bytes(bytes(data))
            else:
                path.unlink()
        self.manager = self._open()

    @rule()
    def check(self) -> None:
        self.manager.catch_up()
        with self.ro() as s:
            ids, vecs = repository.get_signatures(s, space_id=self.space_id)
            head = changes.last_seq(s)
        assert sorted(ids.tolist()) == sorted(self.live)
        si = self.manager._spaces[self.space_id]
        held = _stored_vectors(si.index)
        assert sorted(held) == ids.tolist(), "index ids differ from SQL"
        assert si.ids == set(held) and si.index.ntotal == len(ids)
        if isinstance(si.index, TwoStageIndex):
            assert si.index.coarse.ntotal == len(ids), "coarse stage out of step"
        for i, v in zip(ids.tolist(), vecs, strict=True):
            np.testing.assert_array_equal(held[i], v)
        assert self.manager.watermark(self.space_id) == head
        if len(ids):  # search agrees with exact search on the top hit (re-rank is exact)
            q = vecs[:1]
            got = self.manager.search(self.space_id, q, 1)[1][0, 0]
            assert got == int(ids[int(np.argmax(vecs @ q[0]))])

    def teardown(self) -> None:
        if hasattr(self, "engine"):
            self.check()
            self.engine.dispose()
            shutil.rmtree(self.work, ignore_errors=True)


IndexAgainstSQL.TestCase.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
test_index_against_sql = pytest.mark.timeout(120)(IndexAgainstSQL.TestCase)
