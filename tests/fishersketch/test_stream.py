"""Samples fed in pieces: ``update(..., sample_starts=)`` counting and ``Sketcher.stream`` (SampleStream)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fishersketch import Sketcher, SketchError, SketchSpec, SketchState
from fishersketch.sketcher import SampleStream

D, K = 12, 300


def _samples(n_samples: int, seed: int = 0, max_len: int = 15) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous samples; with 5 or more, samples 3 and 4 share an id (a duplicate upload) side by side."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len, size=n_samples)
    sids = rng.choice(10**12, size=n_samples, replace=False)
    if n_samples > 4:
        sids[4] = sids[3]
    ids = np.repeat(sids, lengths)
    ends = np.zeros(ids.size, dtype=bool)
    ends[np.cumsum(lengths) - 1] = True
    a = rng.standard_normal((ids.size, D)).astype(np.float32)
    e = rng.standard_normal((ids.size, K)).astype(np.float32)
    return a, e, ids, ends


def _per_sample(sk: Sketcher, a: np.ndarray, e: np.ndarray, ids: np.ndarray, ends: np.ndarray) -> SketchState:
    """The reference: one plain ``update`` per whole sample."""
    state = SketchState.empty(sk.spec)
    lo = 0
    for hi in (np.flatnonzero(ends) + 1).tolist():
        sk.update(state, a[lo:hi], e[lo:hi], ids[lo:hi])
        lo = hi
    return state


def _rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-300))


def _assert_same(x: SketchState, y: SketchState, tol: float = 1e-12) -> None:
    assert _rel(x.sums, y.sums) <= tol and _rel(x.sq_norms, y.sq_norms) <= tol
    np.testing.assert_array_equal(x.token_counts, y.token_counts)
    np.testing.assert_array_equal(x.sample_counts, y.sample_counts)


@pytest.mark.parametrize("kind", ["dense", "srht"])
@pytest.mark.parametrize("granularity", ["token", "sequence"])
def test_stream_of_pieces_equals_one_update_per_whole_sample(kind: str, granularity: str) -> None:
    spec = SketchSpec(d=D, K=K, m=64, seed=3, error_projection=kind, granularity=granularity)
    sk = Sketcher(spec, chunk_rows=8)
    a, e, ids, ends = _samples(20)
    ref = _per_sample(sk, a, e, ids, ends)
    assert ref.n_samples == 20 and ref.n_tokens == ids.size
    for piece in (1, 3, 7, 64, ids.size):  # pieces cut samples anywhere (piece 1: every token alone)
        state = SketchState.empty(spec)
        stream = sk.stream(state)
        assert isinstance(stream, SampleStream)
        for lo in range(0, ids.size, piece):
            stream.add(a[lo : lo + piece], e[lo : lo + piece], torch.from_numpy(ids[lo : lo + piece]),
                       torch.from_numpy(ends[lo : lo + piece]))
            if granularity == "sequence":  # the state only ever holds whole samples
                assert state.n_tokens == int(np.flatnonzero(ends[: lo + piece]).max(initial=-1)) + 1
        assert stream.close() is state and stream.open_sample is None
        _assert_same(state, ref)


def test_stream_default_ends_and_context_manager() -> None:
    spec = SketchSpec(d=D, K=K, m=32, seed=1, granularity="sequence")
    sk = Sketcher(spec, chunk_rows=8)
    a, e, ids, ends = _samples(6, seed=2)
    keep = ~np.isin(np.arange(ids.size), np.flatnonzero(ids == ids[ends][3]))  # drop the duplicate pair
    a, e, ids, ends = a[keep], e[keep], ids[keep], ends[keep]
    state = SketchState.empty(spec)
    with sk.stream(state) as stream:
        stream.add(a, e, ids)  # without sample_ends every sample of the call ends in it
    _assert_same(state, _per_sample(sk, a, e, ids, ends))
    assert repr(stream).startswith("SampleStream(")


def test_update_sample_starts_counts_a_sample_once_over_many_calls() -> None:
    spec = SketchSpec(d=D, K=K, m=32, seed=5)
    sk = Sketcher(spec, chunk_rows=8)
    a, e, ids, ends = _samples(10, seed=4, max_len=30)
    starts = np.r_[True, ends[:-1]]
    default, counted = SketchState.empty(spec), SketchState.empty(spec)
    for lo in range(0, ids.size, 4):
        sl = slice(lo, lo + 4)
        sk.update(default, a[sl], e[sl], ids[sl])
        sk.update(counted, a[sl], e[sl], ids[sl], sample_starts=torch.from_numpy(starts[sl]))
    assert counted.n_samples == 10  # the duplicate pair counts twice: two uploaded samples
    assert default.n_samples > 10  # default: every distinct id of a call counts once per call
    assert np.array_equal(counted.sums, default.sums) and np.array_equal(counted.token_counts, default.token_counts)
    _assert_same(counted, _per_sample(sk, a, e, ids, ends))
    one = sk.sketch(a[:5], e[:5], np.full(5, 7))
    assert one.n_samples == 1
    assert sk.sketch(a[:5], e[:5], np.full(5, 7), sample_starts=np.zeros(5, dtype=bool)).n_samples == 0


def test_sequence_update_with_sample_starts_separates_equal_ids() -> None:
    spec = SketchSpec(d=D, K=K, m=32, seed=6, granularity="sequence")
    sk = Sketcher(spec, chunk_rows=8)
    a, e, ids, ends = _samples(8, seed=7)
    whole = sk.sketch(a, e, ids, sample_starts=np.r_[True, ends[:-1]])
    _assert_same(whole, _per_sample(sk, a, e, ids, ends))
    assert whole.n_samples == 8 and sk.sketch(a, e, ids).n_samples == 7  # default groups by id


BAD_STARTS = {
    "float": lambda n: np.ones(n, dtype=np.float32),
    "short": lambda n: np.ones(n - 1, dtype=bool),
    "id change without start": lambda n: np.r_[True, np.zeros(n - 1, dtype=bool)],
}


@pytest.mark.parametrize("case", sorted(BAD_STARTS))
@pytest.mark.parametrize("granularity", ["token", "sequence"])
def test_bad_sample_starts_raise_and_leave_state_untouched(case: str, granularity: str) -> None:
    sk = Sketcher(SketchSpec(d=D, K=K, m=16, seed=0, granularity=granularity), chunk_rows=8)
    a, e, ids, _ = _samples(4, seed=8)
    state = sk.sketch(a, e, ids)
    blob = state.to_bytes()
    with pytest.raises(SketchError):
        sk.update(state, a, e, ids, sample_starts=BAD_STARTS[case](ids.size))
    assert state.to_bytes() == blob


def test_sequence_update_refuses_a_continued_sample() -> None:
    sk = Sketcher(SketchSpec(d=D, K=K, m=16, seed=0, granularity="sequence"), chunk_rows=8)
    a, e, _, _ = _samples(1, seed=9)
    with pytest.raises(SketchError, match="stream"):
        sk.sketch(a, e, np.zeros(len(a), dtype=np.int64), sample_starts=np.zeros(len(a), dtype=bool))


@pytest.mark.parametrize("granularity", ["token", "sequence"])
def test_stream_errors_leave_state_and_stream_untouched(granularity: str) -> None:
    spec = SketchSpec(d=D, K=K, m=16, seed=2, granularity=granularity)
    sk = Sketcher(spec, chunk_rows=8)
    a = torch.randn(6, D, generator=torch.Generator().manual_seed(0))
    e = torch.randn(6, K, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([1, 1, 2, 2, 2, 3])
    ends = torch.tensor([False, True, False, False, True, True])
    state = SketchState.empty(spec)
    stream = sk.stream(state)
    stream.add(a[:3], e[:3], ids[:3], ends[:3])  # sample 2 stays open
    assert stream.open_sample == 2
    blob = state.to_bytes()
    bad_a = a.clone()
    bad_a[3, 0] = float("nan")
    failures = [
        (a[3:], e[3:], torch.tensor([3, 3, 3]), ends[3:]),  # the open sample 2 never ended
        (bad_a[3:], e[3:], ids[3:], ends[3:]),  # NaN inside the open sample
        (a[3:], e[3:], ids[3:], torch.tensor([1, 0, 1])),  # not booleans
        (a[3:], e[3:], ids[3:], ends[3:5]),  # wrong length
        (a[3:], e[3:], ids[3:], torch.tensor([False, False, False])),  # id changes inside a sample
    ]
    for args in failures:
        with pytest.raises(SketchError):
            stream.add(*args)
        assert state.to_bytes() == blob and stream.open_sample == 2
    stream.add(a[3:], e[3:], ids[3:], ends[3:])
    stream.close()
    assert state.n_samples == 3 and state.n_tokens == 6
    _assert_same(state, _per_sample(sk, a.numpy(), e.numpy(), ids.numpy(), ends.numpy()))
    # a sample left open is an error at close; its partial sums never reach the state
    stream.add(a[:1], e[:1], ids[:1], torch.tensor([False]))
    with pytest.raises(SketchError, match="not finished"):
        stream.close()
    assert stream.open_sample is None
    if granularity == "sequence":
        assert state.n_tokens == 6
