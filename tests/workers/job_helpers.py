"""Helpers of the job tests (``test_jobs*.py``; plain functions, no fixtures): samples, a job created with its task,
its stored state, and the state an uninterrupted in-memory extraction gives (the reference a job must equal)."""

from __future__ import annotations

import numpy as np

from atlas import repository
from atlas.samples import Sample
from workers.extraction import Extractor
from workers.worker_context import WorkerContext

M = 256
EVERY = 4


def make_samples(n: int, seed: int = 0) -> list[Sample]:
    words = ["fox", "dog", "tasks", "alignment", "vector", "database", "signature", "blue", "sky"]
    rng = np.random.default_rng(seed)
    return [Sample(text=" ".join(rng.choice(words, size=int(rng.integers(4, 12))))) for _ in range(n)]


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
