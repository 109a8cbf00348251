"""run_job resumed against the real store (SQLite and PostgreSQL) and a tiny real model: after a worker died past a
checkpoint, after duplicate deliveries ran at once, after a stop during the routing phase; each ends as an
uninterrupted run would."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from sqlalchemy import update

from atlas import job_store, repository
from atlas.models import Job, utcnow
from atlas.samples import Sample
from tests.workers.job_helpers import EVERY, create, make_samples, reference, stored_state
from workers.extraction import Extractor
from workers.jobs import run_job
from workers.worker_context import WorkerContext


def test_resume_after_worker_death_equals_uninterrupted(ctx: WorkerContext, space_id: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that died after a checkpoint: the next claim resumes and ends bit-identical; its progress starts at
    the checkpoint and never goes back (it showed the dead worker's last figures, past the checkpoint, then fell:
    912, 817, 912 of 4,200 in a chaos review, 2026-12-07)."""
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
        # the dead worker's last heartbeat: further on than its checkpoint
        job_store.heartbeat(s, job_id, dead.lease, {"samples_done": EVERY * 2 + 3, "samples_total": len(samples)})
    assert run_job(job_id, ctx) == "skipped"  # its heartbeat is still fresh
    written: list[int] = []
    beat = job_store.heartbeat
    monkeypatch.setattr(job_store, "heartbeat", lambda s, jid, lease, progress=None: (
        written.append(progress["samples_done"]) if progress and "samples_done" in progress else None,
        beat(s, jid, lease, progress))[1])
    with ctx.factory.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow() - dt.timedelta(seconds=5)))
    assert run_job(job_id, ctx) == "succeeded"
    assert written and written[0] == partial.samples_done and written == sorted(written), written
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
    """Three deliveries of one append at once: one runs it, two find it claimed; the samples are merged once.

    The lease is made long (60 s): with the fixture's 1 s a run whose heartbeats were delayed past it on a busy
    machine (SQLite serialises the three threads' writes) was taken over as stale and answered ``lost`` — a
    takeover, the other test's case, not a duplicate delivery."""
    ctx = WorkerContext(settings=ctx.settings.model_copy(update={"job_stale_after_s": 60.0}), factory=ctx.factory,
                        lm=ctx.lm)
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


@pytest.mark.parametrize("mode", ["completion", "text"])
def test_a_stop_during_the_routing_phase_keeps_the_extraction(ctx: WorkerContext, space_id: int,
                                                             monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The runner stops during a job's routing phase: the job is released with a checkpoint of its finished
    extraction (it kept the last periodic one, or none: a restart re-ran the samples; a text job until 2026-12-02,
    whose calibration pass can outlast its extraction) and the next run goes straight to the routing phase, storing
    what an uninterrupted run stores."""
    from workers import calibration
    from workers.prompt_batcher import PromptBatcher

    monkeypatch.setattr(calibration, "PROMPT_WINDOW", 4)
    texts = make_samples(20, seed=31)
    pairs = [Sample(prompt=s.text, completion=" yes") for s in texts] if mode == "completion" else texts
    task_id, job_id = create(ctx, space_id, "stopped-while-routing", pairs, mode=mode)
    real = PromptBatcher.sketch_prepared

    def stop(self: PromptBatcher, prepared: Any, *args: Any) -> Any:
        ctx.shutdown.set()  # the runner is asked to stop during the first window
        return real(self, prepared, *args)

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
    whole = reference(ctx, space_id, pairs, mode=mode)
    assert stored_state(ctx, task_id) == whole.state.to_bytes()
    with ctx.factory() as s:  # the counts of the samples streamed before the stop are kept (they were 0)
        job = job_store.get_job(s, job_id)
        assert job.result["tokens"] == job.progress["tokens"] == whole.tokens > 0
        assert job.result["samples_used"] == whole.samples_used == len(pairs)
