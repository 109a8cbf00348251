"""The atlas's clusters: average-linkage agglomerative clustering of the tasks' dissimilarity (1 − Fisher alignment),
cut where the mean silhouette is highest (:func:`cluster_count`). Re-exported by :mod:`atlas.analysis`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_SILHOUETTE = 0.25
"""Below this mean silhouette a cut of the atlas's tree shows no cluster structure (Kaufman & Rousseeuw's floor of
"weak structure"); see :func:`cluster_count`."""

MAX_CLUSTERS = 40
"""The most clusters the atlas tries (a colour per cluster must stay readable)."""


def silhouette(dissimilarity: np.ndarray, labels: Sequence[int]) -> float:
    """Mean silhouette of ``labels`` under a precomputed ``dissimilarity`` (n × n): per task ``(b − a) / max(a, b)``
    with ``a`` its mean dissimilarity to its own cluster's other tasks and ``b`` the least mean dissimilarity to
    another cluster; 0 for a task alone in its cluster (Rousseeuw 1987, as scikit-learn's ``silhouette_score``)."""
    lab = np.asarray(labels)
    d = np.asarray(dissimilarity, dtype=np.float64)
    ks = np.unique(lab)
    if not 2 <= len(ks) <= len(lab) - 1:
        return 0.0
    onehot = (lab[:, None] == ks[None, :]).astype(np.float64)  # n × k
    sizes = onehot.sum(axis=0)
    sums = d @ onehot  # each task's summed dissimilarity to each cluster
    own = np.argmax(onehot, axis=1)
    n_own = sizes[own] - 1
    a = np.where(n_own > 0, sums[np.arange(len(lab)), own] / np.maximum(n_own, 1), 0.0)
    other = np.where(onehot > 0, np.inf, sums / sizes[None, :])
    b = other.min(axis=1)
    den = np.maximum(a, b)
    s = np.where((n_own > 0) & (den > 0), (b - a) / np.where(den > 0, den, 1.0), 0.0)
    return float(s.mean())


def cluster_count(dissimilarity: np.ndarray) -> int:
    """Number of atlas clusters for tasks of pairwise ``dissimilarity`` (n × n, 1 − Fisher alignment in [0, 2]).

    The cut of the average-linkage tree into ``k ∈ [2, min(n − 1, MAX_CLUSTERS)]`` clusters with the highest mean
    :func:`silhouette` (ties: fewer clusters); when none reaches ``MIN_SILHOUETTE``, no cut shows structure, and
    the tasks form one cluster if their mean alignment is at least ½ (mean dissimilarity ≤ ½), else one cluster
    each (capped at ``MAX_CLUSTERS``). One task: 1; none: 0.
    """
    n = int(np.shape(dissimilarity)[0])
    return n if n <= 1 else _count(*_linkage(dissimilarity))


def cluster_labels(dissimilarity: np.ndarray, n_clusters: int | None = None) -> list[int]:
    """The atlas's clusters of tasks of pairwise ``dissimilarity``: :func:`agglomerative_clusters` into
    ``n_clusters`` (default :func:`cluster_count`), from one average-linkage tree."""
    n = int(np.shape(dissimilarity)[0])
    if n <= 1:
        return [0] * n
    d, tree = _linkage(dissimilarity)
    return _cut(tree, n, n_clusters if n_clusters is not None else _count(d, tree))


def _count(d: np.ndarray, tree: np.ndarray) -> int:
    """:func:`cluster_count` of the symmetrised dissimilarity ``d`` (n ≥ 2) and its tree."""
    from scipy.cluster.hierarchy import cut_tree

    n = int(d.shape[0])
    best_k, best_s = 1, -1.0
    ks = list(range(2, min(n - 1, MAX_CLUSTERS) + 1))
    cuts = cut_tree(tree, n_clusters=ks) if ks else np.empty((n, 0), dtype=int)  # one tree, every cut
    for k, labels in zip(ks, cuts.T, strict=True):
        s = silhouette(d, labels)
        if s > best_s + 1e-12:
            best_k, best_s = k, s
    if best_s >= MIN_SILHOUETTE:
        return best_k
    mean = float(d[~np.eye(n, dtype=bool)].mean())
    return 1 if mean <= 0.5 else min(n, MAX_CLUSTERS)


def _linkage(dissimilarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The symmetrised, zero-diagonal ``dissimilarity`` and its average-linkage tree (scipy's ``linkage``)."""
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    d = np.array(dissimilarity, dtype=np.float64)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    d = np.clip(d, 0.0, None)
    return d, linkage(squareform(d, checks=False), method="average")


def agglomerative_clusters(dissimilarity: np.ndarray, n_clusters: int) -> list[int]:
    """Average-linkage clusters, labels ``0..n_clusters-1`` numbered by first appearance: exactly
    ``min(n_clusters, n)`` of them. The tree is cut at the merge that leaves that many (``fcluster``'s
    ``maxclust`` cuts by height and gave fewer when the top heights tie, as unrelated tasks' clamped
    alignments of 0 make them); ties are broken by the linkage's merge order, so the answer is deterministic."""
    n = int(dissimilarity.shape[0])
    return [0] * n if n <= 1 or n_clusters <= 1 else _cut(_linkage(dissimilarity)[1], n, n_clusters)


def _cut(tree: np.ndarray, n: int, n_clusters: int) -> list[int]:
    """The tree of ``n ≥ 2`` tasks cut into ``min(n_clusters, n)`` clusters (at least one), numbered by first
    appearance."""
    from scipy.cluster.hierarchy import cut_tree

    raw = cut_tree(tree, n_clusters=max(1, min(n_clusters, n))).ravel()
    relabel: dict[int, int] = {}
    return [relabel.setdefault(int(c), len(relabel)) for c in raw]
