"""Migrations upgrade and downgrade on SQLite and PostgreSQL, and match the models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

import migrations
from atlas import db, lexicon_repo
from atlas.lexical import TermCounts
from atlas.lexicon_repo import LexicalRecord
from atlas.models import Base
from atlas.template import TaskTemplate
from tests.store_helpers import create_pg_database, drop_pg_database

TABLES = {
    "spaces", "tasks", "sketch_states", "signatures", "baselines", "uploads", "jobs", "job_checkpoints",
    "changes", "atlas_state", "api_keys", "task_routing", "task_lexicon", "job_requests",
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.sqlite'}"
        return
    server = request.getfixturevalue("pg_server")
    url = create_pg_database(server)
    yield url
    drop_pg_database(server, url)


def _tables(url: str) -> set[str]:
    engine = db.make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def _downgrade_drops(url: str, revision: str, table: str, query: str) -> list[Any]:
    """Downgrade ``url`` to ``revision``, which drops ``table``; the first column of ``query`` over what stayed."""
    from sqlalchemy import text

    migrations.downgrade(url, revision)
    assert table not in _tables(url)
    engine = db.make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(query)).scalars().all())
    finally:
        engine.dispose()


def _routing_row_at(url: str, revision: str, columns: str, values: str, params: dict[str, Any]) -> int:
    """A task and its ``task_routing`` row (``columns`` / ``values`` of the INSERT, ``:t`` the task id) stored at
    ``revision``; returns the task id."""
    from sqlalchemy import text

    from atlas import repository
    from atlas.samples import Sample
    from tests.atlas.fixtures import make_space

    migrations.upgrade(url, revision)
    engine = db.make_engine(url, pool_size=1)
    space = make_space(db.session_factory(engine))
    with db.session_factory(engine).begin() as s:
        tid = int(repository.create_task_with_job(s, space.id, "t", "text", {}, [Sample(text="x")])[0].id)
        s.execute(text(f"INSERT INTO task_routing (task_id, {columns}, updated_at) VALUES (:t, {values}, "
                       "CURRENT_TIMESTAMP)"), {"t": tid, **params})
    engine.dispose()
    return tid


def test_upgrade_downgrade_roundtrip(empty_url: str) -> None:
    assert migrations.current_revision(empty_url) is None
    migrations.upgrade(empty_url)
    assert migrations.current_revision(empty_url) == migrations.head_revision()
    assert _tables(empty_url) >= TABLES

    engine = db.make_engine(empty_url, pool_size=1)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"

    migrations.downgrade(empty_url, "base")
    assert migrations.current_revision(empty_url) is None
    assert _tables(empty_url) & TABLES == set()

    migrations.upgrade(empty_url)  # and up again on the same database
    assert _tables(empty_url) >= TABLES


def test_upgrade_is_idempotent(empty_url: str) -> None:
    migrations.upgrade(empty_url)
    migrations.upgrade(empty_url)
    assert migrations.current_revision(empty_url) == migrations.head_revision()


def test_0003_backfills_the_term_counts_of_existing_tasks(empty_url: str) -> None:
    from sqlalchemy import update

    from atlas import repository
    from atlas.models import Job, JobStatus, Task, TaskLexicon
    from atlas.samples import Sample
    from tests.atlas.fixtures import make_space

    migrations.upgrade(empty_url, "0002")  # a store from before the lexical side
    engine = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(engine)
    space = make_space(factory)
    first = [Sample(text="Photosynthesis\u2028in leaves"), Sample(text="light energy")]
    second = [Sample(prompt="Is it green?", completion=" yes")]
    with factory.begin() as s:
        t1, j1 = repository.create_task_with_job(s, space.id, "bio", "text", {}, first)
        t2, j2 = repository.create_task_with_job(s, space.id, "qa", "completion", {}, second)
        t3, _ = repository.create_task_with_job(s, space.id, "pending", "text", {}, first)
        ids = (t1.id, t2.id, t3.id)
        s.execute(update(Job).where(Job.id.in_([j1.id, j2.id])).values(status=JobStatus.SUCCEEDED))
        s.execute(update(Task).where(Task.id.in_(ids[:2])).values(status="ready"))
    engine.dispose()

    migrations.upgrade(empty_url)
    engine = db.make_engine(empty_url, pool_size=1)
    with db.session_factory(engine)() as s:
        records = {r.task_id: LexicalRecord.from_bytes(r.terms) for r in s.query(TaskLexicon)}
    engine.dispose()
    assert set(records) == set(ids[:2])  # ready tasks only
    for tid, texts in ((ids[0], ["Photosynthesis\u2028in leaves", "light energy"]), (ids[1], ["Is it green?"])):
        want, got = TermCounts.from_texts(texts), records[tid]
        assert got.counts.keys.tolist() == want.keys.tolist() and got.counts.counts.tolist() == want.counts.tolist()
        template = TaskTemplate.of_texts(texts)
        assert got.template is not None and got.template.keys.tolist() == template.keys.tolist()
        assert got.template.docs == len(texts)


def test_0004_derives_the_templates_of_bare_records_and_downgrades_them(empty_url: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import update

    from atlas import repository
    from atlas.models import Job, JobStatus, Task, TaskLexicon
    from atlas.samples import Sample
    from tests.atlas.fixtures import make_space

    migrations.upgrade(empty_url, "0003")
    engine = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(engine)
    space = make_space(factory)
    jobs = [[Sample(text=f"The capital of {c} is ___ .") for c in ("France", "Peru", "Chad")],
            [Sample(text="The capital of Laos is ___ ."), Sample(text="Lima is the capital of ___ .")]]
    # an append as 0003's code stored it: without the imported uploads' table (0012), which it did not consult
    monkeypatch.setattr(repository, "held_by_import", lambda *_: False)
    with factory.begin() as s:
        task, j1 = repository.create_task_with_job(s, space.id, "capitals", "text", {}, jobs[0])
        j2 = repository.append_samples(s, task.id, jobs[1])
        s.execute(update(Job).where(Job.id.in_([j1.id, j2.id])).values(status=JobStatus.SUCCEEDED))
        s.execute(update(Task).where(Task.id == task.id).values(status="ready"))
        tid = task.id
        texts = [x.text for job in jobs for x in job]
        lexicon_repo.put_record(s, tid, LexicalRecord(TermCounts.from_texts(texts), None))  # as 0003's code stored it
    engine.dispose()

    def stored() -> LexicalRecord:
        eng = db.make_engine(empty_url, pool_size=1)
        with db.session_factory(eng)() as s:
            blob = s.get(TaskLexicon, tid).terms  # type: ignore[union-attr]
        eng.dispose()
        return LexicalRecord.from_bytes(blob)

    migrations.upgrade(empty_url)
    got = stored()
    want = TaskTemplate.of_texts([x.text for x in jobs[0]]).add([x.text for x in jobs[1]])  # job by job
    assert got.template is not None and got.template.keys.tolist() == want.keys.tolist()
    assert (got.template.docs, got.template.checks, got.template.misses) == (want.docs, want.checks, want.misses)
    assert got.template.misses == 1  # "Lima is the capital of ___ ." lacks "the capital" of every other sample
    assert got.counts.keys.tolist() == TermCounts.from_texts(texts).keys.tolist()
    migrations.downgrade(empty_url, "0003")
    back = stored()
    assert back.template is None and back.counts.keys.tolist() == got.counts.keys.tolist()


def test_0005_re_derives_templates_so_samples_without_terms_count(empty_url: str) -> None:
    """A template stored while term-less samples were skipped is re-derived from the uploads; an imported task
    (no uploads) keeps its record."""
    from sqlalchemy import update

    from atlas import repository
    from atlas.models import Job, JobStatus, Task, TaskLexicon
    from atlas.samples import Sample
    from tests.atlas.fixtures import make_space

    migrations.upgrade(empty_url, "0004")
    engine = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(engine)
    space = make_space(factory)
    framed = [f"Define the word: w{i:02d}" for i in range(60)]
    texts = [*framed, "a + b = c"]
    stale = LexicalRecord(TermCounts.from_texts(texts), TaskTemplate.of_texts(framed))  # as 0004's code stored it
    assert stale.template is not None and stale.template.active
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "define", "text", {}, [Sample(text=t) for t in texts])
        s.execute(update(Job).where(Job.id == job.id).values(status=JobStatus.SUCCEEDED))
        s.execute(update(Task).where(Task.id == task.id).values(status="ready"))
        imported = Task(space_id=space.id, name="imported", mode="text", status="ready", meta={})
        s.add(imported)
        s.flush()
        tid, iid = task.id, imported.id
        lexicon_repo.put_record(s, tid, stale)
        lexicon_repo.put_record(s, iid, stale)
    engine.dispose()

    migrations.upgrade(empty_url)
    eng = db.make_engine(empty_url, pool_size=1)
    with db.session_factory(eng)() as s:
        got = LexicalRecord.from_bytes(s.get(TaskLexicon, tid).terms)  # type: ignore[union-attr]
        kept = LexicalRecord.from_bytes(s.get(TaskLexicon, iid).terms)  # type: ignore[union-attr]
    eng.dispose()
    assert got.template is not None and got.template.keys.size == 0 and not got.template.active
    assert got.template.docs == len(texts)
    assert got.counts.keys.tolist() == stale.counts.keys.tolist()  # the counts are the same
    assert kept.to_bytes() == stale.to_bytes()
    migrations.downgrade(empty_url, "0004")  # nothing to undo; the records stay readable


def test_0007_re_derives_records_under_the_unicode_term_rules_and_stores_names_in_nfc(
        empty_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Chinese task's template stored under ``\\w\\w+`` held a whole clause no prompt produces any more: every
    prompt of the task was answered ``none`` by the template. 0007 re-derives it from the uploads; a stored name in
    NFD is rewritten in NFC unless that name is taken."""
    import re
    import unicodedata

    from sqlalchemy import update

    from atlas import lexical, repository
    from atlas.models import Job, JobStatus, Task, TaskLexicon
    from atlas.samples import Sample
    from tests.atlas.fixtures import make_space

    texts = [f"请回答以下问题：{w}" for w in "猫狗鸟鱼马牛羊猪鸡鸭" * 6]
    with monkeypatch.context() as m:  # the term rule of before
        m.setattr(lexical, "tokens", lambda t: re.findall(r"\w\w+", t.lower()))
        stale = LexicalRecord(TermCounts.from_texts(texts), TaskTemplate.of_texts(texts))
    prompt = TermCounts.from_texts(["请回答以下问题：兔"])
    assert stale.template is not None and stale.template.missing(prompt) > 0  # the bug: its own prompt rejected
    migrations.upgrade(empty_url, "0006")
    engine = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(engine)
    space = make_space(factory)
    nfd, nfc = unicodedata.normalize("NFD", "café"), unicodedata.normalize("NFC", "café")
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "问题", "text", {}, [Sample(text=t) for t in texts])
        s.execute(update(Job).where(Job.id == job.id).values(status=JobStatus.SUCCEEDED))
        s.execute(update(Task).where(Task.id == task.id).values(status="ready"))
        lexicon_repo.put_record(s, task.id, stale)
        named = [repository.create_task_with_job(s, space.id, n, "text", {}, [Sample(text="a b c")])[0].id
                 for n in ("x1", "x2", "x3")]
        for tid, name in zip(named, (nfd, "taken", unicodedata.normalize("NFD", "takené")), strict=True):
            s.execute(update(Task).where(Task.id == tid).values(name=name))  # as stored before NFC names
        s.execute(update(Task).where(Task.id == named[1]).values(name=unicodedata.normalize("NFC", "takené")))
        tid = task.id
    engine.dispose()

    migrations.upgrade(empty_url)
    eng = db.make_engine(empty_url, pool_size=1)
    with db.session_factory(eng)() as s:
        got = LexicalRecord.from_bytes(s.get(TaskLexicon, tid).terms)  # type: ignore[union-attr]
        names = [s.get(Task, i).name for i in named]  # type: ignore[union-attr]
    eng.dispose()
    assert got.template is not None and got.template.active and got.template.missing(prompt) == 0
    # NFD café rewritten; the NFD twin of a name already taken in NFC stays as it was
    assert names == [nfc, unicodedata.normalize("NFC", "takené"), unicodedata.normalize("NFD", "takené")]
    migrations.downgrade(empty_url, "0006")


def test_0006_backfills_each_prompt_side_states_digest(empty_url: str) -> None:
    """The route path reads a completion task's prompt-side digest, not its blob: 0006 stores the digest of the
    blobs already there (a state blob ends with its BLAKE2b digest), and a later write keeps it current."""
    import numpy as np
    from sqlalchemy import text

    from atlas import repository, routing_repo
    from atlas.models import TaskRouting
    from atlas.routing import Calibration
    from atlas.samples import Sample
    from fishersketch import SketchSpec, SketchState
    from tests.atlas.fixtures import make_space

    spec = SketchSpec(d=8, K=16, m=32, seed=0)
    rng = np.random.default_rng(0)
    blob = SketchState(spec, rng.standard_normal((2, 3, 32)), rng.random((2, 3)) + 1, np.array([3, 4]),
                       np.array([1, 2])).to_bytes()
    migrations.upgrade(empty_url, "0005")
    engine = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(engine)
    space = make_space(factory)
    with factory.begin() as s:
        pair = [Sample(prompt="p", completion="c")]
        ids = [repository.create_task_with_job(s, space.id, n, "completion", {}, pair)[0].id for n in ("a", "b")]
        for tid, state in zip(ids, (blob, None), strict=True):  # as 0005's code stored them
            s.execute(text("INSERT INTO task_routing (task_id, version, prompt_state, cal_scores, template_test, "
                           "updated_at) VALUES (:t, 1, :b, '[]', :tt, CURRENT_TIMESTAMP)"),
                      {"t": tid, "b": state, "tt": True})
    engine.dispose()

    migrations.upgrade(empty_url)
    eng = db.make_engine(empty_url, pool_size=1)
    f = db.session_factory(eng)
    with f() as s:
        routes = routing_repo.get_task_routes(s, ids)
    assert routes[ids[0]].prompt_digest == blob[-32:] and routes[ids[1]].prompt_digest is None
    with f.begin() as s:
        routing_repo.store_routing(s, ids[1], prompt_state=blob[::-1], calibration=Calibration([], None, None, 0.05))
    with f() as s:
        row = s.get(TaskRouting, ids[1])
        assert row is not None and row.prompt_digest == blob[::-1][-32:]
    eng.dispose()
    migrations.downgrade(empty_url, "0005")


def test_0008_adds_the_novelty_switch_on_for_existing_rows_and_drops_it_on_downgrade(empty_url: str) -> None:
    """0008 adds ``task_routing.novelty_test``: a row stored before it reads true (the test on, as it was), the
    other columns survive SQLite's batch rebuild both ways, and the downgrade drops the switch."""
    from sqlalchemy import text

    from atlas import routing_repo

    tid = _routing_row_at(empty_url, "0007", "version, cal_scores, threshold_override, template_test",
                          "3, '[0.25]', 0.4, :tt", {"tt": False})

    def columns() -> set[str]:
        eng = db.make_engine(empty_url, pool_size=1)
        try:
            with eng.connect() as conn:
                return {c["name"] for c in inspect(conn).get_columns("task_routing")}
        finally:
            eng.dispose()

    def route() -> Any:
        eng = db.make_engine(empty_url, pool_size=1)
        try:
            with db.session_factory(eng)() as s:
                return routing_repo.get_task_routes(s, [tid])[tid]
        finally:
            eng.dispose()

    assert "novelty_test" not in columns()
    migrations.upgrade(empty_url)
    got = route()
    assert got.novelty_test is True and got.template_test is False and got.threshold == 0.4 and got.version == 3
    eng = db.make_engine(empty_url, pool_size=1)
    with db.session_factory(eng).begin() as s:
        routing_repo.set_novelty_test(s, tid, False)
    eng.dispose()
    assert route().novelty_test is False
    migrations.downgrade(empty_url, "0007")
    assert "novelty_test" not in columns() and {"template_test", "threshold_override"} <= columns()
    eng = db.make_engine(empty_url, pool_size=1)
    with eng.connect() as conn:
        assert conn.execute(text("SELECT threshold_override, template_test FROM task_routing")).one() == (0.4, False)
    eng.dispose()
    migrations.upgrade(empty_url)
    assert route().novelty_test is True  # the downgrade dropped the switch: on again, as before 0008


def test_0009_adds_the_held_out_views_null_for_existing_rows_and_drops_them_on_downgrade(empty_url: str) -> None:
    """0009 adds ``task_routing.cal_views``: a row stored before it has none (every prompt judged on whole samples,
    as before), a job's views are stored and read back as :class:`LengthViews`, and the downgrade drops them while
    the other columns survive SQLite's batch rebuild."""
    from sqlalchemy import text

    from atlas import routing_repo
    from atlas.route_calibration import calibrate

    tid = _routing_row_at(empty_url, "0008", "version, cal_scores, threshold_auto, novelty_test",
                          "2, '[0.25, 0.3, 0.35, 0.4, 0.45]', 0.2, :nt", {"nt": False})

    def session_do(fn: Any) -> Any:
        eng = db.make_engine(empty_url, pool_size=1)
        try:
            with db.session_factory(eng).begin() as s:
                return fn(s)
        finally:
            eng.dispose()

    migrations.upgrade(empty_url)
    before = session_do(lambda s: routing_repo.get_task_routes(s, [tid])[tid])
    assert before.length_views is None and before.threshold == 0.2 and before.novelty_test is False
    views = [[40, 0.4, True]] * 6 + [[10, 0.1, False]] * 6
    session_do(lambda s: routing_repo.store_routing(s, tid, prompt_state=None,
                                                    calibration=calibrate([0.4] * 6), views=views))
    after = session_do(lambda s: routing_repo.get_task_routes(s, [tid])[tid])
    assert after.length_views is not None and after.length_views.short(10) and not after.length_views.short(40)
    migrations.downgrade(empty_url, "0008")
    eng = db.make_engine(empty_url, pool_size=1)
    with eng.connect() as conn:
        assert "cal_views" not in {c["name"] for c in inspect(conn).get_columns("task_routing")}
        assert conn.execute(text("SELECT novelty_test, version FROM task_routing")).one() == (False, 3)
    eng.dispose()


def test_0010_adds_the_request_digests_none_for_existing_jobs_and_drops_them_on_downgrade(empty_url: str) -> None:
    """0010 adds ``job_requests``: a keyed job stored before it has no row (replayed as before, without the
    metadata), a new keyed job gets one, deleted with its job, and the downgrade drops the table, keys kept."""
    from sqlalchemy import select, text

    from atlas import job_store, repository
    from atlas.models import JobRequest
    from atlas.samples import Sample
    from tests.atlas.fixtures import make_space

    migrations.upgrade(empty_url, "0009")
    eng = db.make_engine(empty_url, pool_size=1)
    space = make_space(db.session_factory(eng))
    with db.session_factory(eng).begin() as s:  # a keyed job of revision 0009's code: the key on the job alone
        old, old_job = repository.create_task_with_job(s, space.id, "old", "text", {"a": 1}, [Sample(text="x")])
        old_id = int(old.id)
        s.execute(text("UPDATE jobs SET idempotency_key = 'old' WHERE id = :j"), {"j": old_job.id})
    eng.dispose()
    migrations.upgrade(empty_url)
    eng = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(eng)
    with factory.begin() as s:  # no digest: replayed on name, mode and samples, whatever the metadata
        again, _ = repository.create_task_with_job(s, space.id, "old", "text", {"a": 2}, [Sample(text="x")],
                                                   idempotency_key="old")
        assert again.id == old_id
        _, job = repository.create_task_with_job(s, space.id, "new", "text", {"a": 1}, [Sample(text="x")],
                                                 idempotency_key="new")
        job_id = int(job.id)
    with factory() as s:
        assert len(s.execute(select(JobRequest)).scalars().all()) == 1
        assert s.get(JobRequest, job_id) is not None
    with factory.begin() as s:
        job_store.delete_job(s, job_id)
    with factory() as s:
        assert s.get(JobRequest, job_id) is None  # deleted with its job
    eng.dispose()
    assert _downgrade_drops(empty_url, "0009", "job_requests", "SELECT idempotency_key FROM jobs") == ["old"]


def test_0012_adds_the_imported_uploads_none_for_existing_tasks_and_drops_them_on_downgrade(empty_url: str) -> None:
    """0012 adds ``task_uploads``: a task stored before it has no row (its jobs say what it holds), an imported
    task's addresses are stored and deleted with it, and the downgrade drops the table, tasks kept."""
    from sqlalchemy import select

    from atlas import repository, upload_repository
    from atlas.models import TaskUpload
    from atlas.samples import Sample
    from tests.atlas.fixtures import make_space

    migrations.upgrade(empty_url, "0011")
    eng = db.make_engine(empty_url, pool_size=1)
    space = make_space(db.session_factory(eng))
    with db.session_factory(eng).begin() as s:
        old, _ = repository.create_task_with_job(s, space.id, "old", "text", {}, [Sample(text="x y")])
        old_id = int(old.id)
    eng.dispose()
    migrations.upgrade(empty_url)
    eng = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(eng)
    with factory.begin() as s:
        assert upload_repository.held_uploads(s, [old_id]) == {}  # its job has not succeeded: nothing held yet
        upload_repository.record_held_uploads(s, old_id, ["ab" * 32, "cd" * 32, "ab" * 32])
    with factory() as s:
        assert upload_repository.held_uploads(s, [old_id]) == {old_id: ["ab" * 32, "cd" * 32]}
        assert upload_repository.held_by_import(s, old_id, "cd" * 32)
    with factory.begin() as s:
        repository.delete_task(s, old_id)
    with factory() as s:
        assert s.execute(select(TaskUpload)).scalars().all() == []  # deleted with its task
    with factory.begin() as s:
        kept, _ = repository.create_task_with_job(s, space.id, "kept", "text", {}, [Sample(text="x y")])
        upload_repository.record_held_uploads(s, int(kept.id), ["ef" * 32])
    eng.dispose()
    assert _downgrade_drops(empty_url, "0011", "task_uploads", "SELECT name FROM tasks") == ["kept"]


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_offline_sql_scripts_render_and_match_the_models(dialect: str, tmp_path: Path, capsys) -> None:
    """``alembic upgrade head --sql`` / ``downgrade head:base --sql`` (env.py's offline mode) render on both
    databases: the data migrations (0003-0005) skip their backfills there instead of crashing on the mock
    connection; the SQLite script builds the models' schema."""
    import sqlite3

    from alembic import command

    url = (f"sqlite:///{tmp_path / 'offline.sqlite'}" if dialect == "sqlite"
           else "postgresql+psycopg://nobody@127.0.0.1:1/offline")
    cfg = migrations.alembic_config(url)
    capsys.readouterr()
    command.upgrade(cfg, "head", sql=True)
    script = capsys.readouterr().out
    assert "CREATE TABLE task_lexicon" in script and "template_test" in script and "novelty_test" in script
    assert "CREATE TABLE job_requests" in script and "CREATE TABLE task_uploads" in script
    command.downgrade(cfg, "head:base", sql=True)
    assert "DROP TABLE tasks" in capsys.readouterr().out
    if dialect == "sqlite":
        built = tmp_path / "built.sqlite"
        with sqlite3.connect(built) as conn:
            conn.executescript(script)
        engine = db.make_engine(f"sqlite:///{built}", pool_size=1)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        engine.dispose()
        assert diff == [], f"the offline script and the models disagree: {diff}"


def test_a_failed_upgrade_is_one_line_and_keeps_its_traceback_at_debug(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Users read one line; the original error (an error in a migration's own SQL, say) stays in the debug log."""
    import logging

    from atlas.errors import DatabaseUnavailable

    notdb = tmp_path / "atlas.sqlite"
    notdb.write_bytes(b"this is not an SQLite file" * 100)
    with caplog.at_level(logging.DEBUG, logger="migrations"), pytest.raises(DatabaseUnavailable) as info:
        migrations.upgrade(f"sqlite:///{notdb}")
    assert "\n" not in str(info.value) and info.value.__cause__ is None
    kept = [r for r in caplog.records if r.name == "migrations" and r.exc_info is not None]
    assert kept and "not a database" in str(kept[0].exc_info[1]), caplog.records


def test_0013_hides_the_secret_start_of_bootstrap_keys_stored_before(empty_url: str) -> None:
    """A bootstrap key stored before 2026-12-07 listed its plaintext's first 10 characters until a start with the
    bootstrap setting rewrote it; an operator who set it for the first start alone kept it listed (an upgrade review,
    2026-12-07). 0013 rewrites it from the stored hash; a generated key's prefix and other keys stay."""
    from sqlalchemy import text

    from atlas import apikeys

    migrations.upgrade(empty_url, "0012")
    passphrase = "correct horse battery staple, twice over"
    generated = "fa_" + "A" * 43
    rows = [("bootstrap-admin", passphrase[:10], apikeys.hash_key(passphrase)),
            ("bootstrap-admin", generated[:10], apikeys.hash_key(generated)),
            ("ci", "fa_BBBBBBB", apikeys.hash_key("fa_" + "B" * 43))]
    eng = db.make_engine(empty_url, pool_size=1)
    with eng.begin() as conn:
        for name, prefix, digest in rows:
            conn.execute(text("INSERT INTO api_keys (name, prefix, key_hash, scopes, created_at) "
                              "VALUES (:n, :p, :h, '[\"admin\"]', CURRENT_TIMESTAMP)"),
                         {"n": name, "p": prefix, "h": digest})
    eng.dispose()
    migrations.upgrade(empty_url)
    eng = db.make_engine(empty_url, pool_size=1)
    with eng.connect() as conn:
        prefixes = [r[0] for r in conn.execute(text("SELECT prefix FROM api_keys ORDER BY id"))]
    eng.dispose()
    assert prefixes == [apikeys.bootstrap_prefix(passphrase), generated[:10], "fa_BBBBBBB"]
    assert prefixes[0].startswith("boot:") and passphrase[:4] not in prefixes[0]
