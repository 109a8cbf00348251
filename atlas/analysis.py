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
    ``score = ⟨p̂, μ_ae,t⟩ / √Ŝ_ae(t, t)``: the prompt's unit signature ``p̂`` (all T−1 next-token
    positions of the prompt) against the task's mean feature ``μ_ae,t``, normalised by the task's
    *unbiased* (U-statistic) self-similarity. The FAISS score is the same inner product normalised
    by the plug-in norm ``‖μ_ae,t‖``, which is inflated by sampling noise (the self-pairs) — most for
    tasks with few tokens — so the exact re-rank removes a bias against small tasks. Among the
    candidates it orders tasks exactly as the sketched Fisher alignment ``Â_F(prompt, task)`` of
    ``fishersketch.align`` does (the prompt-side normalisation is a per-prompt constant), but it stays
    defined and on a cosine-like scale (≈ [−1, 1]; slightly above 1 is possible for very small tasks)
    when a short prompt's own U-statistic is too noisy to estimate, which makes one threshold
    meaningful across prompts. ``none`` is true when the best score is below the threshold
    (open-set answer: the prompt belongs to no stored task).
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
    Clusters: average-linkage agglomerative clustering on the same dissimilarity, cut into
    ``k = max(1, round(sqrt(n / 2)))`` clusters, numbered by first appearance in input order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from atlas.settings import Settings

if TYPE_CHECKING:
    from fishersketch import MatrixResult

ACTIVATION_DARK_MIN_ACTIVATION = 0.8
"""An activation similarity S_cov(M_a) at least this high counts as 'activations alike'."""

ACTIVATION_DARK_MAX_FISHER = 0.3
"""A Fisher alignment Â_F at most this low counts as 'updates not alike'."""

_EPS = 1e-10

DEFAULT_ROUTE_THRESHOLD: float = Settings.model_fields["route_threshold"].default
"""Default open-set threshold on the route score (``settings.route_threshold`` overrides it when set).

Calibrated on the bundled model at m = 4096 with three stored tasks (SMILES, Shakespeare, BoolQ; 40
samples each): the best score of held-out in-domain prompts was 0.08–0.62, that of off-domain prompts
(Python, SQL, German, digits) 0.005–0.046. The score's scale depends on the model and on m (the sketch
noise shrinks as 1/√m), so calibrate it for other models with held-out prompts."""


def default_candidates(k: int) -> int:
    """Number of ANN candidates re-ranked exactly for a top-``k`` query: ``max(4k, 32)``."""
    return max(4 * k, 32)


def is_activation_dark(
    activation: float,
    fisher: float,
    *,
    min_activation: float = ACTIVATION_DARK_MIN_ACTIVATION,
    max_fisher: float = ACTIVATION_DARK_MAX_FISHER,
) -> bool:
    """Whether a pair is activation-dark (activations alike, updates not); see the module notes."""
    return bool(activation >= min_activation and fisher <= max_fisher)


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
# routing
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A stored task offered to the re-ranker.

    Attributes
    ----------
    task_id, name
        Identity of the task.
    state : fishersketch.SketchState
        Its stored state.
    faiss_score : float
        Inner product of the prompt's and the task's unit signatures.
    view : tuple of ndarray, optional
        The state's :func:`state_view`, if the caller cached it (saves recomputing it per query).
    """

    task_id: int
    name: str
    state: Any
    faiss_score: float = 0.0
    view: Any = None


@dataclass(frozen=True)
class RouteMatch:
    """One re-ranked match (see :func:`rerank_route`)."""

    task_id: int
    name: str
    score: float
    faiss_score: float
    activation: float
    error: float


@dataclass(frozen=True)
class RouteAnswer:
    """The answer for one prompt: top-``k`` matches, best first, and the open-set flag."""

    matches: list[RouteMatch]
    none: bool
    best_score: float | None
    threshold: float


def self_similarity(state: Any, feature: str = "ae") -> float:
    """Unbiased self-similarity Ŝ_f(t, t) of a state (U-statistic; V-statistic for a single draw).

    ``(‖Σψ_f‖² − Σ‖ψ_f‖²) / (n (n − 1))`` over both splits, as in ``fishersketch.align``; 0.0 when
    the state has no draws.
    """
    return float(state_view(state)[1][_FEATURE_INDEX[feature]])


_FEATURE_INDEX = {"ae": 0, "a": 1, "e": 2}


def state_view(state: Any) -> tuple[np.ndarray, np.ndarray]:
    """Pooled means ``μ_f`` (3, m) and unbiased self-similarities (3,) of a state, features (ae, a, e).

    What the route re-rank reads from a task's state; callers may cache it next to the state.
    """
    n = int(state.n_draws)
    sums = np.asarray(state.sums).sum(axis=0)  # (3, m) over both splits
    sq = np.asarray(state.sq_norms).sum(axis=0)  # (3,)
    if n == 0:
        return np.zeros_like(sums), np.zeros(3)
    norms2 = np.einsum("fm,fm->f", sums, sums)
    self_terms = sq.copy() if n == 1 else (norms2 - sq) / (n * (n - 1.0))
    return sums / n, self_terms


def route_score(prompt_unit: np.ndarray, task_state: Any) -> float:
    """Route score of a task for a prompt: ``⟨p̂, μ_ae,t⟩ / √Ŝ_ae(t, t)`` (see the module notes)."""
    mu, self_t = state_view(task_state)
    if not self_t[0] > _EPS:
        return 0.0
    return float(prompt_unit @ mu[0]) / math.sqrt(self_t[0])


def rerank_route(prompt_state: Any, candidates: Sequence[Candidate], *, k: int, threshold: float) -> RouteAnswer:
    """Exact re-rank of ANN candidates for one prompt.

    Parameters
    ----------
    prompt_state : fishersketch.SketchState
        State of the prompt (all its next-token positions).
    candidates
        Candidate tasks with their stored states (same space as the prompt).
    k
        Matches to return.
    threshold
        Open-set threshold: ``none`` is true when there is no candidate or the best score is below it.

    Returns
    -------
    RouteAnswer
        Matches sorted by :func:`route_score` (descending), ties by FAISS score then task id. Each
        match carries the prompt-task ``activation`` and ``error`` cosines, computed exactly as the
        pooled point estimates of ``fishersketch.align`` (cross kernel mean clamped at 1e-10 over the
        root of both unbiased self-similarities; 0 when a self-similarity is not positive — a short
        prompt's own error self-similarity is often too noisy to estimate, then ``error`` is 0).
    """
    if not candidates:
        return RouteAnswer(matches=[], none=True, best_score=None, threshold=threshold)
    mu_p, self_p = state_view(prompt_state)
    norm = float(np.linalg.norm(mu_p[0]))
    unit = mu_p[0] / norm if norm > 0 and math.isfinite(norm) else np.zeros_like(mu_p[0])
    views = [c.view if c.view is not None else state_view(c.state) for c in candidates]
    self_ae = np.array([v[1][0] for v in views])
    dots = np.array([float(v[0][0] @ unit) for v in views])
    ok = self_ae > _EPS
    score = np.where(ok, dots / np.sqrt(np.where(ok, self_ae, 1.0)), 0.0)
    faiss = np.array([_f(c.faiss_score) for c in candidates])
    order = sorted(range(len(candidates)), key=lambda i: (-_f(score[i]), -faiss[i], candidates[i].task_id))[:k]
    top = []
    for i in order:
        mu_t, self_t = views[i]
        diag = []
        for f in (1, 2):  # activation, error: the pooled cosines of fishersketch.align
            if self_t[f] > _EPS and self_p[f] > _EPS:
                diag.append(max(float(mu_t[f] @ mu_p[f]), _EPS) / math.sqrt(self_t[f] * self_p[f]))
            else:
                diag.append(0.0)
        c = candidates[i]
        top.append(RouteMatch(task_id=c.task_id, name=c.name, score=_f(score[i]), faiss_score=_f(faiss[i]),
                              activation=_f(diag[0]), error=_f(diag[1])))
    best = top[0].score
    return RouteAnswer(matches=top, none=best < threshold, best_score=best, threshold=threshold)


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


def _factors_from_matrix(mr: MatrixResult, i: int, j: int) -> Factors:
    fisher = _f(_entry(mr.fisher, i, j))
    activation = _f(_entry(mr.activation, i, j))
    return Factors(
        fisher=fisher,
        fisher_shrunk=_f(_entry(mr.fisher_eb, i, j)),
        activation=activation,
        error=_f(_entry(mr.error, i, j)),
        rho=_f(_entry(mr.rho, i, j)),
        se=_opt_f(_entry(mr.se, i, j)),
        activation_dark=is_activation_dark(activation, fisher),
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
        se=_opt_f(pair.se),
        activation_dark=is_activation_dark(activation, fisher),
        chi=_opt_f(pair.chi),
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


def cluster_count(n: int) -> int:
    """Number of atlas clusters for ``n`` tasks: ``max(1, round(sqrt(n / 2)))``."""
    return max(1, round(math.sqrt(n / 2))) if n > 0 else 0


def agglomerative_clusters(dissimilarity: np.ndarray, n_clusters: int) -> list[int]:
    """Average-linkage clusters, labels ``0..n_clusters-1`` numbered by first appearance."""
    n = dissimilarity.shape[0]
    if n == 0:
        return []
    if n == 1 or n_clusters <= 1:
        return [0] * n
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    d = np.array(dissimilarity, dtype=np.float64)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    z = linkage(squareform(np.clip(d, 0.0, None), checks=False), method="average")
    raw = fcluster(z, t=n_clusters, criterion="maxclust")
    relabel: dict[int, int] = {}
    return [relabel.setdefault(int(c), len(relabel)) for c in raw]


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
    """2-D map from a precomputed Fisher alignment matrix (see :func:`atlas_layout`)."""
    n = len(ids)
    a = np.asarray(fisher, dtype=np.float64)
    a = (a + a.T) / 2
    dis = np.clip(1.0 - a, 0.0, 2.0)
    np.fill_diagonal(dis, 0.0)
    xy = classical_mds(dis, 2)
    k = min(n, n_clusters if n_clusters is not None else cluster_count(n))
    labels = agglomerative_clusters(dis, k)
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
