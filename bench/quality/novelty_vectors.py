"""The product's novelty vectors outside the product, for the benchmarks (:mod:`atlas.novelty`): a text's vector
as a job computes it, a task's stored set, and the test of a space of tasks on many prompts at once."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas.novelty import MAX_NOVELTY_SAMPLES, SpaceNovelty, project


def text_vectors(extractor: Any, texts: list[str]) -> np.ndarray:
    """Each text's novelty vector as the product computes it (mean head input over its counted positions,
    :func:`atlas.novelty.project`-ed), shape (n, r)."""
    from atlas.samples import Sample, sample_id

    samples = [Sample(text=t) for t in texts]
    sums: dict[int, np.ndarray] = {}
    counts: dict[int, int] = {}
    for hb in extractor.iter_head_batches(samples, "text"):
        hidden = hb.hidden.double().cpu().numpy()
        for sid, row in zip(hb.sample_ids.tolist(), hidden, strict=True):
            sums[sid] = sums.get(sid, 0.0) + row
            counts[sid] = counts.get(sid, 0) + 1
    return project(np.stack([sums[sample_id(s)] / counts[sample_id(s)] for s in samples]))


def kept_vectors(extractor: Any, texts: list[str]) -> np.ndarray:
    """A task's stored novelty vectors: those of its :data:`atlas.novelty.MAX_NOVELTY_SAMPLES` samples of smallest
    content id (:mod:`atlas.baselines`' bottom-k), shape (min(n, MAX_NOVELTY_SAMPLES), r)."""
    from atlas.samples import Sample, sample_id

    by_id = {sample_id(Sample(text=t)): t for t in texts}
    return text_vectors(extractor, [by_id[k] for k in sorted(by_id)[:MAX_NOVELTY_SAMPLES]])


def novelty_rejects(task_vectors: list[np.ndarray], prompt_vectors: np.ndarray, indexed: np.ndarray, rate: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The product's novelty test in a space of the ``indexed`` tasks, for every prompt and task.

    Parameters
    ----------
    task_vectors : list of ndarray, each shape (n_t, r)
        Every task's stored vectors (:func:`kept_vectors`), by task index.
    prompt_vectors : ndarray, shape (P, r)
    indexed : ndarray of int
        The tasks in the space (the model is fitted on them alone).
    rate : float
        The false-reject rate of the test (the product spends half a task's rate on it).

    Returns
    -------
    rejects : ndarray, shape (P, T), bool
        The task's test rejects the prompt (false for untested tasks).
    tested : ndarray, shape (T,), bool
        The task has a novelty test (indexed, with at least :data:`atlas.novelty.MIN_NOVELTY_SAMPLES` vectors).
    """
    out = np.zeros((len(prompt_vectors), len(task_vectors)), dtype=bool)
    tested = np.zeros(len(task_vectors), dtype=bool)
    model = SpaceNovelty.fit({int(t): task_vectors[int(t)] for t in indexed})
    if model is None:
        return out, tested
    for t in (int(i) for i in indexed):
        d = model.distances(prompt_vectors, t)
        thr = model.threshold(t, rate)
        if d is not None and thr is not None:
            out[:, t], tested[t] = d > thr, True
    return out, tested
