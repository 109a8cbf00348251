"""Tests of the label-overlap sweep's building blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.quality.overlap import exact_fisher_alignment_np, head_errors, linear_cka, scov, task_labels


def test_linear_cka_of_identical_features_is_one() -> None:
    x = np.random.default_rng(0).normal(size=(50, 8))
    assert linear_cka(x, x) == pytest.approx(1.0)
    assert linear_cka(x, 3 * x + 1) == pytest.approx(1.0)  # invariant to scale and shift


def test_labels_stay_in_the_task_classes_and_errors_sum_to_zero() -> None:
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.normal(size=(100, 4)), np.ones((100, 1))], axis=1)
    classes = np.arange(3, 7)
    y = task_labels(a, rng.normal(size=(10, 4)), classes, 3.0, rng)
    assert set(np.unique(y)) <= set(classes.tolist())
    e = head_errors(a, y, rng.normal(size=(10, 5)))
    assert np.allclose(e.sum(axis=1), 0.0)


def test_numpy_exact_alignment_matches_the_product() -> None:
    from fishersketch import exact_alignment

    rng = np.random.default_rng(1)
    a1, a2 = rng.normal(size=(30, 5)), rng.normal(size=(25, 5))
    e1, e2 = rng.normal(size=(30, 7)), rng.normal(size=(25, 7))
    ours = exact_fisher_alignment_np(a1, e1, a2, e2)
    theirs = exact_alignment(torch.from_numpy(a1), torch.from_numpy(e1), torch.from_numpy(a2), torch.from_numpy(e2),
                             statistic="v")
    assert ours == pytest.approx(float(theirs.fisher), rel=1e-6)
    assert scov(e1.T @ e1, e1.T @ e1) == pytest.approx(1.0)
