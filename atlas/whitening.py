"""Space whitening: the ranking transform of the route re-rank (docs/SCORES.md, "Ranking").

The unit signatures of a space's tasks share a large common component (every causal LM's head
gradient has one) and a few directions of large between-task variance; a plain cosine is dominated by
them. Whitening centres the signatures on the space's mean and rescales each principal direction of
the tasks' spread to equal variance (ridge-regularised; directions the tasks do not span keep the
smallest gain), so that the rare directions that tell tasks apart weigh as much as the common ones.
It is a fixed linear map of the space — fitted on its tasks' means, re-fitted when they change —
so a prompt's ranking never depends on the other prompts of its batch.

A space has one transform per feature the ranking compares (:class:`SpaceWhitening`: the ``ae``
signature and the error feature), fitted on its tasks' unit routing means. Measured on the 105
multitask-instruction tasks (bench/results/quality.md, experiment 4): whitening ``ae`` lifts top-1 from
73.3 % (route score) to 77.3 %, and the error transform with the typical-score term of
:func:`atlas.routing.rank_scores` adds about 2.5 points more. With few tasks the between-task spread is
too poorly estimated to whiten by, so spaces below ``WHITEN_MIN_TASKS`` rank by the route score at the
evidence prior (:func:`atlas.routing.unwhitened_rank`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atlas.space_fit_cache import SpaceFitCache, TaskIds

WHITEN_RIDGE = 0.1
"""Ridge added to each direction's variance, as a share of the mean variance (0: full whitening)."""
WHITEN_MAX_TASKS = 512
"""Signatures the transform is fitted on at most (evenly spaced by task id above this)."""
WHITEN_REFIT_S = 2.0
"""A space at ``WHITEN_MAX_TASKS`` or more is re-fitted at most this often (one change barely moves its
fit, and a re-fit costs ~0.1 s of eigendecomposition plus reading the signatures); smaller spaces are
re-fitted on every change (milliseconds)."""
WHITEN_MEMO_MAX = 8192
"""Tasks whose whitened terms a transform keeps (r floats each, ≤ 4 KiB); cleared past this."""
WHITEN_MIN_TASKS = 16
"""Fewest tasks a transform is fitted for; a smaller space ranks by :func:`atlas.routing.unwhitened_rank`
(the route score at the evidence prior). The fit is
T − 1 directions estimated from T means: on random sub-spaces of the 105 instruction tasks the ranking
(whitened ``ae`` and error, typical-score term) gains about +1 point of top-1 over the route score at 16
tasks and +2 to +3 from 20 on, but nothing below ~12 (bench/results/quality.md, 4c); and in a space of
7 tasks with a completion task (tests/service/test_routing_quality.py) whitening sent a third of one
text task's prompts to the completion task."""


@dataclass(frozen=True)
class Whitening:
    """``f(x) = unit(g₀ (x − c) + Vᵀ((g − g₀) ⊙ V(x − c)))``.

    Attributes
    ----------
    center : ndarray, shape (m,)
        Mean of the fitted unit signatures.
    basis : ndarray, shape (r, m)
        Orthonormal principal directions of the centred signatures.
    gains : ndarray, shape (r,)
        ``1 / √(var + ridge · mean(var))`` per direction.
    floor : float
        Gain of the directions outside ``basis`` (the smallest of ``gains``).
    """

    center: np.ndarray
    basis: np.ndarray
    gains: np.ndarray
    floor: float
    _memo: dict[int, tuple[Any, tuple[np.ndarray, float, float, float]]] = field(
        default_factory=dict, compare=False, repr=False)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Whitened unit vectors of ``x``, shape (..., m) → (..., m), float64."""
        z = np.asarray(x, dtype=np.float64) - self.center
        coef = z @ self.basis.T
        out = self.floor * z + (coef * (self.gains - self.floor)) @ self.basis
        norm = np.linalg.norm(out, axis=-1, keepdims=True)
        return np.asarray(out / np.maximum(norm, 1e-30))

    def terms(self, unit: np.ndarray) -> tuple[np.ndarray, float, float]:
        """``(V z, ‖f̃(z)‖², c · u)`` of a unit vector ``u`` (m,), ``z = u − c``, ``f̃`` before normalising."""
        z = np.asarray(unit, dtype=np.float64) - self.center
        coef = self.basis @ z
        sq = self.floor ** 2 * float(z @ z) + float(((self.gains ** 2 - self.floor ** 2) * coef * coef).sum())
        return coef, sq, float(self.center @ unit)

    def task_terms(self, key: int, owner: Any, mu: np.ndarray) -> tuple[np.ndarray, float, float, float]:
        """:meth:`terms` of ``mu / ‖mu‖`` (``mu`` (m,), a task's feature mean) and ``‖mu‖``, memoised per ``key``
        while the same ``owner`` is given.

        ``owner`` is the cached object ``mu`` belongs to (a task's view); a new object (the task
        changed) recomputes.
        """
        hit = self._memo.get(key)
        if hit is not None and hit[0] is owner:
            return hit[1]
        norm = float(np.linalg.norm(mu))
        coef, sq, cu = self.terms(mu / norm if norm > 0 else np.zeros_like(mu, dtype=np.float64))
        if len(self._memo) >= WHITEN_MEMO_MAX:
            self._memo.clear()
        self._memo[key] = (owner, (coef, sq, cu, norm))
        return coef, sq, cu, norm

    def cosines(self, prompt_unit: np.ndarray, unit_dots: np.ndarray,
                tasks: Sequence[tuple[np.ndarray, float, float, float]]) -> np.ndarray:
        """``cos(f(p̂), f(û_t))`` for each task, shape (T,), from :meth:`task_terms` without touching
        ``m``-vectors.

        ``unit_dots`` (T,) are ``p̂ · û_t``; with ``z = u − c``:
        ``f̃(z_p) · f̃(z_t) = g₀² z_p · z_t + Σ (g² − g₀²) (V z_p)(V z_t)`` and
        ``z_p · z_t = p̂ · û_t − c · p̂ − c · û_t + ‖c‖²``.
        """
        if not tasks:
            return np.zeros(0)
        cp, sqp, cup = self.terms(prompt_unit)
        coefs = np.stack([t[0] for t in tasks])
        sqs = np.array([t[1] for t in tasks])
        cus = np.array([t[2] for t in tasks])
        zz = np.asarray(unit_dots, dtype=np.float64) - cup - cus + float(self.center @ self.center)
        dots = self.floor ** 2 * zz + coefs @ ((self.gains ** 2 - self.floor ** 2) * cp)
        den = np.sqrt(np.maximum(sqs, 1e-300) * max(sqp, 1e-300))
        return np.asarray(np.clip(dots / den, -1.0, 1.0))


def fit_whitening(signatures: np.ndarray, ridge: float = WHITEN_RIDGE,
                  min_tasks: int = WHITEN_MIN_TASKS) -> Whitening | None:
    """Fit the transform on unit signatures, shape (T, m); ``None`` below ``min_tasks`` (and below 2).

    The principal directions come from the (T, T) Gram matrix of the centred signatures (T ≪ m), so
    the cost is O(T² m).
    """
    x = np.asarray(signatures, dtype=np.float64)
    if x.ndim != 2 or len(x) < max(min_tasks, 2):
        return None
    center = x.mean(axis=0)
    z = x - center
    lam, u = np.linalg.eigh(z @ z.T)
    keep = lam > max(float(lam.max()), 0.0) * 1e-9
    if not keep.any():
        return None
    lam, u = lam[keep], u[:, keep]
    basis = (u.T @ z) / np.sqrt(lam)[:, None]
    var = lam / len(x)
    gains = 1.0 / np.sqrt(var + ridge * float(var.mean()))
    return Whitening(center=center, basis=basis, gains=gains, floor=float(gains.min()))


@dataclass(frozen=True)
class SpaceWhitening:
    """The ranking transforms of one space: one per feature the ranking compares.

    Attributes
    ----------
    ae : Whitening
        Fitted on the tasks' unit ``ae`` means (the signatures).
    error : Whitening or None
        Fitted on the tasks' unit error (``e``) means; ``None`` ranks by ``ae`` alone.
    typical : float
        Median typical score of the fitted tasks that have one (0.0 if none has): what a task whose
        calibration is missing is held to (:func:`atlas.routing.rank_scores`).
    """

    ae: Whitening
    error: Whitening | None = None
    typical: float = 0.0


def fit_space_whitening(ae_units: np.ndarray, error_units: np.ndarray | None = None,
                        ridge: float = WHITEN_RIDGE, min_tasks: int = WHITEN_MIN_TASKS,
                        typicals: np.ndarray | None = None) -> SpaceWhitening | None:
    """Fit a space's transforms on its tasks' unit means, shapes (T, m); ``None`` below ``min_tasks``.

    ``typicals`` (T,) are the tasks' typical scores (NaN where a task has none).
    """
    ae = fit_whitening(ae_units, ridge, min_tasks)
    if ae is None:
        return None
    error = fit_whitening(error_units, ridge, min_tasks) if error_units is not None else None
    known = np.asarray([] if typicals is None else typicals, dtype=np.float64)
    known = known[np.isfinite(known)]
    return SpaceWhitening(ae=ae, error=error, typical=float(np.median(known)) if known.size else 0.0)


MeansLoader = Callable[[list[int]], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Reads the unit routing means of tasks and their typical scores: ``ids → (ae (n, m), error (n, m),
typical (n,))`` (rows of the tasks found; NaN where a task has no typical score)."""


class WhiteningCache(SpaceFitCache[SpaceWhitening]):
    """One fitted transform per space, re-fitted when the space's tasks have changed
    (:class:`atlas.space_fit_cache.SpaceFitCache`: at once in a space of fewer than ``WHITEN_MAX_TASKS`` tasks, at
    most every ``WHITEN_REFIT_S`` seconds in a larger one), from the tasks' routing means and typical scores."""

    def __init__(self) -> None:
        super().__init__(WHITEN_MAX_TASKS, WHITEN_REFIT_S)

    def get(self, space_id: int, mark: int, task_ids: Callable[[], np.ndarray],
            load: MeansLoader, *, detached: bool = False) -> SpaceWhitening | None:
        """The space's transforms (fitted now when stale; in the background in a large space when ``detached``).

        Parameters
        ----------
        space_id, mark
            The space and its content mark (any value that moves when the space's tasks change).
        task_ids
            Lists the space's indexed task ids (ndarray of int); called only for a re-fit, so a fresh
            fit costs the route path nothing.
        load
            Reads the unit routing means of the tasks it is given (see :data:`MeansLoader`).
        detached
            ``task_ids`` and ``load`` read in sessions of their own (:meth:`SpaceFitCache.fitted`).
        """

        def fit(ids: TaskIds) -> SpaceWhitening | None:
            chosen = np.asarray(ids)
            if len(chosen) > WHITEN_MAX_TASKS:  # evenly spaced by task id
                chosen = chosen[np.linspace(0, len(chosen) - 1, WHITEN_MAX_TASKS).round().astype(int)]
            ae, error, typicals = load([int(i) for i in chosen])
            return fit_space_whitening(ae, error, typicals=typicals) if len(ae) else None

        return self.fitted(space_id, mark, task_ids, fit, detached=detached)
