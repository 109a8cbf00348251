"""Library mode follows and cancels its jobs (a parity review, 2026-12-07: ``add(wait=False)`` returned the task
only, and nothing in library mode could then tell when its signature was stored, or stop it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fisher_atlas import Atlas, AtlasError, InvalidInput, JobOut, NotFound

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]


def _samples(n: int, offset: int = 0) -> list[str]:
    return [" ".join(WORDS[(i * 7 + j + offset) % len(WORDS)] for j in range(12)) + f" number {i}" for i in range(n)]


def test_a_job_started_without_waiting_is_followed_waited_for_and_cancelled(tmp_path: Path,
                                                                           tiny_model_dir: Path) -> None:
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        task = atlas.add("big", _samples(600), wait=False, progress=False)
        assert task.status == "pending"
        (job,) = atlas.jobs("big")  # the task's job just queued
        assert isinstance(job, JobOut) and job.kind == "create" and job.task_id == task.id
        cancelled = atlas.cancel(job.id)
        assert cancelled.id == job.id and (cancelled.status == "cancelled" or cancelled.cancel_requested)
        with pytest.raises(AtlasError, match=f"job {job.id} ended cancelled"):
            atlas.wait(job.id, progress=False)
        assert atlas.job(job.id).status == "cancelled"
        assert atlas.task("big").status == "failed"  # a cancelled create keeps no half-written signature

        atlas.add("small", _samples(20, 3), wait=False, progress=False)
        seen: list[JobOut] = []
        newest = atlas.jobs()[0]
        done = atlas.wait(newest.id, progress=seen.append)
        assert done.status == "succeeded" and done.result is not None and done.result.samples_used == 20
        assert seen and seen[-1].status == "succeeded"
        assert atlas.task("small").status == "ready" and atlas.task("small").n_samples == 20
        assert [j.task_id for j in atlas.jobs()] == [atlas.task("small").id, task.id]  # newest first
        assert [j.id for j in atlas.jobs(status="cancelled")] == [job.id]
        assert atlas.cancel(done.id).status == "succeeded"  # a finished job is returned unchanged

        for bad in ("1", 1.0, True):
            with pytest.raises(InvalidInput, match="a job id is an int"):
                atlas.job(bad)  # type: ignore[arg-type]
        for missing in (0, 10**6, 10**30):  # past SQLite's 64-bit integers too: "does not exist", not an overflow
            with pytest.raises(NotFound, match="does not exist"):
                atlas.job(missing)
        with pytest.raises(InvalidInput, match="status must be one of"):
            atlas.jobs(status="done")
        with pytest.raises(NotFound):
            atlas.jobs("no-such-task")

