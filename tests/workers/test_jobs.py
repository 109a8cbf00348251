"""run_job against the real store (SQLite and PostgreSQL) and a tiny real model: what a create or an append job
stores, and how a failed job is recorded.

The other job tests: resuming after a dead or stopped worker (``test_jobs_resume``), cancelling (``test_jobs_cancel``),
the in-process runner (``test_jobs_runner``); their fixtures (``settings``, ``ctx``, ``space_id``) are in
``conftest.py``, their helpers in :mod:`tests.workers.job_helpers`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select, update

from atlas import changes, job_store, repository
from atlas.index import IndexManager
from atlas.models import Change, Job, utcnow
from atlas.samples import Sample
from tests.workers.job_helpers import M, create, make_samples, reference, stored_state
from workers.extraction import Extractor
from workers.inprocess import InProcessRunner
from workers.jobs import run_job
from workers.model_loading import LoadedModel
from workers.worker_context import WorkerContext


def test_create_job_end_to_end(ctx: WorkerContext, space_id: int) -> None:
    from fishersketch import SketchState

    samples = make_samples(11)
    task_id, job_id = create(ctx, space_id, "qa", samples)
    assert run_job(job_id, ctx) == "succeeded"
    assert run_job(job_id, ctx) == "skipped"  # idempotent: a duplicate delivery does nothing
    ref = reference(ctx, space_id, samples)
    blob = stored_state(ctx, task_id)
    assert blob == ref.state.to_bytes()
    with ctx.factory() as s:
        task = repository.get_task(s, task_id)
        assert (task.status, task.n_samples, task.n_tokens) == ("ready", ref.state.n_samples, ref.state.n_tokens)
        _ids, vecs = repository.get_signatures(s, task_ids=[task_id])
        np.testing.assert_array_equal(vecs[0], SketchState.from_bytes(blob).signature())
        job = job_store.get_job(s, job_id)
        assert (job.status, job.attempts, job.error) == ("succeeded", 1, None)
        assert job.progress["samples_done"] == job.progress["samples_total"] == 11
        assert job.result["samples_used"] == 11 and job.result["change_seq"] == changes.last_seq(s)
        assert job_store.get_checkpoint(s, job_id) is None
        assert repository.get_baselines(s, [task_id])[task_id] == ref.baselines.to_bytes()
        log = s.execute(select(Change.task_id, Change.op)).all()
        assert [tuple(r) for r in log] == [(task_id, "upsert")]


def test_append_merges_and_updates_index(ctx: WorkerContext, space_id: int, ro_factory, tmp_path: Path) -> None:
    index = IndexManager(ro_factory, tmp_path / "index")
    index.open()
    ctx.index = index
    first, more = make_samples(6, seed=1), make_samples(5, seed=2)
    task_id, job_id = create(ctx, space_id, "grow", first)
    assert run_job(job_id, ctx) == "succeeded"
    old_sig = index.search(space_id, np.ones(M, np.float32) / np.sqrt(M), 1)
    with ctx.factory.begin() as s:
        append = repository.append_samples(s, task_id, more)
    assert run_job(append.id, ctx) == "succeeded"
    expected = reference(ctx, space_id, first).state.merge(reference(ctx, space_id, more).state)
    assert stored_state(ctx, task_id) == expected.to_bytes()
    with ctx.factory() as s:
        task = repository.get_task(s, task_id)
        assert (task.n_samples, task.version) == (11, 2)
        _, vec = repository.get_signatures(s, task_ids=[task_id])
    np.testing.assert_allclose(vec[0], expected.signature())
    scores, ids = index.search(space_id, expected.signature(), 1)  # caught up right after the job
    assert ids[0, 0] == task_id and scores[0, 0] == pytest.approx(1.0, abs=1e-5)
    assert not np.allclose(old_sig[0], scores)
    assert index.watermark(space_id) == 2


def test_an_append_with_nothing_usable_fails_and_leaves_the_task_as_it_was(ctx: WorkerContext, space_id: int) -> None:
    """An append whose samples were all skipped ended 'succeeded' (a note in its result), so the CLI and the
    dashboard reported data added where none was; ``add`` of the same file fails. It fails alike now, with the
    reasons, and the task keeps its state and version."""
    task_id, job_id = create(ctx, space_id, "kept", make_samples(4, seed=3))
    assert run_job(job_id, ctx) == "succeeded"
    before = stored_state(ctx, task_id)
    with ctx.factory.begin() as s:
        append = repository.append_samples(s, task_id, [Sample(text="a"), Sample(text="")])
    assert run_job(append.id, ctx) == "failed"
    with ctx.factory() as s:
        job = job_store.get_job(s, append.id)
        task = repository.get_task(s, task_id)
        assert "no usable tokens" in job.error and (task.status, task.version) == ("ready", 1)
    assert stored_state(ctx, task_id) == before


def test_jobs_store_and_merge_the_tasks_term_counts_and_template(ctx: WorkerContext, space_id: int) -> None:
    from atlas import lexicon_repo
    from atlas.lexical import TermCounts, term_hashes
    from atlas.models import TaskLexicon
    from atlas.template import TaskTemplate

    first = [Sample(prompt="Is the sky blue?\u2028Answer:", completion=" yes"),
             Sample(prompt="Q: 2+2?", completion=" 4")]
    more = [Sample(prompt="Is the sky green?", completion=" no")]
    task_id, job_id = create(ctx, space_id, "terms", first, mode="completion")
    assert run_job(job_id, ctx) == "succeeded"
    with ctx.factory.begin() as s:
        append = repository.append_samples(s, task_id, more)
    assert run_job(append.id, ctx) == "succeeded"
    with ctx.factory() as s:
        row = s.get(TaskLexicon, task_id)
        assert row is not None
        record = lexicon_repo.LexicalRecord.from_bytes(row.terms)
        stored = record.counts
        read = lexicon_repo.get_task_lexicon(s, [task_id])[task_id]
        terms = read.terms
    want = TermCounts.from_texts([x.prompt for x in first + more])  # completion mode: the prompts only
    # the template of the prompts, job by job: "Q: 2+2?" has no term (no word of two characters) and counts,
    # so no term is in every prompt — a prompt like it must not be answered "none" for lacking one; it misses
    # the first prompt's terms (1 miss in 3 checks)
    template = TaskTemplate.of_texts([x.prompt for x in first]).add([x.prompt for x in more])
    assert record.template is not None and read.template is not None
    assert record.template.keys.tolist() == read.template.keys.tolist() == template.keys.tolist() == []
    assert (record.template.docs, record.template.checks, record.template.misses) == (3, 3, 1)
    assert not record.template.active
    assert stored.keys.tolist() == want.keys.tolist() and stored.counts.tolist() == want.counts.tolist()
    assert row.n_terms == len(want)
    assert int(term_hashes("yes")[0]) not in set(stored.keys.tolist())  # no answer terms
    assert terms.keys.tolist() == want.keys.tolist()
    assert float(np.linalg.norm(terms.weights)) == pytest.approx(1.0)


def test_failures_are_recorded(ctx: WorkerContext, space_id: int, gpt2_lm: LoadedModel) -> None:
    # Nothing usable: every sample is too short.
    task_id, job_id = create(ctx, space_id, "empty", [Sample(text="a"), Sample(text="")])
    assert run_job(job_id, ctx) == "failed"
    with ctx.factory() as s:
        job = job_store.get_job(s, job_id)
        assert "no usable tokens" in job.error
        assert repository.get_task(s, task_id).status == "failed"
    with ctx.factory.begin() as s:  # a failed task without samples can be deleted
        repository.delete_task(s, task_id)

    # A job whose space needs another model is not this worker's: left queued for a worker with that model, and
    # not swept here (an embedded service restarted on another model failed the first model's queued jobs).
    with ctx.factory.begin() as s:
        other = repository.get_or_create_space(
            s, model_fingerprint="0" * 20, spec_fingerprint="x", model_name="other-model", d=1, K=1, m=M, seed=0,
            spec={},
        )
        _task, job = repository.create_task_with_job(s, other.id, "foreign", "text", {}, make_samples(2))
    assert ctx.lm is not None
    assert run_job(job.id, ctx) == "skipped"
    runner = InProcessRunner(ctx, threads=1)
    assert runner.sweep(include_recent=True) == 0
    with ctx.factory() as s:
        assert job_store.get_job(s, job.id).status == "queued"
        assert job_store.recoverable_jobs(s, stale_after_s=60, model_fingerprint="0" * 20) == [job.id]
    # its worker claimed it and died: the sweep puts it back to queued (it stayed running for good, uncancellable)
    with ctx.factory.begin() as s:
        dead = job_store.claim_job(s, job.id, worker="other-model-worker", stale_after_s=60)
        s.execute(update(Job).where(Job.id == job.id).values(heartbeat_at=utcnow() - dt.timedelta(hours=1)))
    assert dead is not None and runner.sweep() == 0
    with ctx.factory.begin() as s:
        assert job_store.get_job(s, job.id).status == "queued"
        assert job_store.request_cancel(s, job.id).status == "cancelled"

    # Cancelled before it ran; a task deleted while queued.
    _, job_c = create(ctx, space_id, "cancel-me", make_samples(3))
    with ctx.factory.begin() as s:
        job_store.request_cancel(s, job_c)
    assert run_job(job_c, ctx) == "skipped"
    with ctx.factory() as s:
        assert job_store.get_job(s, job_c).status == "cancelled"


def test_an_unexpected_errors_secrets_are_not_stored(ctx: WorkerContext, space_id: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A job stored an unexpected exception's text as is, and ``GET /v1/jobs/{id}`` (a plain body, not an error
    the renderer redacts) showed whatever it carried: a database URL's password, a key."""

    def leak(self: Extractor, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("could not reach postgresql://atlas:hunter2@db:5432/atlas with api_key=fa_live_0123456789")

    monkeypatch.setattr(Extractor, "extract", leak)
    _task, job_id = create(ctx, space_id, "leaky", make_samples(2))
    assert run_job(job_id, ctx) == "failed"
    with ctx.factory() as s:
        error = job_store.get_job(s, job_id).error
    assert error.startswith("RuntimeError: could not reach postgresql://atlas:***@db:5432/atlas"), error
    assert "hunter2" not in error and "0123456789" not in error


def test_a_jobs_log_lines_name_its_task(ctx: WorkerContext, space_id: int, caplog: pytest.LogCaptureFixture) -> None:
    """"job 6: claimed by …" and "job 6: succeeded" did not name the task, so an operator could not find a task's
    jobs in the log (an operations review, 2026-12-07)."""
    import logging

    task_id, job_id = create(ctx, space_id, "logged", make_samples(6, seed=41))
    with caplog.at_level(logging.INFO, logger="workers.jobs"):
        assert run_job(job_id, ctx) == "succeeded"
    said = [r.getMessage() for r in caplog.records if r.name == "workers.jobs"]
    assert any(m.startswith(f"job {job_id} (create of task {task_id}): claimed by ") for m in said), said
    assert any(m.startswith(f"job {job_id} (task {task_id}): succeeded (") for m in said), said


def test_a_job_whose_worker_died_every_time_fails_for_good(ctx: WorkerContext, space_id: int) -> None:
    """The poison-job rule: a job claimed ``max_attempts`` times without finishing (its worker killed each time)
    fails at the next claim, with its task, instead of killing every worker in turn."""
    task_id, job_id = create(ctx, space_id, "poison", make_samples(3))
    assert ctx.max_attempts is not None
    for i in range(ctx.max_attempts):  # claimed, then its worker died: the heartbeat goes stale
        with ctx.factory.begin() as s:
            assert job_store.claim_job(s, job_id, worker=f"dead-{i}", stale_after_s=0) is not None
            s.execute(update(Job).where(Job.id == job_id).values(
                heartbeat_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)))
    assert run_job(job_id, ctx) == "failed"
    with ctx.factory() as s:
        job = job_store.get_job(s, job_id)
        assert job.status == "failed" and job.attempts == ctx.max_attempts + 1
        assert job.error == (f"gave up after {ctx.max_attempts} attempts; the worker stopped each time without "
                             "finishing (out of memory or killed?)")
        assert repository.get_task(s, task_id).status == "failed"  # a create job's task keeps no signature
