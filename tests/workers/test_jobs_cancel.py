"""Cancelling run_job against the real store (SQLite and PostgreSQL) and a tiny real model: while it runs, during its
routing phase, past its last batch, or by deleting its task; a cancelled job writes nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from atlas import job_store, repository
from atlas.samples import Sample
from tests.workers.job_helpers import create, make_samples, stored_state
from workers.jobs import run_job
from workers.worker_context import WorkerContext


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

    def slow(self: PromptBatcher, prepared: Any, *args: Any) -> Any:
        windows.append(len(prepared))
        if len(windows) == 1:  # cancel during the first window; wait until the job's heartbeat has seen it
            with ctx.factory.begin() as s:
                job_store.request_cancel(s, job_id2)
            assert beats[-1].cancel.wait(30)
        return real(self, prepared, *args)

    monkeypatch.setattr(PromptBatcher, "sketch_prepared", slow)
    _, job_id2 = create(ctx, space_id, "pairs-cancelled", pairs, mode="completion")
    assert run_job(job_id2, ctx) == "cancelled"
    # stopped before the second of five windows: one batch of 4 prompts and their calibration prefixes (3 each)
    assert len(windows) == 1 and 4 <= windows[0] <= 4 * 4
    with ctx.factory() as s:
        assert job_store.get_job(s, job_id2).status == "cancelled"
        assert repository.get_state_blob(s, task_id) is not None  # the first task is untouched


def test_a_cancel_stops_the_routing_pass_within_its_window(ctx: WorkerContext, space_id: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A completion job whose prompts fit one window (256) stops its prompt-side pass at the next length bucket
    after a cancel (it ran the whole window: a dashboard review, 2026-12-07, saw a cancelled 60-pair job route its
    prompts 59 / 60 first)."""
    from workers import jobs as jobs_module
    from workers.prompt_batcher import PromptBatcher

    real, beats, calls = PromptBatcher.sketch_prepared, [], []
    enter = jobs_module._Heartbeat.__enter__
    monkeypatch.setattr(jobs_module._Heartbeat, "__enter__", lambda self: beats.append(self) or enter(self))

    def watched(self: PromptBatcher, prepared: Any, sketched: Any = None) -> Any:
        def after_bucket(n: int) -> None:
            calls.append(n)
            if len(calls) == 1:  # cancel after the first bucket; wait until the job's heartbeat has seen it
                with ctx.factory.begin() as s:
                    job_store.request_cancel(s, job_id)
                assert beats[-1].cancel.wait(30)
            if sketched is not None:
                sketched(n)
        return real(self, prepared, after_bucket)

    monkeypatch.setattr(PromptBatcher, "sketch_prepared", watched)
    pairs = [Sample(prompt=s.text, completion=" yes") for s in make_samples(24, seed=32)]
    _, job_id = create(ctx, space_id, "cancelled-in-its-window", pairs, mode="completion")
    assert run_job(job_id, ctx) == "cancelled"
    assert calls and len(calls) == 1, calls  # no bucket went through the model after the cancel


@pytest.mark.parametrize("sketch_rows", [32, None])
def test_routing_phase_reports_progress_within_one_window(ctx: WorkerContext, space_id: int,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          sketch_rows: int | None) -> None:
    """A completion job whose prompts fit one window (256) reports the routing phase as its length buckets go through
    the model, not only at its start and end (until 2026-12-01 a job of up to 256 pairs showed 0 of N until the pass
    ended; until 2026-12-02 a pass that fit one batched sketch did too: "routing prompts 0 / 32", a review)."""
    from workers import jobs as jobs_module
    from workers import prompt_batcher

    if sketch_rows is not None:
        monkeypatch.setattr(prompt_batcher, "SKETCH_ROWS", sketch_rows)  # a sketch every ~32 positions too
    seen: list[tuple[int, int]] = []
    set_progress = jobs_module._Heartbeat.set_progress

    def record(self: Any, progress: dict[str, Any]) -> None:
        if progress.get("phase") == "routing":
            seen.append((progress["routing_done"], progress["routing_total"]))
        set_progress(self, progress)

    monkeypatch.setattr(jobs_module._Heartbeat, "set_progress", record)
    pairs = [Sample(prompt=s.text, completion=" yes") for s in make_samples(24, seed=32)]
    _, job_id = create(ctx, space_id, "one-window", pairs, mode="completion")
    assert run_job(job_id, ctx) == "succeeded"
    totals = {t for _, t in seen}
    assert len(totals) == 1 and (0, next(iter(totals))) in seen and seen[-1][0] == seen[-1][1]
    between = [d for d, t in seen if 0 < d < t]
    assert len(set(between)) >= 2, seen  # progress moved within the window
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)  # and never went back


def test_cancel_while_running(ctx: WorkerContext, space_id: int) -> None:
    samples = make_samples(400, seed=6)
    task_id, job_id = create(ctx, space_id, "long", samples)
    assert _while_running(ctx, job_id, lambda s: job_store.request_cancel(s, job_id)) == "cancelled"
    with ctx.factory() as s:
        assert repository.get_task(s, task_id).status == "failed"
        assert repository.get_state_blob(s, task_id) is None


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
