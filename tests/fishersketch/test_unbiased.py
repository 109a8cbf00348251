"""Unbiasedness of the feature maps over independent projection seeds (Proposition "factored sketch")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fishersketch import Sketcher, SketchSpec

N_SEEDS = 200


def _pair(d: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(2, d, generator=gen, dtype=torch.float64)
    e = torch.randn(2, K, generator=gen, dtype=torch.float64)
    # Correlated pair, so the targets are well away from zero.
    a[1] = 0.8 * a[0] + 0.6 * a[1]
    e[1] = 0.7 * e[0] + 0.7 * e[1]
    return a[:1], e[:1], a[1:], e[1:]


def _check_mean(values: np.ndarray, target: float) -> None:
    mean = values.mean()
    se = values.std(ddof=1) / np.sqrt(values.size)
    # The test has power: the standard error is a small fraction of the target.
    assert se < 0.25 * abs(target), (se, target)
    assert abs(mean - target) <= 3 * se, (mean, target, se)


@pytest.mark.parametrize(
    "K,kind",
    [(10, "dense"), (10, "srht"), (100, "srht")],
)
def test_token_features_are_unbiased(K: int, kind: str) -> None:
    d, m = 6, 32
    a, e, a2, e2 = _pair(d, K, seed=K)
    vals = {"ae": [], "a": [], "e": []}
    for seed in range(N_SEEDS):
        sk = Sketcher(SketchSpec(d=d, K=K, m=m, seed=seed, error_projection=kind), dtype=torch.float64,
                      chunk_rows=4)
        f1 = sk.features(a, e)
        f2 = sk.features(a2, e2)
        for name, x, y in zip(("ae", "a", "e"), f1, f2, strict=True):
            vals[name].append(float((x * y).sum()))
    aa = float(a[0] @ a2[0])
    ee = float(e[0] @ e2[0])
    _check_mean(np.array(vals["ae"]), (aa * ee) ** 2)
    _check_mean(np.array(vals["a"]), aa**2)
    _check_mean(np.array(vals["e"]), ee**2)


@pytest.mark.parametrize("kind", ["dense", "srht"])
def test_sequence_features_are_unbiased(kind: str) -> None:
    d, K, m = 5, 12, 32
    gen = torch.Generator().manual_seed(1)
    # Sample 0 has three tokens, sample 1 two; correlated so that <g, g'> is far from zero.
    A = torch.randn(5, d, generator=gen, dtype=torch.float64)
    E = torch.randn(5, K, generator=gen, dtype=torch.float64)
    A[3:] = A[:2] + 0.3 * A[3:]
    E[3:] = E[:2] + 0.3 * E[3:]
    ids = torch.tensor([4, 4, 4, 9, 9])
    ga = A[:3] @ A[3:].T
    ge = E[:3] @ E[3:].T
    target_ae = float((ga * ge).sum()) ** 2
    target_a = float((ga * ga).sum())
    target_e = float((ge * ge).sum())
    vals = {"ae": [], "a": [], "e": []}
    for seed in range(N_SEEDS):
        sk = Sketcher(SketchSpec(d=d, K=K, m=m, seed=seed, error_projection=kind, granularity="sequence"),
                      dtype=torch.float64, chunk_rows=4)
        feats = sk.features(A, E, ids)
        for name, f in zip(("ae", "a", "e"), feats, strict=True):
            assert f.shape == (2, m)
            vals[name].append(float(f[0] @ f[1]))
    _check_mean(np.array(vals["ae"]), target_ae)
    _check_mean(np.array(vals["a"]), target_a)
    _check_mean(np.array(vals["e"]), target_e)


def test_self_inner_product_is_unbiased_for_the_squared_norm_kernel() -> None:
    # E ||Psi(x)||^2 = (|a|^2 |e|^2)^2: the quantity removed by the U-statistic.
    d, K, m = 4, 8, 16
    a, e, _, _ = _pair(d, K, seed=5)
    vals = []
    for seed in range(N_SEEDS):
        sk = Sketcher(SketchSpec(d=d, K=K, m=m, seed=seed), dtype=torch.float64, chunk_rows=4)
        vals.append(float(sk.features(a, e)[0].square().sum()))
    _check_mean(np.array(vals), float(a.square().sum() * e.square().sum()) ** 2)
