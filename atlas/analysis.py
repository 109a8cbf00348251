"""Query logic over stored FisherSketch states and signatures (no HTTP, no model, no SQL).

Every question the API answers, as pure functions of :class:`fishersketch.SketchState` objects and
signature vectors that the caller has already loaded:

* :func:`rerank_route` — open-set prompt routing: exact re-rank of ANN candidates.
* :func:`recommend_sources` — source recommendation with the three factors, the split-half SE,
  the empirical-Bayes shrunk Fisher alignment and the activation-dark flag.
* :func:`pair_factors` — the same fields for one pair.
* :func:`alignment_matrix` — the alignment matrices of a set of tasks.
* :func:`atlas_layout` — a deterministic 2-D map of a space with clusters.

Definitions
-----------
Route score
    A cosine in ``[−1, 1]`` between the prompt's unit signature and the task's mean feature, with the
    task's unbiased self-similarity shrunk by a minimum-evidence prior so that a small or noisy task
    cannot inflate it (:mod:`atlas.routing`, docs/SCORES.md). Completion-mode tasks are scored on
    their prompt-side state (the candidate's ``state``). ``none`` is true when the best match scores
    below its threshold: the request's, else the task's own calibrated or overridden threshold, else
    the global default (open-set answer: the prompt belongs to no stored task). Every answer carries
    a ``confidence`` in [0, 1] (:func:`atlas.routing.confidence`).
Ranking of sources
    By ``fisher_shrunk``: the empirical-Bayes shrunk Fisher alignment computed by
    ``fishersketch.align_matrix`` over the target and its compared candidates (so the shrinkage
    strength is estimated from that set), ties broken by raw ``fisher`` then task id.
Activation-dark
    A pair is *activation-dark* when its activations look alike but its updates do not:
    ``activation >= ACTIVATION_DARK_MIN_ACTIVATION`` (0.8) and
    ``fisher <= ACTIVATION_DARK_MAX_FISHER`` (0.3), on the raw (unshrunk) Fisher alignment.
Atlas
    Classical multidimensional scaling of the dissimilarity ``1 − Â_F`` (clipped to [0, 2]); the
    two leading axes, each eigenvector's sign fixed so that its largest-magnitude entry is positive.
    Clusters: average-linkage agglomerative clustering on the same dissimilarity, cut into the number of
    clusters ``k`` in ``[2, n − 1]`` whose mean silhouette is highest (:func:`cluster_count`); when no cut reaches
    a silhouette of ``MIN_SILHOUETTE`` (0.25, the usual floor of "weak structure"), the tasks have no cluster
    structure: one cluster when their mean alignment is at least ½ (alike), else one per task (unrelated — until
    2026-12-01 ``k = round(sqrt(n / 2))`` whatever the alignments, so three unrelated tasks were one cluster).
    Numbered by first appearance in input order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from atlas.clusters import MAX_CLUSTERS as MAX_CLUSTERS
from atlas.clusters import MIN_SILHOUETTE as MIN_SILHOUETTE
from atlas.clusters import agglomerative_clusters as agglomerative_clusters
from atlas.clusters import cluster_count as cluster_count
from atlas.clusters import cluster_labels
from atlas.clusters import silhouette as silhouette

if TYPE_CHECKING:
    from fishersketch import MatrixResult

ACTIVATION_DARK_MIN_ACTIVATION = 0.8
"""An activation similarity S_cov(M_a) at least this high counts as 'activations alike'."""

ACTIVATION_DARK_MAX_FISHER = 0.3
"""A Fisher alignment Â_F at most this low counts as 'updates not alike'."""


def default_candidates(k: int) -> int:
    """Number of ANN candidates re-ranked exactly for a top-``k`` sources query: ``max(4k, 32)``."""
    return max(4 * k, 32)


ROUTE_POOL = 32
"""FAISS candidates a route re-ranks by default (the request's ``candidates`` overrides it)."""


def route_pool(k: int) -> int:
    """FAISS candidates re-ranked for a top-``k`` route: ``max(k, ROUTE_POOL)``.

    The ranking standardises its scores over the candidates (lexical fusion, idf) and the open-set decision reads
    the nearest of them, so the answer depends on the pool: a pool that does not grow with ``k`` up to
    ``ROUTE_POOL`` gives every ``k`` ≤ 32 the same answer, its matches the first ``k`` of the same list
    (``fit`` routes at ``k = ROUTE_POOL``: it tunes the answers users get)."""
    return max(int(k), ROUTE_POOL)


def is_activation_dark(
    activation: float,
    fisher: float,
    *,
    min_activation: float = ACTIVATION_DARK_MIN_ACTIVATION,
    max_fisher: float = ACTIVATION_DARK_MAX_FISHER,
    flags: Sequence[str] = (),
) -> bool:
    """Whether a pair is activation-dark (activations alike, updates not); see the module notes. Never for a pair
    whose Fisher alignment could not be estimated (``UNESTIMATED_FLAGS``: its 0 is a placeholder, not a measured
    low alignment)."""
    if any(f in UNESTIMATED_FLAGS for f in flags):
        return False
    return bool(activation >= min_activation and fisher <= max_fisher)


UNESTIMATED_FLAGS = frozenset({"zero_norm_ae", "zero_norm_a", "empty"})
"""Flags of a pair whose Fisher alignment is a placeholder (a task without usable activation–error draws)."""


def _f(x: Any) -> float:
    """A finite Python float (NaN/inf become 0.0 so that answers stay valid JSON)."""
    v = float(x)
    return v if math.isfinite(v) else 0.0


def _opt_f(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


# --------------------------------------------------------------------------------------------------
# routing: see atlas.routing (re-exported here)
# --------------------------------------------------------------------------------------------------

from atlas.routing import (  # noqa: E402
    Candidate,
    RouteAnswer,
    RouteMatch,
    rerank_route,
    route_score,
    self_similarity,
    state_view,
)

__all__ = ["Candidate", "RouteAnswer", "RouteMatch", "rerank_route", "route_score", "self_similarity", "state_view"]


# --------------------------------------------------------------------------------------------------
# recommendation and pairs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskState:
    """A stored task with its state."""

    task_id: int
    name: str
    state: Any


@dataclass(frozen=True)
class Factors:
    """Fisher alignment of a pair and its factors (see the module notes for the definitions)."""

    fisher: float
    fisher_shrunk: float
    activation: float
    error: float
    rho: float
    se: float | None
    activation_dark: bool
    chi: float | None = None
    flags: tuple[str, ...] = ()
    """The estimator's flags of the pair (``fishersketch.AlignmentResult.flags``; docs/SCORES.md), e.g.
    ``rho_bounded``: ρ hit its bound because the proxy is near 0."""


@dataclass(frozen=True)
class Source:
    """A recommended source: its identity and its :class:`Factors` against the target."""

    task_id: int
    name: str
    factors: Factors


def _entry(mat: Any, i: int, j: int) -> Any:
    """``mat[i, j]`` for a matrix, ``None`` when the estimator did not provide it."""
    if mat is None:
        return None
    arr = np.asarray(mat)
    if arr.ndim == 2:
        return arr[i, j]
    if arr.ndim == 0:
        return arr.item()
    return None


def _se(se: Any, flags: Sequence[str]) -> float | None:
    """The split-half standard error, ``None`` where it is not estimable (documented "null", not 0)."""
    return None if "split_half_unavailable" in flags else _opt_f(se)


def _factors_from_matrix(mr: MatrixResult, i: int, j: int) -> Factors:
    fisher = _f(_entry(mr.fisher, i, j))
    activation = _f(_entry(mr.activation, i, j))
    flags = tuple(mr.pair_flags.get((min(i, j), max(i, j)), ()))
    return Factors(
        fisher=fisher,
        fisher_shrunk=_f(_entry(mr.fisher_eb, i, j)),
        activation=activation,
        error=_f(_entry(mr.error, i, j)),
        rho=_f(_entry(mr.rho, i, j)),
        se=_se(_entry(mr.se, i, j), flags),
        activation_dark=is_activation_dark(activation, fisher, flags=flags),
        flags=flags,
    )


def recommend_sources(target: TaskState, candidates: Sequence[TaskState], *, k: int) -> list[Source]:
    """Rank candidate sources for fine-tuning towards ``target``.

    Parameters
    ----------
    target
        The target task.
    candidates
        Candidate sources (same space; the target itself is ignored if present).
    k
        Sources to return.

    Returns
    -------
    list of Source
        Sorted by ``fisher_shrunk`` descending (ties: raw ``fisher``, then task id). The shrinkage is
        estimated by ``fishersketch.align_matrix`` over ``{target} ∪ candidates``.
    """
    from fishersketch import align_matrix

    others = [c for c in candidates if c.task_id != target.task_id]
    if not others:
        return []
    mr = align_matrix([target.state] + [c.state for c in others])
    out = [Source(c.task_id, c.name, _factors_from_matrix(mr, 0, j)) for j, c in enumerate(others, start=1)]
    out.sort(key=lambda s: (-s.factors.fisher_shrunk, -s.factors.fisher, s.task_id))
    return out[:k]


def pair_factors(a: TaskState, b: TaskState, context: Sequence[TaskState] = ()) -> Factors:
    """Alignment of one pair with its factors.

    Parameters
    ----------
    a, b
        The pair.
    context
        Further tasks of the same space over which the empirical-Bayes shrinkage is estimated
        (``fisher_shrunk``); with no context the shrinkage uses the pair alone.

    Returns
    -------
    Factors
        ``chi`` and ``se`` come from ``fishersketch.align`` on the pair; the other fields from
        ``fishersketch.align_matrix`` over ``[a, b] + context``.
    """
    from fishersketch import align, align_matrix

    ctx = [c for c in context if c.task_id not in (a.task_id, b.task_id)]
    pair = align(a.state, b.state)
    mr = align_matrix([a.state, b.state] + [c.state for c in ctx])
    f = _factors_from_matrix(mr, 0, 1)
    fisher = _f(pair.fisher)
    activation = _f(pair.activation)
    return Factors(
        fisher=fisher,
        fisher_shrunk=f.fisher_shrunk,
        activation=activation,
        error=_f(pair.error),
        rho=_f(pair.rho),
        se=_se(pair.se, pair.flags),
        activation_dark=is_activation_dark(activation, fisher, flags=pair.flags),
        chi=_opt_f(pair.chi),
        flags=tuple(pair.flags),
    )


@dataclass(frozen=True)
class Matrices:
    """Alignment matrices of a set of tasks; row/column ``i`` is ``ids[i]``."""

    ids: list[int]
    names: list[str]
    fisher: np.ndarray
    fisher_shrunk: np.ndarray
    activation: np.ndarray
    error: np.ndarray
    rho: np.ndarray
    pair_flags: dict[tuple[int, int], tuple[str, ...]] = field(default_factory=dict)
    """``(i, j) -> flags`` (``i < j``, positions in ``ids``) for the pairs the estimator flagged
    (``fishersketch.MatrixResult.pair_flags``, e.g. ``rho_bounded``)."""


def _matrix(x: Any, n: int, fill: float) -> np.ndarray:
    if x is None:
        return np.full((n, n), fill)
    arr = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(arr), arr, 0.0)


def alignment_matrix(tasks: Sequence[TaskState]) -> Matrices:
    """All pairwise alignments of ``tasks`` (``fishersketch.align_matrix``)."""
    from fishersketch import align_matrix

    n = len(tasks)
    mr = align_matrix([t.state for t in tasks])
    fisher = _matrix(mr.fisher, n, 0.0)
    return Matrices(
        ids=[t.task_id for t in tasks],
        names=[t.name for t in tasks],
        fisher=fisher,
        fisher_shrunk=_matrix(mr.fisher_eb, n, 0.0),
        activation=_matrix(mr.activation, n, 0.0),
        error=_matrix(mr.error, n, 0.0),
        rho=_matrix(mr.rho, n, 0.0),
        pair_flags=dict(mr.pair_flags),
    )


# --------------------------------------------------------------------------------------------------
# atlas
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AtlasPoint:
    """One task on the map."""

    task_id: int
    name: str
    x: float
    y: float
    cluster: int


@dataclass(frozen=True)
class AtlasMap:
    """A 2-D map of tasks."""

    points: list[AtlasPoint]
    n_clusters: int
    method: str = "mds-fisher"
    extra: dict[str, Any] = field(default_factory=dict)


def classical_mds(dissimilarity: np.ndarray, dims: int = 2) -> np.ndarray:
    """Classical (Torgerson) MDS with deterministic signs.

    Parameters
    ----------
    dissimilarity : ndarray, shape (n, n)
        Symmetric, zero diagonal.
    dims
        Output dimensions.

    Returns
    -------
    ndarray, shape (n, dims)
        Coordinates; axes with non-positive eigenvalues are zero. Each axis' sign is fixed so that
        its largest-magnitude coordinate is positive.
    """
    d = np.asarray(dissimilarity, dtype=np.float64)
    n = d.shape[0]
    out = np.zeros((n, dims))
    if n < 2:
        return out
    j = np.eye(n) - np.full((n, n), 1.0 / n)
    b = -0.5 * j @ (d**2) @ j
    b = (b + b.T) / 2
    vals, vecs = np.linalg.eigh(b)
    order = np.argsort(-vals, kind="stable")
    for axis, idx in enumerate(order[:dims]):
        lam = vals[idx]
        if lam <= 1e-12:
            continue
        v = vecs[:, idx]
        pivot = int(np.argmax(np.abs(v)))
        if v[pivot] < 0:
            v = -v
        out[:, axis] = v * math.sqrt(lam)
    return out


def atlas_layout(tasks: Sequence[TaskState], *, n_clusters: int | None = None) -> AtlasMap:
    """Deterministic 2-D map of ``tasks`` (see the module notes)."""
    n = len(tasks)
    if n == 0:
        return AtlasMap(points=[], n_clusters=0)
    if n == 1:
        t = tasks[0]
        return AtlasMap(points=[AtlasPoint(t.task_id, t.name, 0.0, 0.0, 0)], n_clusters=1)
    mats = alignment_matrix(tasks)
    return layout_from_alignment(mats.ids, mats.names, mats.fisher, n_clusters=n_clusters)


def layout_from_alignment(
    ids: Sequence[int], names: Sequence[str], fisher: np.ndarray, *, n_clusters: int | None = None
) -> AtlasMap:
    """2-D map from a precomputed Fisher alignment matrix (see :func:`atlas_layout`).

    Parameters
    ----------
    ids, names : sequences of length T
        The tasks, in the matrix's order.
    fisher : np.ndarray, (T, T)
        Their Fisher alignments (symmetrised here; dissimilarity ``1 − A_F`` clipped to [0, 2]).
    n_clusters : int, optional
        Clusters to colour (default: chosen from the dissimilarities).
    """
    a = np.asarray(fisher, dtype=np.float64)
    a = (a + a.T) / 2
    dis = np.clip(1.0 - a, 0.0, 2.0)
    np.fill_diagonal(dis, 0.0)
    xy = classical_mds(dis, 2)
    labels = cluster_labels(dis, n_clusters)
    points = [
        AtlasPoint(int(i), str(nm), round(float(x), 6), round(float(y), 6), int(c))
        for i, nm, (x, y), c in zip(ids, names, xy, labels, strict=True)
    ]
    return AtlasMap(points=points, n_clusters=len(set(labels)))


def even_sample(ids: Sequence[int], cap: int) -> list[int]:
    """A deterministic subset of at most ``cap`` ids, evenly spaced in the given order."""
    if len(ids) <= cap:
        return list(ids)
    pos = np.linspace(0, len(ids) - 1, cap).round().astype(int)
    return [ids[p] for p in sorted(set(pos.tolist()))]
