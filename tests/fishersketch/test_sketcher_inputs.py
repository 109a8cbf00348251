"""Bad inputs raise ValueError and leave the state untouched; shapes and dtypes of features."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fishersketch import Sketcher, SketchError, SketchSpec, SketchState

D, K, M = 6, 9, 16


@pytest.fixture(scope="module")
def sk() -> Sketcher:
    return Sketcher(SketchSpec(d=D, K=K, m=M, seed=0), chunk_rows=8)


@pytest.fixture
def state(sk: Sketcher) -> SketchState:
    gen = torch.Generator().manual_seed(0)
    st = SketchState.empty(sk.spec)
    sk.update(st, torch.randn(5, D, generator=gen), torch.randn(5, K, generator=gen), torch.arange(5))
    return st


def _good(n: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, D, generator=gen), torch.randn(n, K, generator=gen), torch.arange(100, 100 + n)


def _nan_a() -> tuple:
    a, e, i = _good()
    a[2, 3] = float("nan")
    return a, e, i


def _inf_e() -> tuple:
    a, e, i = _good()
    e[0, 0] = float("inf")
    return a, e, i


def _neg_inf_a() -> tuple:
    a, e, i = _good()
    a[1, 0] = -float("inf")
    return a, e, i


BAD = {
    "nan in a": _nan_a,
    "inf in e": _inf_e,
    "-inf in a": _neg_inf_a,
    "a too wide": lambda: (torch.randn(4, D + 1), _good()[1], _good()[2]),
    "e too narrow": lambda: (_good()[0], torch.randn(4, K - 1), _good()[2]),
    "a is 1-D": lambda: (torch.randn(D), torch.randn(1, K), torch.arange(1)),
    "e is 3-D": lambda: (torch.randn(4, D), torch.randn(4, K, 1), torch.arange(4)),
    "row mismatch": lambda: (torch.randn(4, D), torch.randn(3, K), torch.arange(4)),
    "ids too short": lambda: (*_good()[:2], torch.arange(3)),
    "ids 2-D": lambda: (*_good()[:2], torch.arange(4).view(4, 1)),
    "float ids": lambda: (*_good()[:2], torch.arange(4, dtype=torch.float32)),
    "bool ids": lambda: (*_good()[:2], torch.ones(4, dtype=torch.bool)),
    "string ids": lambda: (*_good()[:2], np.array(["a", "b", "c", "d"])),
    "missing ids": lambda: (*_good()[:2], None),
    "integer a": lambda: (torch.ones(4, D, dtype=torch.int64), *_good()[1:]),
    "integer e": lambda: (_good()[0], torch.ones(4, K, dtype=torch.int32), _good()[2]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_and_leaves_state_untouched(sk: Sketcher, state: SketchState, case: str) -> None:
    before = state.to_bytes()
    a, e, ids = BAD[case]()
    with pytest.raises(ValueError):
        sk.update(state, a, e, ids)
    assert state.to_bytes() == before


def test_bad_inputs_raise_sketch_error_from_features(sk: Sketcher) -> None:
    a, e, _ = _nan_a()
    with pytest.raises(SketchError, match="NaN"):
        sk.features(a, e)
    with pytest.raises(SketchError, match="shape"):
        sk.features(torch.randn(3, D + 2), torch.randn(3, K))


def test_empty_batch_is_a_no_op(sk: Sketcher, state: SketchState) -> None:
    before = state.to_bytes()
    sk.update(state, torch.zeros(0, D), torch.zeros(0, K), torch.zeros(0, dtype=torch.int64))
    sk.update(state, np.zeros((0, D)), np.zeros((0, K)), [])
    assert state.to_bytes() == before
    f = sk.features(torch.zeros(0, D), torch.zeros(0, K))
    assert all(x.shape == (0, M) for x in f)


def test_accepts_numpy_lists_and_half_precision(sk: Sketcher) -> None:
    a, e, ids = _good()
    ref = sk.sketch(a, e, ids)
    st = sk.sketch(a.numpy(), e.numpy(), ids.tolist())
    np.testing.assert_array_equal(st.sums, ref.sums)
    st64 = sk.sketch(a.double(), e.double(), ids.numpy().astype(np.int32))
    np.testing.assert_allclose(st64.sums, ref.sums, rtol=1e-5, atol=1e-6)
    bf = sk.sketch(a.bfloat16(), e.bfloat16(), ids)
    assert np.isfinite(bf.sums).all()


def test_feature_shapes_scaling_and_products(sk: Sketcher) -> None:
    a, e, _ = _good(10)
    f_ae, f_a, f_e = sk.features(a, e)
    assert f_ae.shape == f_a.shape == f_e.shape == (10, M) and f_ae.dtype == torch.float32
    torch.testing.assert_close(f_ae, f_a * f_e * M**0.5, rtol=1e-5, atol=1e-5)
    u, u2, v, v2 = sk.project(a, e)
    torch.testing.assert_close(f_a, u * u2 / M**0.5)
    torch.testing.assert_close(f_e, v * v2 / M**0.5)


def test_sequence_features_sum_token_products() -> None:
    spec = SketchSpec(d=D, K=K, m=M, seed=1, granularity="sequence")
    sk = Sketcher(spec, chunk_rows=4)
    a, e, _ = _good(9)
    ids = torch.tensor([7, 7, 3, 3, 3, 7, 1, 1, 1])  # sample 7 is not contiguous, and spans chunks
    f_ae, f_a, _ = sk.features(a, e, ids)
    assert f_ae.shape == (3, M)
    u, u2, v, v2 = Sketcher(SketchSpec(d=D, K=K, m=M, seed=1), chunk_rows=4).project(a, e)
    for row, sid in enumerate([1, 3, 7]):
        t = ids == sid
        s1 = (u[t] * v[t]).double().sum(0)
        s2 = (u2[t] * v2[t]).double().sum(0)
        torch.testing.assert_close(f_ae[row].double(), s1 * s2 / M**0.5, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(f_a[row].double(), (u[t] * u2[t]).double().sum(0) / M**0.5, rtol=1e-5, atol=1e-5)
    st = sk.sketch(a, e, ids)
    assert st.n_samples == 3 and st.n_tokens == 9 and st.n_draws == 3
    single = sk.features(a, e)[0]
    assert single.shape == (1, M)


def test_invalid_sketcher_arguments() -> None:
    spec = SketchSpec(d=D, K=K, m=M)
    with pytest.raises(SketchError):
        Sketcher(spec, dtype=torch.int32)
    with pytest.raises(SketchError):
        Sketcher(spec, chunk_rows=0)
    with pytest.raises(SketchError):
        Sketcher("not a spec")  # type: ignore[arg-type]
    with pytest.raises(SketchError):
        Sketcher(spec).update("state", *_good())  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["dense", "srht"])
def test_path_projections_agree_with_joint_projection(kind: str) -> None:
    sk = Sketcher(SketchSpec(d=D, K=300, m=M, seed=2, error_projection=kind), chunk_rows=8)
    gen = torch.Generator().manual_seed(4)
    a, e = torch.randn(19, D, generator=gen), torch.randn(19, 300, generator=gen)
    u, u2, v, v2 = sk.project(a, e)
    pu, pu2 = sk.project_activations(a)
    pv, pv2 = sk.project_errors(e)
    for x, y in ((u, pu), (u2, pu2), (v, pv), (v2, pv2)):
        assert torch.equal(x, y)
    with pytest.raises(SketchError):
        sk.project_errors(torch.randn(3, 299))
    bad = e.clone()
    bad[3, 7] = float("nan")
    with pytest.raises(SketchError):
        sk.project_errors(bad)


def test_overflow_is_reported_as_such(sk: Sketcher) -> None:
    a, e, ids = _good()
    st = SketchState.empty(sk.spec)
    with pytest.raises(SketchError, match="overflow"):
        sk.update(st, a * 1e30, e, ids)
    assert st.n_tokens == 0 and not st.sums.any()


@pytest.mark.parametrize("error_projection", ["dense", "srht"])
def test_with_chunk_rows_shares_projections_and_agrees_to_float32(error_projection: str) -> None:
    spec = SketchSpec(d=24, K=3000, m=64, seed=3, error_projection=error_projection)
    big = Sketcher(spec, chunk_rows=256)
    small = big.with_chunk_rows(8)
    assert small.chunk_rows <= 16 < big.chunk_rows
    assert small.projections is big.projections
    gen = torch.Generator().manual_seed(2)
    a, e, ids = torch.randn(40, 24, generator=gen), torch.randn(40, 3000, generator=gen), torch.arange(40) // 5
    s_big, s_small = big.sketch(a, e, ids), small.sketch(a, e, ids)
    np.testing.assert_allclose(s_small.signature(), s_big.signature(), rtol=1e-4, atol=1e-6)
    assert s_small.n_tokens == s_big.n_tokens == 40 and s_small.n_samples == s_big.n_samples == 8
    with pytest.raises(SketchError):
        big.with_chunk_rows(0)


def test_inputs_found_by_a_review_of_the_package(sk: Sketcher) -> None:
    """A review of fishersketch (2026-12-07): a tensor requiring grad raised torch's own errors; a state built with
    NaN sums aligned as "zero data" and negative counts gave n = -10; float sample ids of ``sketch_groups`` were cut to
    integers (they decide the split); ``tile=0`` and a CUDA device on a CPU build raised non-domain errors."""
    from fishersketch import align
    from fishersketch.exact import exact_matrix
    from fishersketch.groups import sketch_groups

    a, e, ids = _good(6)
    hooked = (a.clone().requires_grad_(True), e.clone().requires_grad_(True))
    for granularity in ("token", "sequence"):
        spec = SketchSpec(d=D, K=K, m=M, seed=0, granularity=granularity)
        plain = Sketcher(spec, chunk_rows=8).sketch(a, e, ids)
        grad = Sketcher(spec, chunk_rows=8).sketch(*hooked, ids)  # captured by a hook during training
        np.testing.assert_array_equal(grad.sums, plain.sums)
    good = sk.sketch(a, e, ids)
    bad_states = [
        (np.full((2, 3, M), np.nan), np.ones((2, 3)), np.array([5, 5]), np.array([1, 1])),
        (np.ones((2, 3, M)), -np.ones((2, 3)), np.array([5, 5]), np.array([1, 1])),
        (np.ones((2, 3, M)), np.ones((2, 3)), np.array([-5, 5]), np.array([1, 1])),
    ]
    for sums, sq, tokens, samples in bad_states:
        with pytest.raises(SketchError):
            SketchState(sk.spec, sums, sq, tokens, samples)
    with pytest.raises(SketchError, match="SketchSpec"):
        SketchState("x", *bad_states[0])  # type: ignore[arg-type]
    assert np.isfinite(align(good, good).fisher)
    with pytest.raises(SketchError, match="integers"):
        sketch_groups(sk, a, e, np.array([0, 0, 0, 1, 1, 1]), 2, sample_ids=[1.7, 2.2])
    assert len(sketch_groups(sk, a, e, np.array([0, 0, 0, 1, 1, 1]), 2, sample_ids=[1, 2])) == 2
    with pytest.raises(SketchError, match="tile"):
        exact_matrix([(a, e), (a, e)], tile=0)
    if not torch.cuda.is_available():
        with pytest.raises(SketchError, match="CUDA is not available"):
            Sketcher(sk.spec, device="cuda")
