"""Exact kernel reference against materialised Fisher matrices and the naive per-pair loop."""

from __future__ import annotations

import numpy as np
import pytest

from fishersketch import SketchError, exact_alignment, exact_alignment_naive, exact_matrix


def _task(n: int, d: int, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, d))
    e = rng.standard_normal((n, K)) + 0.5 * a[:, :1]  # coupled
    return a, e


def _cos(x: np.ndarray, y: np.ndarray) -> float:
    return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))


def test_exact_equals_materialised_fisher_cosines() -> None:
    (a1, e1), (a2, e2) = _task(17, 3, 4, 0), _task(11, 3, 4, 1)
    F1 = np.mean([np.outer(np.kron(a, e), np.kron(a, e)) for a, e in zip(a1, e1, strict=True)], axis=0)
    F2 = np.mean([np.outer(np.kron(a, e), np.kron(a, e)) for a, e in zip(a2, e2, strict=True)], axis=0)
    Ma1, Ma2 = a1.T @ a1 / 17, a2.T @ a2 / 11
    Ge1, Ge2 = e1.T @ e1 / 17, e2.T @ e2 / 11
    res = exact_alignment(a1, e1, a2, e2, tile=4)
    assert res.fisher == pytest.approx(_cos(F1, F2), rel=1e-12)
    assert res.activation == pytest.approx(_cos(Ma1, Ma2), rel=1e-12)
    assert res.error == pytest.approx(_cos(Ge1, Ge2), rel=1e-12)
    assert res.proxy == pytest.approx(_cos(Ma1, Ma2) * _cos(Ge1, Ge2), rel=1e-12)
    assert res.rho == pytest.approx(res.fisher / res.proxy, rel=1e-12)
    assert res.s_ae[2] == pytest.approx(float((F1 * F2).sum()), rel=1e-12)
    # Kronecker structure: the proxy is the cosine of M_a (x) Gamma_e.
    assert res.proxy == pytest.approx(_cos(np.kron(Ma1, Ge1), np.kron(Ma2, Ge2)), rel=1e-12)


def test_sequence_kernel_equals_materialised_shared_parameter_fisher() -> None:
    (a1, e1), (a2, e2) = _task(12, 3, 2, 2), _task(9, 3, 2, 3)
    ids1 = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3])
    ids2 = np.array([5, 5, 6, 6, 6, 6, 7, 7, 5])

    def fisher(a: np.ndarray, e: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        gs, Ms, Gs = [], [], []
        for s in np.unique(ids):
            t = ids == s
            gs.append(sum(np.kron(x, y) for x, y in zip(a[t], e[t], strict=True)))
            Ms.append(a[t].T @ a[t])
            Gs.append(e[t].T @ e[t])
        F = np.mean([np.outer(g, g) for g in gs], axis=0)
        return F, np.mean(Ms, axis=0), np.mean(Gs, axis=0)

    F1, M1, G1 = fisher(a1, e1, ids1)
    F2, M2, G2 = fisher(a2, e2, ids2)
    res = exact_alignment(a1, e1, a2, e2, sample_ids_i=ids1, sample_ids_j=ids2, tile=5)
    assert res.fisher == pytest.approx(_cos(F1, F2), rel=1e-12)
    assert res.activation == pytest.approx(_cos(M1, M2), rel=1e-12)
    assert res.error == pytest.approx(_cos(G1, G2), rel=1e-12)


def test_u_statistic_drops_self_pairs_and_tiling_is_exact() -> None:
    (a1, e1), (a2, e2) = _task(30, 5, 7, 4), _task(25, 5, 7, 5)
    v = exact_matrix([(a1, e1), (a2, e2)], statistic="v", tile=7)
    u = exact_matrix([(a1, e1), (a2, e2)], statistic="u", tile=1000)
    np.testing.assert_allclose(u.s_ae[0, 1], v.s_ae[0, 1], rtol=1e-12)
    k = ((a1 @ a1.T) * (e1 @ e1.T)) ** 2
    assert u.s_ae[0, 0] == pytest.approx((k.sum() - np.trace(k)) / (30 * 29), rel=1e-12)
    assert v.s_ae[0, 0] == pytest.approx(k.mean(), rel=1e-12)
    assert v.fisher[0, 0] == pytest.approx(1.0)


def test_naive_loop_agrees_with_gemm_version() -> None:
    (a1, e1), (a2, e2) = _task(9, 4, 3, 6), _task(7, 4, 3, 7)
    for stat in ("v", "u"):
        fast = exact_alignment(a1, e1, a2, e2, statistic=stat)
        slow = exact_alignment_naive(a1, e1, a2, e2, statistic=stat)
        for name in ("fisher", "activation", "error", "proxy", "chi", "rho"):
            assert getattr(slow, name) == pytest.approx(getattr(fast, name), rel=1e-10)


def test_exact_refuses_bad_inputs() -> None:
    a, e = _task(5, 3, 4, 0)
    bad = a.copy()
    bad[0, 0] = np.nan
    with pytest.raises(SketchError):
        exact_alignment(bad, e, a, e)
    with pytest.raises(SketchError):
        exact_alignment(a, e[:4], a, e)
    with pytest.raises(SketchError):
        exact_alignment(a, e, a[:, :2], e)
    with pytest.raises(SketchError):
        exact_alignment(a, e, a, e, sample_ids_i=np.arange(5))
    with pytest.raises(SketchError):
        exact_matrix([(a, e)], statistic="w")  # type: ignore[arg-type]


def test_zero_task_gives_zero_not_nan() -> None:
    a, e = _task(5, 3, 4, 0)
    res = exact_alignment(np.zeros_like(a), e, a, e)
    assert res.fisher == 0.0 and res.activation == 0.0 and res.rho == 1.0
