"""Migration 0011 on SQLite and PostgreSQL: a completion task's lexical record gains its per-term sample counts from
its stored uploads; a text task's and an imported one's stay as they were; the downgrade writes the version-1
format back (the previous code reads it)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

import migrations
from atlas import db, lexicon_repo, repository
from atlas.lexical_record import LexicalDelta, LexicalRecord
from atlas.models import Job, JobStatus, Task, TaskLexicon
from atlas.samples import Sample
from tests.atlas.fixtures import make_space
from tests.atlas.test_migrations import empty_url  # noqa: F401

PROMPTS = ["The river floods. Question: is it wet? Answer:", "The court rules. Question: is it law? Answer:",
           "The film ends. Question: is it over? Answer:"]


def _ready(s: Any, space_id: int, name: str, mode: str, samples: list[Sample]) -> int:
    """A ready task whose create job succeeded, its record as revision 0010's code stored it (no sample counts)."""
    task, job = repository.create_task_with_job(s, space_id, name, mode, {}, samples)
    s.execute(update(Job).where(Job.id == job.id).values(status=JobStatus.SUCCEEDED))
    s.execute(update(Task).where(Task.id == task.id).values(status="ready"))
    full = LexicalRecord.empty().add(LexicalDelta.of_samples(samples, mode))
    lexicon_repo.put_record(s, task.id, LexicalRecord(full.counts, full.template))
    return int(task.id)


def test_0011_counts_the_samples_of_completion_tasks_and_downgrades(empty_url: str) -> None:  # noqa: F811
    migrations.upgrade(empty_url, "0010")
    engine = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(engine)
    space = make_space(factory)
    with factory.begin() as s:
        pairs = _ready(s, space.id, "qa", "completion", [Sample(prompt=p, completion=" yes") for p in PROMPTS])
        text = _ready(s, space.id, "prose", "text", [Sample(text=p) for p in PROMPTS])
        # a task without the uploads of its record (an imported one has no job): kept as it came
        imported = _ready(s, space.id, "imported", "completion", [Sample(prompt=p, completion=" no") for p in PROMPTS])
        s.execute(update(Job).where(Job.task_id == imported).values(status=JobStatus.FAILED))
    before = {tid: _blob(factory, tid) for tid in (pairs, text, imported)}
    engine.dispose()

    migrations.upgrade(empty_url)
    engine = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(engine)
    got = LexicalRecord.from_bytes(_blob(factory, pairs))
    assert got.sample_counts is not None
    held = dict(zip(got.sample_counts.keys.tolist(), got.sample_counts.counts.tolist(), strict=True))
    assert sorted(set(held.values())) == [1, 3]  # the frame in every prompt, each topic in one
    assert _blob(factory, text) == before[text]  # a text task's record is untouched
    assert _blob(factory, imported) == before[imported]
    engine.dispose()

    migrations.downgrade(empty_url, "0010")
    engine = db.make_engine(empty_url, pool_size=1)
    factory = db.session_factory(engine)
    assert all(_blob(factory, tid) == blob for tid, blob in before.items())
    engine.dispose()


def _blob(factory: Any, task_id: int) -> bytes:
    with factory() as s:
        row = s.get(TaskLexicon, task_id)
        assert row is not None
        return bytes(row.terms)
