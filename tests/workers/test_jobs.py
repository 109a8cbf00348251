"""run_job and the in-process runner against the real store (SQLite and PostgreSQL) and a tiny real model."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from atlas import changes, job_store, repository
from atlas.errors import QueueFull
from atlas.index import IndexManager
from atlas.models import Change, Job, utcnow
from atlas.queue import JobQueue, ensure_capacity
from atlas.samples import Sample
from atlas.settings import Settings
from workers.extraction import Extractor
from workers.inprocess import InProcessRunner
from workers.jobs import WorkerContext, ensure_space, run_job
from workers.model_loading import LoadedModel

M = 256
EVERY = 4


def make_samples(n: int, seed: int = 0) -> list[Sample]:
    words = ["fox", "dog", "tasks", "alignment", "vector", "database", "signature", "blue", "sky"]
    rng = np.random.default_rng(seed)
    return [Sample(text=" ".join(rng.choice(words, size=int(rng.integers(4, 12))))) for _ in range(n)]


@pytest.fixture
def settings(db_url: str, gpt2_dir: Path, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path, database_url=db_url, model=str(gpt2_dir), device="cpu", sketch_dim=M,
        checkpoint_every=EVERY, job_stale_after_s=1.0, max_tokens_per_sample=64,
    )


@pytest.fixture
def ctx(settings: Settings, factory: sessionmaker[Session], gpt2_lm: LoadedModel) -> WorkerContext:
    return WorkerContext(settings=settings, factory=factory, lm=gpt2_lm)


@pytest.fixture
def space_id(ctx: WorkerContext) -> int:
    with ctx.factory.begin() as s:
        return ensure_space(s, ctx.lm, ctx.settings).id


def reference(ctx: WorkerContext, space_id: int, samples: list[Sample], mode: str = "text"):
    """State of an uninterrupted in-memory extraction with the job's settings."""
    with ctx.factory() as s:
        space = repository.get_space(s, space_id)
        s.expunge(space)
    extractor: Extractor = ctx.extractor_for(space)
    return extractor.extract(samples, mode=mode, checkpoint_every=EVERY)


def create(ctx: WorkerContext, space_id: int, name: str, samples: list[Sample], mode: str = "text") -> tuple[int, int]:
    with ctx.factory.begin() as s:
        task, job = repository.create_task_with_job(s, space_id, name, mode, {"k": 1}, samples)
    return task.id, job.id


def stored_state(ctx: WorkerContext, task_id: int) -> bytes:
    with ctx.factory() as s:
        return repository.get_state_blob(s, task_id)


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


def test_resume_after_worker_death_equals_uninterrupted(ctx: WorkerContext, space_id: int) -> None:
    """A worker that died after a checkpoint: the next claim resumes and ends bit-identical."""
    samples = make_samples(14, seed=3)
    task_id, job_id = create(ctx, space_id, "resume", samples)
    # What the dead worker did before dying: claim, sketch the first window, checkpoint it.
    with ctx.factory.begin() as s:
        dead = job_store.claim_job(s, job_id, worker="dead", stale_after_s=1.0)
    with ctx.factory() as s:
        space = repository.get_space(s, space_id)
        s.expunge(space)
    partial = ctx.extractor_for(space).extract(samples[:EVERY * 2], checkpoint_every=EVERY)
    with ctx.factory.begin() as s:
        assert job_store.save_checkpoint(s, job_id, dead.lease, samples_done=partial.samples_done,
                                         tokens=partial.tokens, state=partial.state.to_bytes(),
                                         baselines=partial.baselines.to_bytes(),
                                         extra={"counts": partial.counts().to_dict()})
    assert run_job(job_id, ctx) == "skipped"  # its heartbeat is still fresh
    with ctx.factory.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow() - dt.timedelta(seconds=5)))
    assert run_job(job_id, ctx) == "succeeded"
    assert stored_state(ctx, task_id) == reference(ctx, space_id, samples).state.to_bytes()
    whole = reference(ctx, space_id, samples)
    with ctx.factory() as s:
        job = job_store.get_job(s, job_id)
        # the counts go on from the checkpoint's (they restarted at 0: progress went back, the result undercounted)
        assert job.attempts == 2 and job.result["samples_used"] == whole.samples_used == len(samples)
        assert job.result["tokens"] == job.progress["tokens"] == whole.tokens
        assert repository.get_task(s, task_id).n_tokens == whole.tokens
        assert job.result["tokens_streamed"] == whole.tokens_streamed
    with ctx.factory.begin() as s:  # the dead worker's lease can no longer write anything
        assert not job_store.save_checkpoint(s, job_id, dead.lease, samples_done=1, tokens=1, state=b"",
                                             baselines=None)


def test_concurrent_duplicate_runs_merge_once(ctx: WorkerContext, space_id: int) -> None:
    base, extra = make_samples(5, seed=4), make_samples(7, seed=5)
    task_id, job_id = create(ctx, space_id, "dup", base)
    run_job(job_id, ctx)
    with ctx.factory.begin() as s:
        append_id = repository.append_samples(s, task_id, extra).id
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda: outcomes.append(run_job(append_id, ctx))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["skipped", "skipped", "succeeded"]
    expected = reference(ctx, space_id, base).state.merge(reference(ctx, space_id, extra).state)
    assert stored_state(ctx, task_id) == expected.to_bytes()


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


def _while_running(ctx: WorkerContext, job_id: int, action: Any) -> str:
    """Run the job in a thread, commit ``action(session)`` once it is running, and return the job's outcome."""
    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(run_job(job_id, ctx)))
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with ctx.factory() as s:
            if job_store.get_job(s, job_id).status == "running":
                break
        time.sleep(0.05)
    with ctx.factory.begin() as s:
        action(s)
    t.join(timeout=60)
    return result[0] if result else "still running"


def test_task_deleted_while_its_job_runs_leaves_no_job_and_no_samples(ctx: WorkerContext, space_id: int) -> None:
    """The delete asks the running job to cancel; when it stops, its row goes with the task's other jobs and its
    samples with it (the cancelled row kept the upload referenced, so a deleted task's samples stayed)."""
    from sqlalchemy import func, select

    from atlas.models import Job, Upload

    samples = make_samples(400, seed=16)
    task_id, job_id = create(ctx, space_id, "deleted-while-running", samples)
    with ctx.factory() as s:
        upload_id = job_store.get_job(s, job_id).upload_id
    assert _while_running(ctx, job_id, lambda s: repository.delete_task(s, task_id)) == "cancelled"
    with ctx.factory() as s:
        assert s.get(Job, job_id) is None
        assert s.get(Upload, upload_id) is None
        assert s.execute(select(func.count()).select_from(Job).where(Job.upload_id == upload_id)).scalar_one() == 0


def test_routing_phase_reports_progress_and_honours_cancel(ctx: WorkerContext, space_id: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A completion job's prompt-side pass is its ``routing`` phase: the final progress counts its prompts; a cancel
    asked during it stops the pass at the next window (it ran to the end, then wrote nothing)."""
    from workers import calibration
    from workers import jobs as jobs_module
    from workers.job_progress import progress_view
    from workers.prompt_batcher import PromptBatcher

    monkeypatch.setattr(calibration, "PROMPT_WINDOW", 4)
    pairs = [Sample(prompt=s.text, completion=" yes") for s in make_samples(20, seed=30)]
    task_id, job_id = create(ctx, space_id, "pairs", pairs, mode="completion")
    assert run_job(job_id, ctx) == "succeeded"
    with ctx.factory() as s:
        view = progress_view(job_store.get_job(s, job_id).progress)
    assert (view["phase"], view["routing_done"], view["routing_total"]) == ("routing", 20, 20)
    assert view["samples_done"] == view["samples_total"] == 20

    windows: list[int] = []
    real, beats = PromptBatcher.sketch_prepared, []
    enter = jobs_module._Heartbeat.__enter__
    monkeypatch.setattr(jobs_module._Heartbeat, "__enter__", lambda self: beats.append(self) or enter(self))

    def slow(self: PromptBatcher, prepared: Any) -> Any:
        windows.append(len(prepared))
        if len(windows) == 1:  # cancel during the first window; wait until the job's heartbeat has seen it
            with ctx.factory.begin() as s:
                job_store.request_cancel(s, job_id2)
            assert beats[-1].cancel.wait(30)
        return real(self, prepared)

    monkeypatch.setattr(PromptBatcher, "sketch_prepared", slow)
    _, job_id2 = create(ctx, space_id, "pairs-cancelled", pairs, mode="completion")
    assert run_job(job_id2, ctx) == "cancelled"
    # stopped before the second of five windows: one batch of 4 prompts and their calibration prefixes (3 each)
    assert len(windows) == 1 and 4 <= windows[0] <= 4 * 4
    with ctx.factory() as s:
        assert job_store.get_job(s, job_id2).status == "cancelled"
        assert repository.get_state_blob(s, task_id) is not None  # the first task is untouched


def test_a_stop_during_the_routing_phase_keeps_the_extraction(ctx: WorkerContext, space_id: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner stops during a completion job's routing phase: the job is released with a checkpoint of its
    finished extraction (it kept the last periodic one, or none: a restart re-ran the samples) and the next run
    goes straight to the routing phase, storing what an uninterrupted run stores."""
    from workers import calibration
    from workers.prompt_batcher import PromptBatcher

    monkeypatch.setattr(calibration, "PROMPT_WINDOW", 4)
    pairs = [Sample(prompt=s.text, completion=" yes") for s in make_samples(20, seed=31)]
    task_id, job_id = create(ctx, space_id, "stopped-while-routing", pairs, mode="completion")
    real = PromptBatcher.sketch_prepared

    def stop(self: PromptBatcher, prepared: Any) -> Any:
        ctx.shutdown.set()  # the runner is asked to stop during the first window
        return real(self, prepared)

    monkeypatch.setattr(PromptBatcher, "sketch_prepared", stop)
    assert run_job(job_id, ctx) == "released"
    with ctx.factory() as s:
        assert job_store.get_checkpoint(s, job_id).samples_done == 20
    monkeypatch.setattr(PromptBatcher, "sketch_prepared", real)
    ctx.shutdown.clear()
    starts: list[int] = []
    extract = Extractor.extract
    monkeypatch.setattr(Extractor, "extract", lambda self, *a, **kw: starts.append(kw.get("start", 0))
                        or extract(self, *a, **kw))
    assert run_job(job_id, ctx) == "succeeded"
    assert starts == [20]  # no sample streamed again
    monkeypatch.setattr(Extractor, "extract", extract)
    whole = reference(ctx, space_id, pairs, mode="completion")
    assert stored_state(ctx, task_id) == whole.state.to_bytes()
    with ctx.factory() as s:  # the counts of the samples streamed before the stop are kept (they were 0)
        job = job_store.get_job(s, job_id)
        assert job.result["tokens"] == job.progress["tokens"] == whole.tokens > 0
        assert job.result["samples_used"] == whole.samples_used == len(pairs)


def test_cancel_while_running(ctx: WorkerContext, space_id: int) -> None:
    samples = make_samples(400, seed=6)
    task_id, job_id = create(ctx, space_id, "long", samples)
    assert _while_running(ctx, job_id, lambda s: job_store.request_cancel(s, job_id)) == "cancelled"
    with ctx.factory() as s:
        assert repository.get_task(s, task_id).status == "failed"
        assert repository.get_state_blob(s, task_id) is None


def test_inprocess_runner_recovers_and_resumes(ctx: WorkerContext, space_id: int) -> None:
    # Jobs queued while no runner was up (e.g. the embedded service crashed) run at start.
    jobs = [create(ctx, space_id, f"r{i}", make_samples(3, seed=10 + i)) for i in range(3)]
    runner = InProcessRunner(ctx, threads=2)
    assert isinstance(runner, JobQueue)
    assert runner.start() == 3
    assert runner.join(timeout=60)
    assert [runner.outcomes[j] for _, j in jobs] == ["succeeded"] * 3

    # Stopping mid-job releases it with its checkpoint; the next start resumes it.
    samples = make_samples(300, seed=7)
    task_id, job_id = create(ctx, space_id, "stop-me", samples)
    runner.enqueue(job_id)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with ctx.factory() as s:
            if job_store.get_checkpoint(s, job_id) is not None:
                break
        time.sleep(0.02)
    runner.stop()
    with ctx.factory() as s:
        job = job_store.get_job(s, job_id)
        assert job.status == "queued" and job_store.get_checkpoint(s, job_id) is not None
        assert job.attempts == 0  # a graceful stop is not an attempt (restarts would exhaust job_max_attempts)
    fresh = InProcessRunner(ctx, threads=1)
    assert fresh.start() == 1
    assert fresh.join(timeout=60)
    fresh.stop()
    assert fresh.outcomes[job_id] == "succeeded"
    assert stored_state(ctx, task_id) == reference(ctx, space_id, samples).state.to_bytes()


def test_inprocess_runner_keeps_a_bounded_record_of_outcomes(ctx: WorkerContext, space_id: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived process runs jobs without end: the runner keeps only the last ``OUTCOMES_KEPT`` outcomes."""
    import workers.inprocess as inprocess

    monkeypatch.setattr(inprocess, "OUTCOMES_KEPT", 2)
    jobs = [create(ctx, space_id, f"bounded-{i}", make_samples(2, seed=40 + i)) for i in range(3)]
    runner = InProcessRunner(ctx, threads=1)
    try:
        assert runner.start() == 3
        assert runner.join(timeout=60)
    finally:
        runner.stop()
    assert len(runner.outcomes) == 2 and set(runner.outcomes.values()) == {"succeeded"}
    assert set(runner.outcomes) < {j for _, j in jobs}


def test_queue_capacity(ctx: WorkerContext, space_id: int) -> None:
    runner = InProcessRunner(ctx, threads=1)  # not started: jobs wait
    ids = [create(ctx, space_id, f"q{i}", make_samples(2, seed=20 + i))[1] for i in range(3)]
    for job_id in ids + ids[:1]:  # a duplicate wake-up is ignored
        runner.enqueue(job_id)
    assert runner.depth() == 3
    ensure_capacity(runner, 4)
    with pytest.raises(QueueFull):
        ensure_capacity(runner, 3)


def test_cancel_after_the_last_batch_writes_nothing(ctx: WorkerContext, space_id: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel answered while the job is past its last batch (calibration pass) is honoured by the final
    transaction: the append is not merged and the job ends ``cancelled``."""
    from workers import calibration

    base = make_samples(5, seed=30)
    task_id, job_id = create(ctx, space_id, "late-cancel", base)
    assert run_job(job_id, ctx) == "succeeded"
    before = stored_state(ctx, task_id)
    with ctx.factory.begin() as s:
        append_id = repository.append_samples(s, task_id, make_samples(6, seed=31)).id
    real = calibration.prompt_side_or_none

    def cancel_then_calibrate(*args, **kwargs):
        with ctx.factory.begin() as s:
            asked = job_store.request_cancel(s, append_id)
            assert (asked.status, asked.cancel_requested) == ("running", True)
        return real(*args, **kwargs)

    monkeypatch.setattr(calibration, "prompt_side_or_none", cancel_then_calibrate)
    assert run_job(append_id, ctx) == "cancelled"
    assert stored_state(ctx, task_id) == before
    with ctx.factory() as s:
        job = job_store.get_job(s, append_id)
        assert (job.status, job.error) == ("cancelled", "cancelled by request")
        assert repository.get_task(s, task_id).n_samples == 5
