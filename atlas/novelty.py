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
    Pooled within-task scatter of the tasks' vectors, shrunk towards a multiple of the identity
    (``ridge``), and its inverse square root ``W``; distances are ``‖(x − μ_t) W‖² / r`` (about 1 for a typical
    sample). In a space of more than :data:`NOVELTY_FIT_TASKS` tasks the scatter is fitted on that many, evenly
    spaced by id (as the ranking's whitening), and every other task is calibrated on its first use from its own
    vectors: a re-fit costs the same at any space size (bench/results/store.md, "The novelty model's re-fit").

Calibration (no labels)
    Each task's threshold is the split-conformal ``1 − rate`` quantile of its own samples' **cross-fitted**
    distances (:meth:`SpaceNovelty.threshold`): the
    samples are split into ``folds`` folds; fold ``f``'s samples are scored against the model (means and
    covariance) fitted without fold ``f`` of any task. (Scored in-sample, distances in a fitted covariance are
    biased low — in the 4d protocol at r = 256 the in-sample 95 % quantile rejected 13 % of held-out own
    prompts.)
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from atlas.route_calibration import FALSE_REJECT_RATE
from atlas.space_fit_cache import SpaceFitCache

log = logging.getLogger(__name__)

NOVELTY_DIM = 256
"""Largest dimension of the stored vectors (wider hidden states are projected)."""

MAX_NOVELTY_SAMPLES = 128
"""Vectors kept per task (128 × 256 float32: 128 KiB)."""

MIN_NOVELTY_SAMPLES = 20
"""Fewest vectors for a task to be calibrated (and tested); fewer: the task is not tested. A calibrated task is
tested only at a rate its own distances can bound (:meth:`SpaceNovelty.tested`): at the default half of 5 % that
takes 39 vectors, so a task of 20–38 has no test then (its route threshold stays at its full rate)."""


def vectors_needed(test_rate: float) -> int:
    """Fewest sample vectors with which a task's novelty test exists at ``test_rate`` (its share of the task's
    false-reject rate: half of it, :func:`atlas.route_calibration.split_rates`): the split-conformal quantile's rank
    ``⌈(n + 1)(1 − rate)⌉`` must not pass ``n`` (:meth:`SpaceNovelty.threshold`) — 39 at 2.5 %, 99 at 1 % — and at
    least :data:`MIN_NOVELTY_SAMPLES`."""
    if not 0.0 <= test_rate < 1.0:
        raise ValueError(f"a rate in [0, 1), not {test_rate!r}")
    if test_rate < 1e-12:  # half a subnormal rate is 0, and 1/rate overflows: more than any task keeps, said as 10^12
        return 10**12
    n = max(1, math.ceil(1.0 / test_rate - 1.0 - 1e-9))
    while math.ceil((n + 1) * (1.0 - test_rate) - 1e-9) > n:
        n += 1
    return max(n, MIN_NOVELTY_SAMPLES)


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
class TaskFit:
    """One tested task's part of the model.

    Attributes
    ----------
    mean : ndarray, shape (r,)
        The whitened mean of its vectors.
    own_distances : ndarray, shape (n,)
        Its cross-fitted own distances, ascending (its thresholds are their quantiles).
    """

    mean: np.ndarray
    own_distances: np.ndarray


VectorsLoader = Callable[[list[int]], Mapping[int, np.ndarray]]
"""Reads the stored novelty vectors of the given task ids (tasks without any are absent)."""

NOVELTY_FIT_TASKS = 256
"""Tasks the space's covariance is fitted on at most (evenly spaced by id above this): the fit's cost and memory do
not grow with the space (a covariance of 256 × 128 vectors is well estimated); every other task is calibrated on
its first use, from its own vectors, in that covariance."""

NOVELTY_LAZY_TASKS = 50_000
"""Tasks calibrated on first use that a model keeps (about 3 KiB each); past this it forgets them all."""


def _valid(x: np.ndarray | None, dim: int | None = None) -> bool:
    return (x is not None and np.ndim(x) == 2 and len(x) >= MIN_NOVELTY_SAMPLES
            and (dim is None or np.shape(x)[1] == dim))


class SpaceNovelty:
    """A space's novelty model: the whitening of its pooled within-task covariance (and the same without each
    cross-fitting fold), and each tested task's whitened mean and calibrated own distances.

    The covariance is fitted on at most :data:`NOVELTY_FIT_TASKS` tasks; those are calibrated at once, any other
    task of the space on first use (its vectors read by ``loader``) and kept. A task is *tested* when it has at
    least :data:`MIN_NOVELTY_SAMPLES` vectors of the model's width.

    Attributes
    ----------
    dim : int
        r, the vectors' dimension.
    whitener : ndarray, shape (r, r)
        ``W`` with ``W Wᵀ = C⁻¹``.
    fold_whiteners : ndarray, shape (folds, r, r)
        The same for the covariance without each fold (the cross-fitting).
    """

    def __init__(self, dim: int, whitener: np.ndarray, fold_whiteners: np.ndarray,
                 tasks: Mapping[int, TaskFit], loader: VectorsLoader | None = None,
                 untested: Sequence[int] = ()) -> None:
        self.dim = dim
        self.whitener = whitener
        self.fold_whiteners = fold_whiteners
        self._fitted = dict(tasks)
        self._lazy: dict[int, TaskFit | None] = dict.fromkeys(untested)  # known: too few vectors
        self._loader = loader
        self._lock = threading.Lock()

    @classmethod
    def fit(cls, vectors: Mapping[int, np.ndarray | None], *, ridge: float = RIDGE, folds: int = FOLDS,
            loader: VectorsLoader | None = None) -> SpaceNovelty | None:
        """Fit the space's covariance on the given tasks' vectors and calibrate each of them.

        Parameters
        ----------
        vectors : mapping of task id to ndarray, shape (n_t, r), or None
            Stored sample vectors (tasks with fewer than :data:`MIN_NOVELTY_SAMPLES`, or none, are left out, and
            known as untested).
        ridge : float
            Shrinkage of the pooled covariance, in [0, 1).
        folds : int
            Cross-fitting folds (≥ 2).
        loader : VectorsLoader, optional
            Reads the vectors of the space's other tasks when they are first asked about (``None``: only the
            given tasks are tested).

        Returns
        -------
        SpaceNovelty or None
            ``None`` when no task has enough vectors.

        Notes
        -----
        Memory is O(T·folds·r + folds·r²) (per task the fold sums of its vectors, and the per-fold second moments
        of all of them); the pooled scatter without fold ``f`` is ``Σ_{g≠f} M_g − Σ_t n_t μ_t μ_tᵀ`` with ``μ_t``
        the task's mean without fold ``f``.
        """
        groups = {t: np.asarray(x, dtype=np.float64) for t, x in vectors.items() if _valid(x)}
        if not groups:
            return None
        widths = Counter(x.shape[1] for x in groups.values())
        r = widths.most_common(1)[0][0]
        if len(widths) > 1:  # an import checks the width (atlas.baselines); never let one task stop the space's routes
            log.warning("novelty vectors of widths %s in one space: the tasks of width other than %s are left out",
                        sorted(widths), r)
            groups = {t: x for t, x in groups.items() if x.shape[1] == r}
        sums = np.zeros((len(groups), folds, r))
        counts = np.zeros((len(groups), folds))
        rows: list[list[np.ndarray]] = [[] for _ in range(folds)]
        for j, x in enumerate(groups.values()):
            fold_of = np.arange(len(x)) % folds
            for f in range(folds):
                held = x[fold_of == f]
                sums[j, f], counts[j, f] = held.sum(0), len(held)
                rows[f].append(held)
        moments = np.zeros((folds, r, r))
        for f, part in enumerate(rows):  # one GEMM a fold
            stacked = np.concatenate(part)
            moments[f] = stacked.T @ stacked
        del rows

        def whitener_without(skip: int) -> np.ndarray:
            keep = np.arange(folds) != skip  # every fold when skip is -1
            n = counts[:, keep].sum(1)
            mu = sums[:, keep].sum(1) / n[:, None]
            scatter = moments[keep].sum(0) - (mu * n[:, None]).T @ mu
            return _inverse_root(scatter, int((n - 1).sum()), ridge)

        whitener = whitener_without(-1)
        fold_whiteners = np.stack([whitener_without(f) for f in range(folds)])
        tasks = {t: _calibrate(x, whitener, fold_whiteners) for t, x in groups.items()}
        return cls(dim=r, whitener=whitener, fold_whiteners=fold_whiteners, tasks=tasks, loader=loader,
                   untested=[int(t) for t in vectors if t not in groups])

    def task(self, task_id: int) -> TaskFit | None:
        """The task's calibrated part (calibrated now on first use), ``None``: not tested."""
        fitted = self._fitted.get(task_id)
        if fitted is not None or self._loader is None:
            return fitted
        with self._lock:
            if task_id in self._lazy:
                return self._lazy[task_id]
        x = self._loader([int(task_id)]).get(int(task_id))
        lazy = _calibrate(np.asarray(x, dtype=np.float64), self.whitener, self.fold_whiteners) \
            if _valid(x, self.dim) else None
        with self._lock:
            if len(self._lazy) >= NOVELTY_LAZY_TASKS:
                self._lazy.clear()
            self._lazy[task_id] = lazy
        return lazy

    def tested(self, task_id: int, false_reject_rate: float | None = None) -> bool:
        """Whether the task has a novelty test in this space at ``false_reject_rate`` (the test's share of the
        task's rate; default :data:`FALSE_REJECT_RATE`): it is calibrated and its threshold at that rate exists
        (a split-conformal quantile at rate ``b`` needs ``n ≥ 1/b − 1`` own distances: 39 at 2.5 %)."""
        thr = self.threshold(task_id, false_reject_rate)
        return thr is not None and math.isfinite(thr)

    def threshold(self, task_id: int, false_reject_rate: float | None = None) -> float | None:
        """The task's distance threshold at its false-reject rate (default :data:`FALSE_REJECT_RATE`): the
        split-conformal quantile of its ``n`` cross-fitted own distances, the ``⌈(n + 1)(1 − rate)⌉``-th smallest
        (a new own prompt lies beyond it with probability at most ``rate``, on average over calibration sets;
        infinite when ``n`` is too small for the rate), plus :data:`DISTANCE_TIE`; ``None``: the task is not tested."""
        fit = self.task(task_id)
        if fit is None:
            return None
        own = fit.own_distances
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
        fit = self.task(task_id)
        if fit is None:
            return None
        return np.asarray((((np.asarray(vectors, dtype=np.float64) @ self.whitener) - fit.mean) ** 2).sum(1)
                          / self.dim)

    def nearer_share(self, task_id: int, distance: float) -> float:
        """The confidence of a rejection: the share of the task's ``n`` own cross-fitted distances below
        ``distance``, counting the prompt itself among them — ``#{own < distance} / (n + 1)``, one minus its
        split-conformal p-value, so at most ``n / (n + 1)``: a test that by design refuses a share of the task's own
        prompts never claims certainty (it said 1.0 for any distance past the largest own one)."""
        fit = self.task(task_id)
        if fit is None or not len(fit.own_distances):
            return 0.0
        return float(np.searchsorted(fit.own_distances, distance, side="left")) / (len(fit.own_distances) + 1)

    def rejects(self, vector: np.ndarray | None, task_id: int, false_reject_rate: float | None = None
                ) -> tuple[bool, float | None, float | None]:
        """Whether the prompt is novel for the task: ``(rejects, distance, threshold)`` (``False, None, None``
        when the prompt has no vector or the task is not tested at this rate, :meth:`tested`); ``vector`` (r,),
        the prompt's novelty vector."""
        if vector is None:
            return False, None, None
        d = self.distance(vector, task_id)
        thr = self.threshold(task_id, false_reject_rate)
        if d is None or thr is None or not math.isfinite(thr):  # too few own distances for the rate: no test
            return False, None, None
        return d > thr, d, thr


def _calibrate(x: np.ndarray, whitener: np.ndarray, fold_whiteners: np.ndarray) -> TaskFit:
    """A task's whitened mean and cross-fitted own distances: fold ``f`` of its vectors scored against its mean
    without fold ``f``, in the covariance without fold ``f``."""
    folds, r = len(fold_whiteners), x.shape[1]
    fold_of = np.arange(len(x)) % folds
    own: list[np.ndarray] = []
    for f in range(folds):
        held, rest = x[fold_of == f], x[fold_of != f]
        if len(held) and len(rest):
            own.append((((held - rest.mean(0)) @ fold_whiteners[f]) ** 2).sum(1) / r)
    return TaskFit(mean=x.mean(0) @ whitener, own_distances=np.sort(np.concatenate(own)))


NOVELTY_MAX_TASKS = 512
"""Spaces of at least this many tasks re-fit at most every :data:`NOVELTY_REFIT_S` seconds (as the ranking's
whitening)."""

NOVELTY_REFIT_S = 30.0


class NoveltyCache(SpaceFitCache[SpaceNovelty]):
    """One :class:`SpaceNovelty` per space, re-fitted when the space's tasks change
    (:class:`atlas.space_fit_cache.SpaceFitCache`)."""

    def __init__(self) -> None:
        super().__init__(NOVELTY_MAX_TASKS, NOVELTY_REFIT_S)

    def get(self, space_id: int, mark: int, task_ids: Callable[[], Sequence[int]],
            load: VectorsLoader, lazy_load: VectorsLoader | None = None, *, detached: bool = False
            ) -> SpaceNovelty | None:
        """The space's model (fitted now when stale, on at most :data:`NOVELTY_FIT_TASKS` of its tasks, evenly
        spaced by id; the others calibrated on first use by ``lazy_load``, or ``load`` when not given); ``None``
        when none of the tasks it is fitted on has enough vectors. ``detached``: ``task_ids`` and ``load`` read in
        sessions of their own, so a large space re-fits in the background (:meth:`SpaceFitCache.fitted`)."""

        def fit(ids: Sequence[int] | np.ndarray) -> SpaceNovelty | None:
            chosen = np.asarray(ids, dtype=np.int64)
            if len(chosen) > NOVELTY_FIT_TASKS:
                chosen = chosen[np.linspace(0, len(chosen) - 1, NOVELTY_FIT_TASKS).round().astype(int)]
            loaded = load([int(i) for i in chosen])
            return SpaceNovelty.fit({int(t): loaded.get(int(t)) for t in chosen}, loader=lazy_load or load)

        return self.fitted(space_id, mark, task_ids, fit, detached=detached)
