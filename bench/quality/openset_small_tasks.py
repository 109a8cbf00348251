"""Experiment 4b's small-task study (:mod:`bench.quality.openset`): does a task of 1–3 samples take other tasks'
prompts?

For source tasks drawn at random and k = 1, 2, 3, the task is replaced in the index by one built from k of its
samples (built by :func:`bench.quality.openset.run`); :func:`small_tasks` counts the other tasks' held-out prompts
whose top-1 becomes the small task, under the product's answer, its ranking, its route score and the old score
(cosine over the bare unbiased self-similarity, no prior).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def small_tasks(S_new: np.ndarray, S_old: np.ndarray, truth: np.ndarray, small_new: dict[tuple[int, int], np.ndarray],
                small_old: dict[tuple[int, int], np.ndarray], R: np.ndarray | None = None,
                small_rank: dict[tuple[int, int], np.ndarray] | None = None,
                small_top: dict[tuple[int, int], np.ndarray] | None = None) -> list[dict[str, Any]]:
    """Captures of other tasks' prompts by a k-sample task replacing its source, per k and score
    (``small_top``: the product's answered column per prompt with lexical evidence, :func:`hybrid_best`)."""
    rows = []
    for k in (1, 2, 3) if small_top else ():
        sel = [(src, top) for (src, kk), top in small_top.items() if kk == k]
        other = [(truth != src, top == src) for src, top in sel]
        rows.append({"k": k, "score": "ranking fused with lexical (product)",
                     "taken": int(sum(np.sum(hit[o]) for o, hit in other)),
                     "total": int(sum(o.sum() for o, _ in other)),
                     "own": int(sum(np.sum(hit[~o]) for o, hit in other)),
                     "own_total": int(sum((~o).sum() for o, _ in other)), "max_score": float("nan")})
    kinds = [("route score", S_new, small_new), ("old score (no prior)", S_old, small_old)]
    if R is not None and small_rank is not None:
        kinds.insert(0, ("whitened ranking alone", R, small_rank))
    for k in (1, 2, 3):
        for name, S, small in kinds:
            taken = total = own = own_total = 0
            max_score = -np.inf
            for (src, kk), col in small.items():
                if kk != k:
                    continue
                if col.ndim == 2:  # a whole re-fitted ranking matrix
                    Sx, col = col, col[:, src]
                else:
                    Sx = S.copy()
                    Sx[:, src] = col
                other = truth != src
                top = np.argmax(Sx, axis=1)
                taken += int(np.sum(top[other] == src))
                total += int(other.sum())
                own += int(np.sum(top[~other] == src))
                own_total += int((~other).sum())
                max_score = max(max_score, float(col.max()))
            rows.append({"k": k, "score": name, "taken": taken, "total": total, "own": own, "own_total": own_total,
                         "max_score": max_score})
    return rows
