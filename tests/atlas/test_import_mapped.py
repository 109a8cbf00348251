"""A space import reads its file through a memory map and holds one task's records at a time.

``parse_export`` checks every line but keeps only where each task's line is; ``import_space`` decodes the state,
routing record and lexical record again as it stores each task, and lets the ORM copies go after each flush. What
must not change: every record arrives byte for byte, and the import stays all or nothing — a task refused late
(its routing record) takes back the tasks already flushed into the transaction. Real SQLite and PostgreSQL.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from atlas import lexicon_repo, repository, routing_repo, space_io
from atlas.errors import InvalidInput
from atlas.models import Space, Task
from atlas.route_calibration import calibrate
from atlas.samples import Sample
from fishersketch import SketchSpec
from tests.atlas.fixtures import random_state

SPEC = SketchSpec(d=8, K=16, m=64, seed=0)


def _space(factory: sessionmaker[Session]) -> int:
    with factory.begin() as s:
        return int(repository.get_or_create_space(
            s, model_fingerprint="model-mapped", spec_fingerprint=SPEC.fingerprint(), model_name="tiny", d=8, K=16,
            m=SPEC.m, seed=0, spec=SPEC.to_dict()).id)


def _task(factory: sessionmaker[Session], space_id: int, i: int) -> None:
    """Task ``t{i}``: a state; every other one a completion task with a prompt-side state and calibration; terms."""
    completion = i % 2 == 1
    state = random_state(SPEC, 10 + i)
    with factory.begin() as s:
        sample = Sample(prompt=f"question {i}", completion=" yes") if completion else Sample(text=f"text {i}")
        task, _ = repository.create_task_with_job(s, space_id, f"t{i}", "completion" if completion else "text", {},
                                                  [sample])
        repository.store_task_result(s, task, state=state.to_bytes(), signature=state.signature(), baselines=None,
                                     n_samples=state.n_samples, n_tokens=state.n_tokens)
        lexicon_repo.add_delta(s, task.id, lexicon_repo.LexicalDelta.of_samples([sample], task.mode))
        if completion:
            routing_repo.store_routing(s, task.id, prompt_state=random_state(SPEC, 50 + i).to_bytes(),
                                       calibration=calibrate([0.1 * i, 0.2, 0.3, 0.25]))


def _records(ro_factory: sessionmaker[Session], space_id: int) -> dict[str, tuple[bytes, bytes, object, object]]:
    """Per task name: (state, signature bytes, exported routing record, lexical blob)."""
    with ro_factory() as s:
        tasks = {t.name: int(t.id) for t in s.execute(select(Task).where(Task.space_id == space_id)).scalars()}
        ids = list(tasks.values())
        states = repository.get_states(s, ids)
        routes = routing_repo.export_records(s, ids)
        terms = lexicon_repo.get_blobs(s, ids)
        sig_ids, vectors = repository.get_signatures(s, task_ids=ids)
        sigs = {int(tid): vec.tobytes() for tid, vec in zip(sig_ids, vectors, strict=True)}
    return {name: (states[tid], sigs[tid], routes.get(tid), terms.get(tid)) for name, tid in tasks.items()}


def _export(ro_factory: sessionmaker[Session], space_id: int) -> bytes:
    with ro_factory() as s:
        space = s.get(Space, space_id)
        assert space is not None
        s.expunge(space)
        ids = space_io.ready_task_ids(s, space_id)
    return b"".join(space_io.export_lines(ro_factory, space, ids))


def _clear(factory: sessionmaker[Session], space_id: int) -> None:
    with factory.begin() as s:
        for tid in s.execute(select(Task.id).where(Task.space_id == space_id)).scalars().all():
            repository.delete_task(s, tid)


def _count(ro_factory: sessionmaker[Session], space_id: int) -> int:
    with ro_factory() as s:
        return int(s.execute(select(func.count()).select_from(Task).where(Task.space_id == space_id)).scalar_one())


def test_an_import_from_a_memory_map_restores_every_record_byte_for_byte(factory, ro_factory, tmp_path: Path) -> None:
    space_id = _space(factory)
    for i in range(5):
        _task(factory, space_id, i)
    before = _records(ro_factory, space_id)
    assert sum(r[2] is not None for r in before.values()) == 2  # two completion tasks carry prompt-side states
    path = tmp_path / "space.jsonl"
    path.write_bytes(_export(ro_factory, space_id))
    _clear(factory, space_id)
    with path.open("rb") as file, space_io.map_export(file) as data:
        assert not isinstance(data, bytes)  # a memory map, not a copy
        assert space_io.import_space(factory, data)[1:] == (5, [])
    assert _records(ro_factory, space_id) == before


def _resealed(data: bytes, edit) -> bytes:
    """``data`` with its task lines edited by ``edit(index, dict) -> dict`` and its trailer recomputed."""
    lines = data.split(b"\n")[:-2]
    lines[1:] = [json.dumps(edit(i, json.loads(ln))).encode() for i, ln in enumerate(lines[1:])]
    body = b"".join(ln + b"\n" for ln in lines)
    trailer = {"trailer": True, "n_tasks": len(lines) - 1, "sha256": hashlib.sha256(body).hexdigest()}
    return body + (json.dumps(trailer) + "\n").encode()


def test_a_task_refused_while_stored_takes_back_the_tasks_flushed_before_it(factory, ro_factory) -> None:
    """The last task's routing record is checked only as it is stored, after the others were flushed and let go."""
    space_id = _space(factory)
    for i in range(4):
        _task(factory, space_id, i)
    data = _export(ro_factory, space_id)
    _clear(factory, space_id)

    def break_last(i: int, line: dict) -> dict:
        if i == 3:
            assert line["routing"] is not None
            line["routing"]["cal_scores"] = [5.0]  # not a route score: refused by routing_repo.import_record
        return line

    bad = _resealed(data, break_last)
    assert len(space_io.parse_export(bad)[3]) == 4  # the file itself checks out
    with pytest.raises(InvalidInput, match=r"task 't3'.*cal_scores"):
        space_io.import_space(factory, bad)
    assert _count(ro_factory, space_id) == 0  # nothing of it stored
    assert space_io.import_space(factory, data)[1] == 4  # the intact file still imports


def test_an_empty_file_maps_to_an_empty_import(factory, tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with path.open("rb") as file, space_io.map_export(file) as data, pytest.raises(InvalidInput, match="empty"):
        space_io.import_space(factory, data)


def test_a_line_whose_state_is_not_base64_names_its_line(factory, ro_factory) -> None:
    space_id = _space(factory)
    _task(factory, space_id, 0)
    data = _resealed(_export(ro_factory, space_id),
                     lambda i, line: {**line, "state": base64.b64encode(b"x").decode() + "!"})
    with pytest.raises(InvalidInput, match="line 2: state is not valid base64"):
        space_io.import_space(factory, data)
