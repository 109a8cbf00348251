"""``sketch_groups``: one batch, many states — each equal to sketching its group alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fishersketch import Sketcher, SketchError, SketchSpec
from fishersketch.groups import sketch_groups


def _alone(sk: Sketcher, a: torch.Tensor, e: torch.Tensor, groups: np.ndarray, sample_ids: list[int], g: int):
    rows = np.flatnonzero(groups == g)
    ids = np.full(rows.size, sample_ids[g], dtype=np.int64)
    return sk.sketch(a[rows], e[rows], ids)


@pytest.mark.parametrize("granularity", ["token", "sequence"])
@pytest.mark.parametrize("kind", ["dense", "srht"])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_each_group_equals_its_own_sketch(kind: str, granularity: str, data: st.DataObject) -> None:
    spec = SketchSpec(d=12, K=70, m=128, seed=3, error_projection=kind, granularity=granularity)
    n_groups = data.draw(st.integers(1, 6))
    sizes = data.draw(st.lists(st.integers(1, 9), min_size=n_groups, max_size=n_groups))
    order = data.draw(st.permutations(list(np.repeat(np.arange(n_groups), sizes))))
    groups = np.asarray(order, dtype=np.int64)
    if granularity == "sequence":  # a group's tokens are one sample: keep them contiguous
        groups = np.sort(groups)
    sample_ids = data.draw(st.lists(st.integers(0, 2**62), min_size=n_groups, max_size=n_groups))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    a = torch.from_numpy(rng.normal(size=(groups.size, spec.d)).astype(np.float32))
    e = torch.from_numpy(rng.normal(size=(groups.size, spec.K)).astype(np.float32))
    sk = Sketcher(spec, chunk_rows=8)
    states = sketch_groups(sk, a, e, groups, n_groups, sample_ids=sample_ids)
    for g, got in enumerate(states):
        want = _alone(sk, a, e, groups, sample_ids, g)
        scale = max(float(np.abs(want.sums).max()), 1e-12)
        assert np.abs(got.sums - want.sums).max() / scale < 1e-5
        np.testing.assert_allclose(got.sq_norms, want.sq_norms, rtol=1e-5)
        assert got.token_counts.tolist() == want.token_counts.tolist()
        assert got.sample_counts.tolist() == want.sample_counts.tolist()


def test_empty_group_and_bad_ids() -> None:
    spec = SketchSpec(d=4, K=9, m=64, seed=0)
    sk = Sketcher(spec)
    a, e = torch.randn(3, 4), torch.randn(3, 9)
    states = sketch_groups(sk, a, e, [0, 0, 2], 3)
    assert states[1].n_tokens == 0 and states[1].n_samples == 0 and states[0].n_tokens == 2
    with pytest.raises(SketchError):
        sketch_groups(sk, a, e, [0, 3, 1], 3)
    with pytest.raises(SketchError):
        sketch_groups(sk, a, e, [0, 1], 2)
    with pytest.raises(SketchError):
        sketch_groups(sk, a, e.clone().fill_(float("nan")), [0, 1, 1], 2)
