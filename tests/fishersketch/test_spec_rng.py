"""Spec validation, fingerprints and the SplitMix64 streams / A/B split."""

from __future__ import annotations

import numpy as np
import pytest

from fishersketch import AUTO_SRHT_MIN_K, SketchError, SketchSpec, split_of, split_of_array
from fishersketch.rng import random_signs, random_subset, stream_key


def test_auto_resolves_by_k_and_fingerprints_the_resolved_kind() -> None:
    small = SketchSpec(d=8, K=AUTO_SRHT_MIN_K - 1, m=64)
    large = SketchSpec(d=8, K=AUTO_SRHT_MIN_K, m=64)
    assert small.error_projection == "dense"
    assert large.error_projection == "srht"
    assert SketchSpec(d=8, K=AUTO_SRHT_MIN_K, m=64, error_projection="srht") == large
    assert SketchSpec(d=8, K=AUTO_SRHT_MIN_K, m=64, error_projection="srht").fingerprint() == large.fingerprint()
    assert SketchSpec(d=8, K=AUTO_SRHT_MIN_K, m=64, error_projection="dense").fingerprint() != large.fingerprint()


def test_fingerprint_changes_with_every_field() -> None:
    base = SketchSpec(d=8, K=10, m=64, seed=3)
    variants = [
        SketchSpec(d=9, K=10, m=64, seed=3),
        SketchSpec(d=8, K=11, m=64, seed=3),
        SketchSpec(d=8, K=10, m=65, seed=3),
        SketchSpec(d=8, K=10, m=64, seed=4),
        SketchSpec(d=8, K=10, m=64, seed=3, error_projection="srht"),
        SketchSpec(d=8, K=10, m=64, seed=3, granularity="sequence"),
    ]
    fps = {v.fingerprint() for v in variants}
    assert base.fingerprint() not in fps
    assert len(fps) == len(variants)
    assert base.fingerprint() == SketchSpec(d=8, K=10, m=64, seed=3).fingerprint()
    assert base.fingerprint().startswith("fsk1-")
    assert SketchSpec.from_dict(base.to_dict()) == base


@pytest.mark.parametrize(
    "kwargs",
    [
        {"d": 0, "K": 4},
        {"d": 4, "K": 0},
        {"d": 4, "K": 4, "m": 0},
        {"d": 4, "K": 4, "seed": -1},
        {"d": 4.0, "K": 4},
        {"d": 4, "K": 4, "error_projection": "gaussian"},
        {"d": 4, "K": 4, "granularity": "document"},
    ],
)
def test_invalid_specs_raise(kwargs: dict) -> None:
    with pytest.raises(SketchError):
        SketchSpec(**kwargs)
    with pytest.raises(ValueError):
        SketchSpec(**kwargs)


def test_from_dict_refuses_other_algorithm_version() -> None:
    data = SketchSpec(d=4, K=4).to_dict()
    data["algorithm_version"] = 999
    with pytest.raises(SketchError, match="version"):
        SketchSpec.from_dict(data)


def test_split_scalar_and_vector_agree_and_are_balanced() -> None:
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.integers(-(2**62), 2**62, size=2000), np.arange(2000)])
    vec = split_of_array(ids, seed=7)
    assert [split_of(int(i), 7) for i in ids[:300]] == vec[:300].tolist()
    assert set(np.unique(vec).tolist()) == {0, 1}
    # Balanced: within 4 standard deviations of 1/2.
    assert abs(vec.mean() - 0.5) < 4 * 0.5 / np.sqrt(ids.size)
    # Another seed gives another split.
    assert (split_of_array(ids, seed=8) != vec).mean() > 0.4


def test_random_signs_are_rademacher_and_block_independent() -> None:
    key = stream_key(5, 1)
    a = random_signs(key, 37, 129)
    b = random_signs(key, 37, 129, block_rows=3)
    assert a.dtype == np.int8 and set(np.unique(a).tolist()) == {-1, 1}
    np.testing.assert_array_equal(a, b)
    assert abs(a.mean()) < 4 / np.sqrt(a.size)
    # Prefix property: fewer rows give the leading rows.
    np.testing.assert_array_equal(random_signs(key, 5, 129), a[:5])


def test_random_subset_distinct_sorted_and_uniform() -> None:
    idx = random_subset(stream_key(1, 4), 100, 30)
    assert np.all(np.diff(idx) > 0) and idx.min() >= 0 and idx.max() < 100
    rep = random_subset(stream_key(1, 4), 8, 20)
    counts = np.bincount(rep, minlength=8)
    assert counts.sum() == 20 and counts.min() >= 2 and counts.max() <= 3
    # Inclusion frequencies over many keys are ~ k / n.
    hits = np.zeros(50)
    for s in range(400):
        hits[random_subset(stream_key(s, 4), 50, 10)] += 1
    assert np.all(np.abs(hits / 400 - 0.2) < 0.1)
