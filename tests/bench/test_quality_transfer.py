"""Tests of the quality harness's transfer oracle and source-selection metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.quality.transfer import (
    HeadCache,
    HeadOracle,
    normalised_transfer,
    ppl_similarity,
    random_scores,
    seed_agreement,
    selection_metrics,
    transfer_matrix,
)


def test_normalised_transfer_formula_and_floor() -> None:
    base = np.array([2.0, 1.0])
    after = np.array([[1.5, 0.999], [1.8, 0.998]])  # target 1 barely gains from itself: floor 0.01
    U = normalised_transfer(base, after)
    assert U[0, 0] == pytest.approx(1.0)
    assert U[1, 0] == pytest.approx((2.0 - 1.8) / 0.5)
    assert U[0, 1] == pytest.approx((1.0 - 0.999) / 0.01)
    assert U[1, 1] == pytest.approx((1.0 - 0.998) / 0.01)


def test_selection_metrics_perfect_and_reversed() -> None:
    names = ["a", "b", "c", "d"]
    rng = np.random.default_rng(0)
    U = rng.uniform(0.1, 1.0, size=(4, 4))
    perfect = selection_metrics(U, U.copy(), names)
    assert perfect.top1 == 1.0 and perfect.top3 == 1.0
    assert perfect.pct_oracle == pytest.approx(1.0)
    assert perfect.max_regret == pytest.approx(0.0)
    assert perfect.spearman == pytest.approx(1.0)
    worst = selection_metrics(U, -U, names)
    assert worst.top1 == 0.0
    assert worst.spearman == pytest.approx(-1.0)
    assert worst.max_regret > 0


def test_constant_scores_are_the_random_expectation() -> None:
    names = [str(i) for i in range(5)]
    U = np.arange(25, dtype=float).reshape(5, 5) / 25 + 0.1
    m = selection_metrics(U, random_scores(5), names)
    assert m.top1 == pytest.approx(1 / 4)  # 4 candidates per target
    assert m.top3 == pytest.approx(3 / 4)
    ratios = []
    for t in range(5):
        u = np.array([U[s, t] for s in range(5) if s != t])
        ratios.append(u.mean() / u.max())
    assert m.pct_oracle == pytest.approx(float(np.mean(ratios)))
    assert np.isnan(m.spearman)


def test_ties_with_the_oracle_share_the_credit() -> None:
    names = ["t", "x", "y", "z"]
    U = np.zeros((4, 4))
    U[1, 0], U[2, 0], U[3, 0] = 0.9, 0.1, 0.2  # oracle source for target 0 is x
    scores = np.zeros((4, 4))
    scores[1, 0] = scores[2, 0] = 1.0  # x and y tied at the top
    m = selection_metrics(U, scores, names, candidates=[[1, 2, 3], [0], [0], [0]])
    # target 0: P(pick x) = 1/2; targets 1-3 have a single candidate (always right)
    assert m.top1 == pytest.approx((0.5 + 3) / 4)


def test_ppl_similarity_prefers_close_losses() -> None:
    s = ppl_similarity([1.0, 1.1, 3.0])
    assert s[1, 0] > s[2, 0]
    assert s[0, 0] == 0.0


def test_head_oracle_self_training_helps_most() -> None:
    torch.manual_seed(0)
    K, d, n = 12, 6, 400
    W0 = 0.1 * torch.randn(K, d)
    a = torch.randn(3, n, d)
    a[..., -1] = 1.0  # a bias column, so the head can learn each task's label prior
    # three tasks whose next tokens come from different class subsets
    ys = [torch.randint(0, 4, (n,)), torch.randint(0, 4, (n,)), torch.randint(8, 12, (n,))]
    train = {f"t{i}": HeadCache(a=a[i, : n // 2], y=ys[i][: n // 2]) for i in range(3)}
    evals = {f"t{i}": HeadCache(a=a[i, n // 2 :], y=ys[i][n // 2 :]) for i in range(3)}
    oracle = HeadOracle(W0=W0, transform=lambda z: z, steps=60, lr=0.05, batch_tokens=64)
    res = transfer_matrix(oracle, train, evals, seed=0)
    assert np.allclose(np.diag(res.U), 1.0)
    assert res.U[1, 0] > res.U[2, 0]  # a source with the same label support transfers, a disjoint one does not
    assert res.U[2, 0] < 0.5
    W = oracle.finetune(train["t0"], seed=0)
    assert oracle.loss(W, evals["t0"]) < oracle.loss(W0, evals["t0"])


def test_seed_agreement_identical_noisy_and_unrelated_repeats() -> None:
    rng = np.random.default_rng(3)
    truth = rng.normal(size=(9, 9))
    same = seed_agreement([truth, truth.T.copy(), truth])
    assert same.pairwise == pytest.approx(1.0) and same.of_mean == pytest.approx(1.0)
    assert same.ceiling == pytest.approx(1.0) and same.n == 3
    noisy = seed_agreement([truth + rng.normal(scale=0.5, size=(9, 9)) for _ in range(3)])
    assert 0.3 < noisy.pairwise < 1.0
    # Spearman–Brown: the mean of three repeats agrees better than any two of them, and the ceiling is its root
    assert noisy.pairwise < noisy.of_mean < 1.0
    assert noisy.ceiling == pytest.approx(np.sqrt(noisy.of_mean))
    unrelated = seed_agreement([rng.normal(size=(9, 9)) for _ in range(3)])
    assert abs(unrelated.pairwise) < 0.5
    assert np.isnan(seed_agreement([truth]).pairwise)
