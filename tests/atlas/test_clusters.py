"""The atlas's clusters (:mod:`atlas.clusters`): the silhouette, and the number of clusters it chooses.

Until 2026-12-01 the atlas cut its tree into ``round(sqrt(n / 2))`` clusters whatever the alignments: three unrelated
tasks were one cluster, and two tight groups of twelve tasks were cut into three.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas import analysis
from atlas.clusters import MAX_CLUSTERS, cluster_count, silhouette


def _dissimilarity(points: np.ndarray) -> np.ndarray:
    """Euclidean distances of ``points`` (n × dims), scaled into [0, 2] like 1 − alignment."""
    d = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    return 2.0 * d / max(float(d.max()), 1e-12)


@settings(max_examples=80, deadline=None)
@given(st.integers(3, 30), st.integers(2, 6), st.integers(0, 10_000))
def test_silhouette_is_scikit_learn_s(n: int, k: int, seed: int) -> None:
    """The mean silhouette on a precomputed dissimilarity equals scikit-learn's ``silhouette_score`` (singletons 0)."""
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    d = _dissimilarity(rng.normal(size=(n, 3)))
    labels = rng.integers(0, min(k, n - 1), size=n)
    if not 2 <= len(set(labels.tolist())) <= n - 1:
        assert silhouette(d, labels) == 0.0
        return
    assert silhouette(d, labels) == pytest.approx(metrics.silhouette_score(d, labels, metric="precomputed"),
                                                  abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(3, 12), st.integers(0, 10_000))
def test_well_separated_groups_are_found(groups: int, size: int, seed: int) -> None:
    """``groups`` tight groups far apart are cut into exactly ``groups`` clusters, each group one cluster."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(groups, 8)) * 10.0
    points = np.concatenate([c + 0.1 * rng.normal(size=(size, 8)) for c in centres])
    d = _dissimilarity(points)
    assert cluster_count(d) == groups
    labels = analysis.agglomerative_clusters(d, groups)
    for g in range(groups):
        assert len(set(labels[g * size:(g + 1) * size])) == 1


@pytest.mark.parametrize("n", [2, 3, 5, 17])
def test_tasks_without_structure_are_one_cluster_when_alike_and_their_own_when_unrelated(n: int) -> None:
    """No cut shows structure when every pair is about equally far: alike tasks (alignments about 0.9) are one
    cluster, unrelated ones (alignments about 0) one each — three unrelated tasks were one cluster before."""
    rng = np.random.default_rng(n)
    noise = rng.uniform(-0.01, 0.01, size=(n, n))
    noise = (noise + noise.T) / 2
    for alignment, expected in ((0.9, 1), (0.0, min(n, MAX_CLUSTERS))):
        d = np.clip(1.0 - alignment + noise, 0.0, 2.0)
        np.fill_diagonal(d, 0.0)
        assert cluster_count(d) == expected
        assert len(set(analysis.agglomerative_clusters(d, expected))) == expected
    assert cluster_count(np.zeros((1, 1))) == 1 and cluster_count(np.zeros((0, 0))) == 0


def test_the_atlas_map_colours_unrelated_tasks_apart_and_groups_twins() -> None:
    """:func:`atlas.analysis.layout_from_alignment` (what ``/v1/atlas`` draws): three tasks aligned at about 0.1 with
    each other are three clusters (one before); two tasks of each of three families (within 0.9, across 0.2) three."""
    unrelated = np.array([[1.0, 0.1, 0.12], [0.1, 1.0, 0.08], [0.12, 0.08, 1.0]])
    amap = analysis.layout_from_alignment([1, 2, 3], ["a", "b", "c"], unrelated)
    assert amap.n_clusters == 3 and len({p.cluster for p in amap.points}) == 3
    family = np.repeat(np.arange(3), 2)
    twins = np.where(family[:, None] == family[None, :], 0.9, 0.2)
    np.fill_diagonal(twins, 1.0)
    amap = analysis.layout_from_alignment(list(range(6)), [f"t{i}" for i in range(6)], twins)
    assert amap.n_clusters == 3
    assert [p.cluster for p in amap.points] == [0, 0, 1, 1, 2, 2]
