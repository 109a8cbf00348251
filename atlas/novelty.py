"""Open-set novelty test: how far a prompt's mean hidden state lies from the answered task's samples.

The route and ranking scores compare a prompt's Fisher sketch with a task's *mean*; a "loose" task (reviews,
titles, Wikipedia sentences) scores its own prompts low, so its calibrated threshold is low and a foreign prompt
of similar register passes it (bench/results/quality.md, 4d). This test asks another question: is the prompt's
**mean head input** (the model's last hidden state averaged over the prompt's next-token positions) typical
of the task's samples, measured in the space's pooled **within-task** covariance (a Mahalanobis distance:
directions in which a task's own samples vary little — register, format, language — weigh much; topic
directions in which they vary a lot weigh little). Measured on the 22 data families of bench 4d (offline,
``bench/quality/novelty.py``): at the same ~5 % "none" on indexed prompts it rejects about twice the unseen
prompts of the route-score thresholds.

Vectors
    Per sample, the mean of the head input ``a`` (without a bias column) over the sample's counted positions,
    shape (H,); for ``H > NOVELTY_DIM`` projected to ``NOVELTY_DIM`` dimensions by a fixed, seeded orthonormal
    map (:func:`project`) so that the stored vectors and the space's covariance stay small at any model width.
    A task keeps up to :data:`MAX_NOVELTY_SAMPLES` of them (the samples of smallest content hash: a uniform,
    merge-consistent choice, :mod:`atlas.baselines`).

Space model (:class:`SpaceNovelty`)
    Pooled within-task scatter of every task's vectors, shrunk towards a multiple of the identity
    (``ridge``), and its inverse square root ``W``; distances are ``‖(x − μ_t) W‖² / r`` (about 1 for a typical
    sample).

Calibration (no labels)
    Each task's threshold is the split-conformal ``1 − rate`` quantile of its own samples' **cross-fitted**
    distances (:meth:`SpaceNovelty.threshold`): the
    samples are split into ``folds`` folds; fold ``f``'s samples are scored against the model (means and
    covariance) fitted without fold ``f`` of any task. (Scored in-sample, distances in a fitted covariance are
    biased low — in the 4d protocol at r = 256 the in-sample 95 % quantile rejected 13 % of held-out own
    prompts.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from atlas.route_calibration import FALSE_REJECT_RATE
from atlas.space_fit_cache import SpaceFitCache

NOVELTY_DIM = 256
"""Largest dimension of the stored vectors (wider hidden states are projected)."""

MAX_NOVELTY_SAMPLES = 128
"""Vectors kept per task (128 × 256 float32: 128 KiB)."""

MIN_NOVELTY_SAMPLES = 20
"""Fewest vectors for a task to be calibrated (and tested); fewer: the task is not tested."""

RIDGE = 0.05
"""Shrinkage of the pooled covariance towards ``tr(S)/r · I`` (bench 4d: 0.05 kept "none" on indexed prompts
at 5 %, Ledoit-Wolf's estimate at 6.4 %)."""

FOLDS = 5
"""Cross-fitting folds of the calibration."""

DISTANCE_TIE = 1e-6
"""Added to every distance threshold: distances this close to it are ties (floating-point noise), never novel. A
task whose samples are identical where the model reads them (a shared preamble longer than
``max_tokens_per_sample``) has own distances of exactly 0, and its prompts of the same preamble about 1e-29: without
the tie they were all answered "none" (bench 4b, two BBH tasks at 64 tokens, 2026-11-28)."""

_PROJECTION_SEED = 20261127


@lru_cache(maxsize=8)
def _projection(hidden_size: int) -> np.ndarray:
    rng = np.random.default_rng(_PROJECTION_SEED)
    q, _ = np.linalg.qr(rng.standard_normal((hidden_size, NOVELTY_DIM)))
    return np.ascontiguousarray(q, dtype=np.float64)


def project(vectors: np.ndarray) -> np.ndarray:
    """Vectors in the stored dimension.

    Parameters
    ----------
    vectors : ndarray, shape (n, H) or (H,)
        Mean head inputs.

    Returns
    -------
    ndarray, shape (n, min(H, NOVELTY_DIM)) or (min(H, NOVELTY_DIM),), float32
        Unchanged when ``H <= NOVELTY_DIM``; else multiplied by a fixed seeded (H, NOVELTY_DIM) matrix with
        orthonormal columns (distances shrink alike in every direction on average).
    """
    x = np.asarray(vectors, dtype=np.float64)
    h = x.shape[-1]
    if h > NOVELTY_DIM:
        x = x @ _projection(h)
    return x.astype(np.float32)


def _inverse_root(scatter: np.ndarray, dof: int, ridge: float) -> np.ndarray:
    """``W`` with ``W Wᵀ = C⁻¹`` for ``C = (1 − ridge) S + ridge · tr(S)/r · I``, ``S = scatter / dof``."""
    r = scatter.shape[0]
    s = scatter / max(dof, 1)
    scale = float(np.trace(s)) / r
    c = (1.0 - ridge) * s + ridge * max(scale, 1e-12) * np.eye(r)
    w, v = np.linalg.eigh(c)
    return np.asarray(v / np.sqrt(np.maximum(w, 1e-12 * max(scale, 1e-12))))


@dataclass(frozen=True)
class SpaceNovelty:
    """A space's novelty model: whitening, whitened task means, calibrated thresholds.

    Attributes
    ----------
    dim : int
        r, the vectors' dimension.
    whitener : ndarray, shape (r, r)
    means : dict of int to ndarray, shape (r,)
        Whitened mean vector of each tested task.
    own_distances : dict of int to ndarray, shape (n_t,)
        Each tested task's cross-fitted own distances, ascending (its thresholds are their quantiles).
    """

    dim: int
    whitener: np.ndarray
    means: dict[int, np.ndarray]
    own_distances: dict[int, np.ndarray]

    @classmethod
    def fit(cls, vectors: Mapping[int, np.ndarray], *, ridge: float = RIDGE,
            folds: int = FOLDS) -> SpaceNovelty | None:
        """Fit the space's covariance and calibrate each task with enough vectors.

        Parameters
        ----------
        vectors : mapping of task id to ndarray, shape (n_t, r)
            Each task's stored sample vectors (tasks with fewer than :data:`MIN_NOVELTY_SAMPLES` are left out).
        ridge : float
            Shrinkage of the pooled covariance, in [0, 1).
        folds : int
            Cross-fitting folds (≥ 2).

        Returns
        -------
        SpaceNovelty or None
            ``None`` when no task has enough vectors.
        """
        groups = {t: np.asarray(x, dtype=np.float64) for t, x in vectors.items()
                  if x is not None and np.ndim(x) == 2 and len(x) >= MIN_NOVELTY_SAMPLES}
        if not groups:
            return None
        dims = {x.shape[1] for x in groups.values()}
        if len(dims) != 1:
            raise ValueError(f"novelty vectors of different widths {sorted(dims)} in one space")
        r = dims.pop()
        # Per (task, fold) sums and second moments: every fit below is a combination of them.
        fold_of = {t: np.arange(len(x)) % folds for t, x in groups.items()}
        sums = {t: np.stack([x[fold_of[t] == f].sum(0) for f in range(folds)]) for t, x in groups.items()}
        moments = {t: np.stack([x[fold_of[t] == f].T @ x[fold_of[t] == f] for f in range(folds)])
                   for t, x in groups.items()}
        counts = {t: np.bincount(fold_of[t], minlength=folds) for t in groups}

        def fit_without(skip: int | None) -> tuple[np.ndarray, dict[int, np.ndarray]]:
            scatter = np.zeros((r, r))
            mus: dict[int, np.ndarray] = {}
            dof = 0
            keep = np.arange(folds) != (-1 if skip is None else skip)  # every fold when skip is None
            for t in groups:
                n = int(counts[t][keep].sum())
                s = sums[t][keep].sum(0)
                mu = s / n
                scatter += moments[t][keep].sum(0) - n * np.outer(mu, mu)
                mus[t] = mu
                dof += n - 1
            return _inverse_root(scatter, dof, ridge), mus

        whitener, mus = fit_without(None)
        own: dict[int, list[float]] = {t: [] for t in groups}
        for f in range(folds):
            w_f, mus_f = fit_without(f)
            for t, x in groups.items():
                held = x[fold_of[t] == f]
                if len(held):
                    own[t].extend((((held - mus_f[t]) @ w_f) ** 2).sum(1) / r)
        means = {t: mus[t] @ whitener for t in groups}
        return cls(dim=r, whitener=whitener, means=means, own_distances={t: np.sort(own[t]) for t in groups})

    def threshold(self, task_id: int, false_reject_rate: float | None = None) -> float | None:
        """The task's distance threshold at its false-reject rate (default :data:`FALSE_REJECT_RATE`): the
        split-conformal quantile of its ``n`` cross-fitted own distances, the ``⌈(n + 1)(1 − rate)⌉``-th smallest
        (a new own prompt lies beyond it with probability at most ``rate``, on average over calibration sets;
        infinite when ``n`` is too small for the rate), plus :data:`DISTANCE_TIE`; ``None``: the task is not tested."""
        own = self.own_distances.get(task_id)
        if own is None:
            return None
        rate = FALSE_REJECT_RATE if false_reject_rate is None else float(false_reject_rate)
        k = math.ceil((len(own) + 1) * (1.0 - rate) - 1e-9)
        return float(own[k - 1]) + DISTANCE_TIE if k <= len(own) else math.inf

    def distance(self, vector: np.ndarray, task_id: int) -> float | None:
        """Scaled squared Mahalanobis distance of one prompt vector to a task (``None``: task not tested).

        Parameters
        ----------
        vector : ndarray, shape (r,)
            The prompt's :func:`project`-ed mean head input.
        task_id : int
        """
        v = np.asarray(vector, dtype=np.float64)
        if v.shape != (self.dim,):
            return None
        d = self.distances(v[None, :], task_id)
        return None if d is None else float(d[0])

    def distances(self, vectors: np.ndarray, task_id: int) -> np.ndarray | None:
        """:meth:`distance` of many prompt vectors, shape (n,), for vectors of shape (n, r) (``None``: task not
        tested)."""
        mu = self.means.get(task_id)
        if mu is None:
            return None
        return np.asarray((((np.asarray(vectors, dtype=np.float64) @ self.whitener) - mu) ** 2).sum(1) / self.dim)

    def nearer_share(self, task_id: int, distance: float) -> float:
        """Share of the task's own cross-fitted distances below ``distance`` (the confidence of a rejection)."""
        own = self.own_distances.get(task_id)
        if own is None or not len(own):
            return 0.0
        return float(np.searchsorted(own, distance, side="left")) / len(own)

    def rejects(self, vector: np.ndarray | None, task_id: int, false_reject_rate: float | None = None
                ) -> tuple[bool, float | None, float | None]:
        """Whether the prompt is novel for the task: ``(rejects, distance, threshold)`` (``False, None, None``
        when the prompt has no vector or the task is not tested)."""
        if vector is None:
            return False, None, None
        d = self.distance(vector, task_id)
        thr = self.threshold(task_id, false_reject_rate)
        if d is None or thr is None:
            return False, None, None
        return d > thr, d, thr


NOVELTY_MAX_TASKS = 512
"""Spaces of at least this many tasks re-fit at most every :data:`NOVELTY_REFIT_S` seconds (as the ranking's
whitening)."""

NOVELTY_REFIT_S = 30.0

VectorsLoader = Callable[[list[int]], Mapping[int, np.ndarray]]
"""Reads the stored novelty vectors of the given task ids (tasks without any are absent)."""


class NoveltyCache(SpaceFitCache[SpaceNovelty]):
    """One :class:`SpaceNovelty` per space, re-fitted when the space's tasks change
    (:class:`atlas.space_fit_cache.SpaceFitCache`)."""

    def __init__(self) -> None:
        super().__init__(NOVELTY_MAX_TASKS, NOVELTY_REFIT_S)

    def get(self, space_id: int, mark: int, task_ids: Callable[[], Sequence[int]],
            load: VectorsLoader) -> SpaceNovelty | None:
        """The space's model (fitted now when stale); ``None`` when no task of it has enough vectors."""
        return self.fitted(space_id, mark, task_ids, lambda ids: SpaceNovelty.fit(load([int(i) for i in ids])))
