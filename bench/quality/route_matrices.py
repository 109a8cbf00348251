"""The product's route score, ranking score and answer in matrix form, over (prompts × tasks) at once.

:func:`score_matrix` (the route score of :mod:`atlas.routing`, or the old one without the prior),
:func:`rank_matrix` and :func:`rank_parts_matrix` (the space-whitened ranking of :func:`atlas.routing.rank_parts`)
and :func:`hybrid_best` (the answer of :func:`atlas.routing.rerank_route` with lexical evidence), as experiment
4b (:mod:`bench.quality.openset`) and the studies beside it replay them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas import routing
from atlas.whitening import WHITEN_MIN_TASKS, fit_space_whitening


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def score_matrix(prompt_states: list[Any], task_states: list[Any], *, prior: bool = True) -> np.ndarray:
    """Route scores, shape (prompts, tasks): the product's score, or (``prior=False``) the old one.

    The old score divides by the bare unbiased self-similarity ``√Ŝ`` (no prior, no noise term).
    """
    units = np.stack([routing.unit_signature(s) for s in prompt_states])
    cols = []
    for st in task_states:
        s, q, n = routing.totals(st)
        if prior:
            den = routing.denominator(s[0], q[0], n, int(st.n_samples))
        else:
            den = routing.denominator(s[0], q[0], n, int(st.n_samples), prior_draws=0.0, prior_samples=0.0)
        cols.append(s[0] / max(n, 1) / den if den > 0 else np.zeros_like(s[0]))
    out: np.ndarray = units @ np.stack(cols).T
    return np.clip(out, -1.0, 1.0) if prior else out


def rank_matrix(prompt_states: list[Any], task_states: list[Any], fit_cols: np.ndarray,
                typical: np.ndarray, min_tasks: int = WHITEN_MIN_TASKS) -> np.ndarray:
    """The product's ranking scores, shape (prompts, tasks): :func:`rank_parts_matrix`'s second part."""
    return rank_parts_matrix(prompt_states, task_states, fit_cols, typical, min_tasks)[1]


def rank_parts_matrix(prompt_states: list[Any], task_states: list[Any], fit_cols: np.ndarray,
                      typical: np.ndarray, min_tasks: int = WHITEN_MIN_TASKS) -> tuple[np.ndarray, np.ndarray]:
    """The shrunk whitened cosines and the ranking scores, shapes (prompts, tasks) — the matrix form of
    :func:`atlas.routing.rank_parts`: whitened ``ae`` and error cosines, averaged, shrunk by the prior;
    then less ``RANK_TYPICAL_WEIGHT`` times the task's ``typical`` score (T,).

    The whitening is fitted on the unit means of the tasks ``fit_cols`` (the indexed ones), as the
    service fits it on the space's routing means (:mod:`atlas.whitening`); below ``min_tasks`` tasks the
    service ranks by :func:`atlas.routing.unwhitened_rank`, and so does this.
    """
    p = np.stack([routing.unit_means(s) for s in prompt_states])  # (P, 2, m): ae, error
    t = np.stack([routing.unit_means(s) for s in task_states])
    w = fit_space_whitening(t[fit_cols, 0], t[fit_cols, 1], min_tasks=min_tasks)
    if w is None:  # too few tasks to whiten: the service ranks by routing.unwhitened_rank
        prior = routing.evidence_prior([int(s.n_samples) for s in task_states])
        route = score_matrix(prompt_states, task_states) * prior[None, :]
        return route, route
    cos = w.ae.apply(p[:, 0]) @ w.ae.apply(t[:, 0]).T
    if w.error is not None:
        cos = (cos + w.error.apply(p[:, 1]) @ w.error.apply(t[:, 1]).T) / 2.0
    views = [routing.state_view(s) for s in task_states]
    shrink = routing.size_shrink(np.array([np.linalg.norm(v[0][0]) for v in views]), np.array([v[2] for v in views]),
                                 np.array([int(s.n_samples) for s in task_states]))
    lam = routing.RANK_TYPICAL_WEIGHT
    shrunk = cos * shrink[None, :]
    return shrunk, (shrunk - lam * np.asarray(typical)[None, :]) / (1.0 + lam)


def hybrid_best(rank: np.ndarray, sig: np.ndarray, prompt_terms: list[Any], task_terms: list[Any],
                n_samples: np.ndarray, cols: np.ndarray, always: np.ndarray | None = None) -> np.ndarray:
    """The task the product answers for each prompt, shape (P,): among ``cols``, the FAISS candidates (top
    ``default_candidates(3)`` by signature cosine ``sig`` (P, T), plus the ``always`` columns: completion
    tasks) ordered by :func:`atlas.lexical.fuse` of the ranking scores ``rank`` (P, T) and the prior-weighted
    lexical scores, as :func:`atlas.routing.rerank_route` does with terms."""
    from atlas.analysis import default_candidates
    from atlas.lexical import hybrid_key

    prior = routing.lexical_prior(n_samples)
    extra = np.array([], dtype=int) if always is None else np.intersect1d(always, cols)
    out = np.empty(len(rank), dtype=int)
    for i in range(len(rank)):
        top = cols[np.argsort(-sig[i, cols], kind="stable")[:default_candidates(3)]]
        cand = np.union1d(top, extra)
        key, _ = hybrid_key(rank[i, cand], prompt_terms[i], [task_terms[j] for j in cand], prior[cand])
        out[i] = cand[np.lexsort((-rank[i, cand], -key))[0]]
    return out
