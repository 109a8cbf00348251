"""IVF retraining past the training cap, and space export/import edges: an export racing a job, lexical records
without a routing record, corrupt records, baselines of another width (each failed before its fix)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import atlas.index as index_module
from atlas import lexicon_repo, repository, routing_repo, space_io
from atlas.index import IndexManager
from atlas.models import Space, Task
from atlas.samples import Sample
from fishersketch import SketchSpec, SketchState
from tests.atlas.fixtures import add_ready_task, bulk_ready_tasks, make_space, random_state, unit_vectors

M = 64


def test_a_space_past_the_training_cap_is_not_rebuilt_on_every_catch_up(
    factory, ro_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training sample is capped (16,384 signatures); a space over 4x the cap used to count as having
    "outgrown its training" for good, so every catch-up (any change, in any space) rebuilt it from SQL."""
    monkeypatch.setattr(index_module, "_TRAIN_SAMPLE", 20)  # the cap, scaled down
    space = make_space(factory, m=32)
    bulk_ready_tasks(factory, space.id, unit_vectors(100, 32), prefix="a")  # > 4 x the cap
    index = IndexManager(ro_factory, tmp_path / "idx", ivf_min_size=10, coarse_dim=8)
    index.open()
    assert index.stats(space.id)["kind"] == "ivf"
    builds: list[int] = []
    build = index._build
    monkeypatch.setattr(index, "_build", lambda sid: (builds.append(sid), build(sid))[1])
    other = make_space(factory, m=32, key="model-b")
    for i in range(3):
        add_ready_task(factory, space.id, f"n{i}", unit_vectors(1, 32, seed=50 + i)[0])
        add_ready_task(factory, other.id, f"o{i}", unit_vectors(1, 32, seed=80 + i)[0])
        index.catch_up()
    assert builds == [other.id]  # the new space once; the large one is caught up, not rebuilt
    assert index.ids(space.id).size == 103
    # it is still retrained once it has grown 4x past its size at training
    bulk_ready_tasks(factory, space.id, unit_vectors(300, 32, seed=3), prefix="b")
    index.catch_up()
    assert builds == [other.id, space.id]


# -- export / import -------------------------------------------------------------------------------


def _spec_space(factory: sessionmaker[Session]) -> Space:
    spec = SketchSpec(d=8, K=16, m=M, seed=0)
    with factory.begin() as s:
        return repository.get_or_create_space(
            s, model_fingerprint="model-x", spec_fingerprint=spec.fingerprint(), model_name="tiny", d=8, K=16, m=M,
            seed=0, spec=spec.to_dict(),
        )


def _state(space: Space, seed: int) -> SketchState:
    return random_state(SketchSpec.from_dict(space.spec), seed)


def _store(session: Session, task: Task, state: SketchState) -> None:
    repository.store_task_result(session, task, state=state.to_bytes(), signature=state.signature(), baselines=None,
                                 n_samples=state.n_samples, n_tokens=state.n_tokens)


def _ready(factory: sessionmaker[Session], space: Space, name: str, seed: int) -> int:
    with factory.begin() as s:
        task, _ = repository.create_task_with_job(s, space.id, name, "text", {}, [Sample(text=f"{name} is a task")])
        _store(s, task, _state(space, seed))
        return int(task.id)


def _detached(ro_factory: sessionmaker[Session], space_id: int) -> Space:
    with ro_factory() as s:
        space = s.get(Space, space_id)
        assert space is not None
        s.expunge(space)
        return space


def test_an_export_taken_while_a_job_appends_imports(factory, ro_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL reads at READ COMMITTED: an append committing between the reads of a task's state and of its
    signature exported a line whose signature did not match its state, and the import refused the file."""
    space = _spec_space(factory)
    tid = _ready(factory, space, "a", 1)
    read_states = space_io.repo.get_states

    def states_then_append(session: Session, ids: list[int]) -> dict[int, bytes]:
        out = read_states(session, ids)
        with factory.begin() as w:  # a job's final transaction commits meanwhile
            task = repository.lock_task(w, tid)
            assert task is not None
            _store(w, task, _state(space, 2).merge(_state(space, 3)))
        return out

    monkeypatch.setattr(space_io.repo, "get_states", states_then_append)
    data = b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), [tid]))
    monkeypatch.undo()
    _, _, _, tasks = space_io.parse_export(data)  # raised InvalidInput ("tampered or corrupt")
    assert [t["name"] for t in tasks] == ["a"]


def test_the_lexical_record_of_a_task_without_routing_record_is_exported(factory, ro_factory, tmp_path: Path) -> None:
    """Terms were exported only inside a task's routing record: a task that has terms but no routing record
    (stored before routing records existed, or whose prompt-side pass failed) lost them on export/import,
    and every prompt with it among its candidates lost its lexical ranking."""
    space = _spec_space(factory)
    plain = _ready(factory, space, "plain", 1)
    with factory.begin() as s:
        lexicon_repo.add_delta(s, plain, lexicon_repo.LexicalDelta.of_samples([Sample(text="capital of france")],
                                                                              "text"))
    with ro_factory() as s:
        assert routing_repo.get_routing(s, plain) is None
        before = lexicon_repo.get_blobs(s, [plain])[plain]
    data = b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), [plain]))
    with factory.begin() as s:
        repository.delete_task(s, plain)
    space_id, imported, _ = space_io.import_space(factory, data)
    assert (space_id, imported) == (space.id, 1)
    with ro_factory() as s:
        new_id = s.execute(select(Task.id).where(Task.space_id == space.id, Task.name == "plain")).scalar_one()
        assert lexicon_repo.get_blobs(s, [new_id]) == {new_id: before}
        assert routing_repo.get_routing(s, new_id) is None


def test_a_corrupt_lexical_record_in_an_import_is_refused(factory, ro_factory) -> None:
    space = _spec_space(factory)
    tid = _ready(factory, space, "a", 1)
    data = b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), [tid]))
    with pytest.raises(space_io.InvalidInput, match="lexical record"):
        space_io.parse_export(_resealed(data, lambda line: {**line, "terms": "AAAA"}))


def _resealed(data: bytes, edit) -> bytes:
    """``data`` with its task lines edited by ``edit(dict) -> dict`` and its trailer recomputed."""
    import hashlib
    import json

    lines = data.split(b"\n")[:-2]
    lines[1:] = [(json.dumps(edit(json.loads(ln)))).encode() for ln in lines[1:]]
    body = b"".join(ln + b"\n" for ln in lines)
    trailer = {"trailer": True, "n_tasks": len(lines) - 1, "sha256": hashlib.sha256(body).hexdigest()}
    return body + (json.dumps(trailer) + "\n").encode()


def test_baselines_of_another_width_are_refused_on_import(factory, ro_factory) -> None:
    """Baselines were only checked to deserialise: a task imported with a foreign width failed every later
    append (its job's merge raised)."""
    import base64

    from atlas.baselines import BaselineSums

    space = _spec_space(factory)
    tid = _ready(factory, space, "a", 1)
    data = b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), [tid]))
    for width, ok in ((8, True), (7, True), (5, False)):
        blob = base64.b64encode(BaselineSums(d=width).to_bytes()).decode()
        edited = _resealed(data, lambda line, blob=blob: {**line, "baselines": blob})
        if ok:
            assert len(space_io.parse_export(edited)[3]) == 1
        else:
            with pytest.raises(space_io.InvalidInput, match="width 5"):
                space_io.parse_export(edited)


def test_an_imported_task_keeps_its_creation_time(factory, ro_factory) -> None:
    """The export wrote each task's ``created_at`` and the import dropped it: every restored task looked
    created at the moment of the restore (listings sorted by age, dashboards, retention scripts)."""
    import datetime as dt

    space = _spec_space(factory)
    tid = _ready(factory, space, "a", 1)
    long_ago = dt.datetime(2024, 2, 29, 12, 30, tzinfo=dt.UTC)
    with factory.begin() as s:
        task = s.get(Task, tid)
        assert task is not None
        task.created_at = long_ago
    data = b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), [tid]))
    with factory.begin() as s:
        repository.delete_task(s, tid)
    space_io.import_space(factory, data)
    with ro_factory() as s:
        created = s.execute(select(Task.created_at).where(Task.space_id == space.id, Task.name == "a")).scalar_one()
    assert created == long_ago
    naive = _resealed(data, lambda line: {**line, "created_at": "2024-02-29T12:30:00"})  # read as UTC
    assert space_io.parse_export(naive)[3][0]["created_at"] == long_ago
    with pytest.raises(space_io.InvalidInput, match="line 2"):
        space_io.parse_export(_resealed(data, lambda line: {**line, "created_at": "last leap day"}))


def test_an_import_of_millions_of_lines_or_values_is_refused_in_bounded_memory(factory, ro_factory) -> None:
    """``parse_export`` split the whole file into a list of lines first (a file of millions of short lines: hundreds
    of megabytes before the first check), and pydantic built a line of millions of values before its 422 (8.4 GB for
    a 63 MB line). The library imports through it too, so the bounds live here, not only at the HTTP edge."""
    import tracemalloc

    from atlas.errors import PayloadTooLarge

    space = _spec_space(factory)
    tid = _ready(factory, space, "a", 1)
    data = b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), [tid]))
    header = data.split(b"\n", 1)[0] + b"\n"
    tracemalloc.start()
    try:
        with pytest.raises(space_io.InvalidInput, match="trailer"):
            space_io.parse_export(header + b"ab\n" * 500_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # the list of lines alone: ~21 MB
    with pytest.raises(PayloadTooLarge, match="line 2"):
        space_io.parse_export(header + b'{"name":"x","x":[' + b"{}," * 200_000 + b"{}]}\n")
    assert len(space_io.parse_export(data)[3]) == 1  # a real export still reads
    body, trailer = data[:-1].rsplit(b"\n", 1)
    with pytest.raises(space_io.InvalidInput, match="counts 2 tasks but the file holds 1"):
        space_io.parse_export(body + b"\n" + trailer.replace(b'"n_tasks": 1', b'"n_tasks": 2') + b"\n")


def test_a_creation_time_out_of_range_in_utc_is_refused_with_its_line(factory, ro_factory) -> None:
    """``created_at`` of year 1 with a positive offset (or 9999 with a negative one) parses, but is out of range
    once read as UTC: ``astimezone`` raised OverflowError after validation and the import answered 500."""
    space = _spec_space(factory)
    tid = _ready(factory, space, "a", 1)
    data = b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), [tid]))
    for when in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:30:00-02:00"):
        with pytest.raises(space_io.InvalidInput, match="line 2"):
            space_io.parse_export(_resealed(data, lambda line, w=when: {**line, "created_at": w}))


def test_a_key_repeated_in_an_export_line_is_refused(factory, ro_factory) -> None:
    """An export line naming a key twice (``"name"``, a metadata key) was imported with the last value: the task got
    the second name and the first metadata value was lost without a word (a data-integrity review, 2026-12-07), where
    every other JSON the service reads refuses a repeated key. Fields it does not read are still ignored."""
    import hashlib
    import json

    space = _spec_space(factory)
    tid = _ready(factory, space, "a", 1)
    with factory.begin() as s:
        task = s.get(Task, tid)
        assert task is not None
        task.meta = {"owner": "first", "tags": {"k": 1}}
    data = _resealed(b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), [tid])),
                     lambda line: {**line, "future_field": {"x": 1}})  # read by a later version: ignored
    assert space_io.parse_export(data)[3][0]["name"] == "a"

    def twice(line: bytes, key: bytes, value: bytes) -> bytes:
        """``data`` with ``key`` given a second time, first, in its object of ``line`` (the trailer recomputed)."""
        lines = data.split(b"\n")[:-2]
        lines[line] = lines[line].replace(key + b": ", key + b": " + value + b", " + key + b": ", 1)
        body = b"".join(ln + b"\n" for ln in lines)
        trailer = {"trailer": True, "n_tasks": len(lines) - 1, "sha256": hashlib.sha256(body).hexdigest()}
        return body + (json.dumps(trailer) + "\n").encode()

    for line, key, value, where in ((1, b'"name"', b'"b"', "line 2"), (1, b'"owner"', b'"second"', "line 2"),
                                    (1, b'"k"', b"2", "line 2"), (0, b'"model_name"', b'"other"', "line 1")):
        edited = twice(line, key, value)
        assert edited.count(key) == data.count(key) + 1
        with pytest.raises(space_io.InvalidInput, match=f"{where}: key {key.decode()[1:-1]!r} is given more than once"):
            space_io.parse_export(edited)


def test_an_old_stores_names_import_as_they_are(factory, ro_factory) -> None:
    """A store of names taken before they were refused — a newline, a bidirectional override (before 2026-11-25), a
    decomposed and a composed 'café' (kept apart by revision 0007) — had its export refused by its own import, all
    or nothing (an upgrade review, 2026-12-07): control characters said no line, and the two 'café' were one name.
    The control characters are written as escapes (kept, a newline forged rows of ``tasks list``)."""
    space = _spec_space(factory)
    ids = [_ready(factory, space, f"t{i}", i + 1) for i in range(4)]
    data = b"".join(space_io.export_lines(ro_factory, _detached(ro_factory, space.id), ids))
    names = iter(["two\nlines", "\u202eevil", "cafe\u0301", "caf\u00e9"])
    old = _resealed(data, lambda line: {**line, "name": next(names)})
    expected = ["two\\u000alines", "\\u202eevil", "cafe\u0301", "caf\u00e9"]
    assert [t["name"] for t in space_io.parse_export(old)[3]] == expected
    with factory.begin() as s:
        for tid in ids:
            repository.delete_task(s, tid)
    space_io.import_space(factory, old)
    with ro_factory() as s:
        stored = s.execute(select(Task.name).where(Task.space_id == space.id).order_by(Task.id)).scalars().all()
    assert stored == expected
    one_form = iter(["caf\u00e9", "t1", "caf\u00e9", "t3"])  # the same name twice: still a duplicate, by its line
    with pytest.raises(space_io.InvalidInput, match="line 4: duplicate task name"):
        space_io.parse_export(_resealed(data, lambda line: {**line, "name": next(one_form)}))
