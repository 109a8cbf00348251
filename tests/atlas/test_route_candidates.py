"""The route path's candidates: completion tasks' prompt-side states are read by digest, their blobs only once.

Every route batch re-ranks every completion-mode task of the space on its prompt-side state (~200 KiB at
m = 4096). The batch read each of those blobs again (PostgreSQL: 9.6 ms for 36 candidates of which 4 are
completion tasks, against 2.9 ms without the blobs); it now reads their stored digests and fetches a blob only
when its decoded view is not cached.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, update
from sqlalchemy.orm import Session, sessionmaker

from atlas import repository, routing_repo
from atlas.models import TaskRouting
from atlas.route_calibration import Calibration
from atlas.samples import Sample
from fishersketch import SketchSpec, SketchState
from tests.atlas.fixtures import random_state

M = 32
SPEC = SketchSpec(d=8, K=16, m=M, seed=0)


@dataclass
class _Loaded:
    task_id: int
    name: str
    state: Any
    view: Any = None


def _state(seed: int) -> SketchState:
    return random_state(SPEC, seed)


def test_prompt_side_blobs_are_read_once_then_found_by_digest(factory: sessionmaker[Session]) -> None:
    # The view cache is process-wide and content-addressed: states of their own for each run (database).
    base = int(np.random.default_rng().integers(1 << 30))
    with factory.begin() as s:
        space = repository.get_or_create_space(
            s, model_fingerprint="model-rc", spec_fingerprint=SPEC.fingerprint(), model_name="tiny", d=8, K=16, m=M,
            seed=0, spec=SPEC.to_dict())
        ids = []
        for i, mode in enumerate(("completion", "completion", "text")):
            sample = Sample(prompt="p", completion="c") if mode == "completion" else Sample(text="t")
            task, _ = repository.create_task_with_job(s, space.id, f"t{i}", mode, {}, [sample])
            blob = _state(base + 100 + i).to_bytes() if mode == "completion" else None
            routing_repo.store_routing(s, task.id, prompt_state=blob,
                                       calibration=Calibration([0.2, 0.3], 0.1, 0.05, 0.05))
            ids.append(int(task.id))
    loaded = [_Loaded(t, f"t{i}", _state(i)) for i, t in enumerate(ids)]
    blob_reads: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        head = statement.split("FROM")[0]  # the select list: the blob itself, not `prompt_state IS NOT NULL`
        if statement.lstrip().upper().startswith("SELECT") and re.search(r"prompt_state(?!\s+IS)", head):
            blob_reads.append(statement)

    event.listen(factory.kw["bind"], "before_cursor_execute", count)
    try:
        with factory() as s:
            first = routing_repo.route_candidates(s, SPEC, loaded, {})
        assert len(blob_reads) == 1  # one statement for both completion tasks' blobs (no view cached yet)
        with factory() as s:
            again = routing_repo.route_candidates(s, SPEC, loaded, {})
        assert len(blob_reads) == 1  # cached by digest: no blob read
        for cands in (first, again):
            np.testing.assert_array_equal(np.asarray(cands[0].state.sums), np.asarray(_state(base + 100).sums))
            np.testing.assert_array_equal(np.asarray(cands[1].state.sums), np.asarray(_state(base + 101).sums))
            assert cands[2].state is loaded[2].state  # a text task routes on its own state
        with factory.begin() as s:  # a job stores a new prompt-side state: its digest changes with it
            routing_repo.store_routing(s, ids[0], prompt_state=_state(base + 200).to_bytes(),
                                       calibration=Calibration([0.2, 0.3], 0.1, 0.05, 0.05))
        before = len(blob_reads)
        with factory() as s:
            fresh = routing_repo.route_candidates(s, SPEC, loaded, {})
        assert len(blob_reads) == before + 1  # the new blob only
        np.testing.assert_array_equal(np.asarray(fresh[0].state.sums), np.asarray(_state(base + 200).sums))
        assert fresh[0].threshold == 0.1 and fresh[0].scale == 0.05
        with factory.begin() as s:  # written by a replica older than 0006 during a rolling upgrade: no digest
            s.execute(update(TaskRouting).where(TaskRouting.task_id == ids[1]).values(
                prompt_state=_state(base + 300).to_bytes(), prompt_digest=None))
        with factory() as s:
            rolling = routing_repo.route_candidates(s, SPEC, loaded, {})
        np.testing.assert_array_equal(np.asarray(rolling[1].state.sums), np.asarray(_state(base + 300).sums))
    finally:
        event.remove(factory.kw["bind"], "before_cursor_execute", count)


def test_the_prompt_side_set_is_not_cached_from_a_snapshot_older_than_the_index(
        factory: sessionmaker[Session], ro_factory: sessionmaker[Session]) -> None:
    """A route's read snapshot is taken before its index catch-up: a completion task committed in between moved
    the space's content mark, and the set read in the older snapshot (without it) was cached under the new mark,
    so the task was left out of every later route until the space changed again."""
    from types import SimpleNamespace

    from atlas import db
    from atlas.index import IndexManager
    from atlas.services.queries import QueryService

    with factory.begin() as s:
        space = repository.get_or_create_space(
            s, model_fingerprint="model-ps", spec_fingerprint=SPEC.fingerprint(), model_name="tiny", d=8, K=16, m=M,
            seed=0, spec=SPEC.to_dict())
        space_id = int(space.id)

    def add(name: str, mode: str, seed: int) -> int:
        state = _state(seed)
        with factory.begin() as s:
            sample = Sample(prompt="p", completion="c") if mode == "completion" else Sample(text="t")
            task, _ = repository.create_task_with_job(s, space_id, name, mode, {}, [sample])
            repository.store_task_result(s, task, state=state.to_bytes(), signature=state.signature(),
                                         baselines=None, n_samples=state.n_samples, n_tokens=state.n_tokens)
            if mode == "completion":
                routing_repo.store_routing(s, task.id, prompt_state=_state(seed + 1).to_bytes(),
                                           calibration=Calibration([0.2, 0.3], 0.1, 0.05, 0.05))
            return int(task.id)

    add("prose", "text", 1)
    index = IndexManager(ro_factory, None)
    index.open()
    svc = SimpleNamespace(index=index, _prompt_side={})
    with ro_factory() as s:
        db.read_snapshot(s)
        repository.get_space(s, space_id)  # the route's snapshot starts here ...
        qa = add("qa", "completion", 10)  # ... a completion task commits ...
        index.catch_up(space_id)  # ... and the route's index catch-up sees it (the content mark moves)
        assert qa not in QueryService._prompt_side_ids(svc, s, space_id)  # type: ignore[arg-type]
    with ro_factory() as s:
        assert qa in QueryService._prompt_side_ids(svc, s, space_id)  # type: ignore[arg-type]


def test_a_blob_rewritten_by_a_replica_without_the_digest_column_is_not_served_from_its_old_view(
        factory: sessionmaker[Session]) -> None:
    """During a rolling upgrade a replica older than 0006 rewrites a row's blob (an append's calibration) without
    knowing the digest column, which keeps the previous blob's digest: its cached view was served for good."""
    base = int(np.random.default_rng().integers(1 << 30))
    with factory.begin() as s:
        space = repository.get_or_create_space(
            s, model_fingerprint="model-sd", spec_fingerprint=SPEC.fingerprint(), model_name="tiny", d=8, K=16, m=M,
            seed=0, spec=SPEC.to_dict())
        task, _ = repository.create_task_with_job(s, space.id, "c", "completion", {}, [Sample(prompt="p",
                                                                                              completion="c")])
        routing_repo.store_routing(s, task.id, prompt_state=_state(base).to_bytes(),
                                   calibration=Calibration([0.2, 0.3], 0.1, 0.05, 0.05))
        tid = int(task.id)
    loaded = [_Loaded(tid, "c", _state(1))]
    with factory() as s:
        routing_repo.route_candidates(s, SPEC, loaded, {})  # the first blob's view is cached
    with factory.begin() as s:  # the older replica's store_routing: blob and version, no digest
        s.execute(update(TaskRouting).where(TaskRouting.task_id == tid).values(
            prompt_state=_state(base + 1).to_bytes(), version=TaskRouting.version + 1))
    with factory() as s:
        (cand,) = routing_repo.route_candidates(s, SPEC, loaded, {})
    np.testing.assert_array_equal(np.asarray(cand.state.sums), np.asarray(_state(base + 1).sums))


def _held_out_reads(factory: sessionmaker[Session]) -> tuple[list[str], Any]:
    reads: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "cal_scores" in statement.split("FROM")[0]:
            reads.append(statement)

    event.listen(factory.kw["bind"], "before_cursor_execute", count)
    return reads, count


def _one_task(factory: sessionmaker[Session], key: str, scores: list[float]) -> int:
    with factory.begin() as s:
        space = repository.get_or_create_space(
            s, model_fingerprint=key, spec_fingerprint=SPEC.fingerprint(), model_name="tiny", d=8, K=16, m=M,
            seed=0, spec=SPEC.to_dict())
        task, _ = repository.create_task_with_job(s, space.id, "t", "text", {}, [Sample(text="t")])
        routing_repo.store_routing(s, task.id, prompt_state=None, calibration=Calibration(scores, 0.1, 0.05, 0.05))
        return int(task.id)


def test_held_out_scores_are_read_once_per_write_of_the_row(factory: sessionmaker[Session]) -> None:
    """Each route batch read every candidate's held-out scores (up to 256 floats of JSON each: more than half of
    the batch's routing-row read); their typical score is now cached by the row's version and write time, and
    follows every write — the product's, and an older replica's that bumps the version but knows no cache."""
    from atlas.routing import typical_score

    tid = _one_task(factory, "model-typ", [0.2, 0.3])
    reads, count = _held_out_reads(factory)

    def typical() -> tuple[float | None, int]:
        """The routed typical score, and how many statements read held-out scores for it."""
        before = len(reads)
        with factory() as s:
            value = routing_repo.get_task_routes(s, [tid])[tid].typical
        return value, len(reads) - before

    try:
        assert typical() == (typical_score([0.2, 0.3]), 1)
        assert typical() == (typical_score([0.2, 0.3]), 0)  # cached
        with factory.begin() as s:  # a job's new calibration
            routing_repo.store_routing(s, tid, prompt_state=None,
                                       calibration=Calibration([0.6, 0.7, 0.8], 0.5, 0.05, 0.05))
        assert typical() == (typical_score([0.6, 0.7, 0.8]), 1)
        with factory.begin() as s:  # an older replica's write: scores and version (its ORM stamps the time)
            s.execute(update(TaskRouting).where(TaskRouting.task_id == tid).values(
                cal_scores=[-0.4], version=TaskRouting.version + 1))
        assert typical() == (typical_score([-0.4]), 1)
        with factory.begin() as s:  # no scores: no typical
            routing_repo.store_routing(s, tid, prompt_state=None, calibration=Calibration([], None, None, 0.05))
        assert typical() == (None, 1)
        assert typical() == (None, 0)
    finally:
        event.remove(factory.kw["bind"], "before_cursor_execute", count)


def test_two_databases_with_the_same_row_identity_keep_their_own_typical(
        factory: sessionmaker[Session], sqlite_template: Any, tmp_path: Any) -> None:
    """The cache is process-wide: two stores whose rows share task id, version and write time (a copied database
    written apart) must not share an entry."""
    import datetime as dt
    import shutil

    from atlas import db
    from atlas.routing import typical_score

    path = tmp_path / "other.sqlite"
    shutil.copyfile(sqlite_template, path)
    other = db.session_factory(db.make_engine(f"sqlite:///{path}"))
    stamp = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    ids = []
    for fac, scores in ((factory, [0.9, 0.8]), (other, [-0.5, -0.6])):
        tid = _one_task(fac, "model-two", scores)
        with fac.begin() as s:
            s.execute(update(TaskRouting).where(TaskRouting.task_id == tid).values(version=7, updated_at=stamp))
        ids.append(tid)
    if ids[0] != ids[1]:
        return  # PostgreSQL's sequence started elsewhere: the identity is not shared (SQLite always shares it)
    for fac, scores in ((factory, [0.9, 0.8]), (other, [-0.5, -0.6])):
        with fac() as s:
            assert routing_repo.get_task_routes(s, ids[:1])[ids[0]].typical == typical_score(scores)


def test_an_imported_routing_record_with_scores_outside_the_route_range_is_refused(
        factory: sessionmaker[Session]) -> None:
    """An export's held-out scores are cosines; [1e308] * 6 (a crafted file whose checksum was recomputed) was
    imported: the task lost its calibration on SQLite (a NaN threshold stored as NULL)."""
    from atlas.errors import InvalidInput

    tid = _one_task(factory, "model-imp", [0.2, 0.3])
    for scores in ([1e308] * 6, [0.1, -1.5, 0.2], [0.1, float("nan")]):
        with factory.begin() as s, pytest.raises(InvalidInput, match=r"\[-1, 1\]"):
            routing_repo.import_record(s, tid, {"cal_scores": scores}, SPEC)
    with factory.begin() as s:
        routing_repo.import_record(s, tid, {"cal_scores": [0.4 + 0.01 * i for i in range(20)]}, SPEC)
    with factory() as s:
        assert routing_repo.get_task_routes(s, [tid])[tid].threshold is not None
