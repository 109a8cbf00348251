"""SketchState: merge equals the union in any order and sharding; serialisation; signatures."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fishersketch import CorruptState, Sketcher, SketchError, SketchSpec, SketchState, SpecMismatch, split_of_array
from fishersketch.state import FORMAT_VERSION


def _data(n_samples: int, d: int, K: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, size=n_samples)
    ids = np.repeat(rng.choice(10**12, size=n_samples, replace=False), lengths)
    n = ids.size
    a = rng.standard_normal((n, d)).astype(np.float32)
    e = rng.standard_normal((n, K)).astype(np.float32)
    return a, e, ids


def _rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-300))


def _assert_same(x: SketchState, y: SketchState, tol: float = 1e-12) -> None:
    assert _rel(x.sums, y.sums) <= tol
    assert _rel(x.sq_norms, y.sq_norms) <= tol
    np.testing.assert_array_equal(x.token_counts, y.token_counts)
    np.testing.assert_array_equal(x.sample_counts, y.sample_counts)


@pytest.mark.parametrize("kind,granularity", [("dense", "token"), ("srht", "token"), ("srht", "sequence")])
def test_merge_of_shards_equals_state_of_union(kind: str, granularity: str) -> None:
    spec = SketchSpec(d=24, K=300, m=256, seed=4, error_projection=kind, granularity=granularity)
    sk = Sketcher(spec, chunk_rows=16)
    a, e, ids = _data(40, 24, 300)
    whole = sk.sketch(a, e, ids)
    assert whole.n_tokens == ids.size and whole.n_samples == 40
    rng = np.random.default_rng(1)
    uniq = np.unique(ids)
    for n_shards in (2, 3, 5):
        shard_of = dict(zip(uniq.tolist(), rng.integers(0, n_shards, size=uniq.size).tolist(), strict=True))
        shards = []
        for s in range(n_shards):
            rows = np.flatnonzero([shard_of[i] == s for i in ids.tolist()])
            state = SketchState.empty(spec)
            # Stream each shard in batches of whole samples of varying size.
            shard_ids = np.unique(ids[rows])
            for batch in np.array_split(shard_ids, max(1, shard_ids.size // 3)):
                r = rows[np.isin(ids[rows], batch)]
                sk.update(state, a[r], e[r], ids[r])
            shards.append(state)
        for perm in itertools.islice(itertools.permutations(range(n_shards)), 4):
            merged = SketchState.empty(spec)
            for k in perm:
                merged = merged.merge(shards[k])
            _assert_same(merged, whole)
        # Tree-shaped merge, in place.
        left = shards[0].copy()
        for other in shards[1:]:
            left.merge_(other)
        _assert_same(left, whole)


def test_token_batching_does_not_change_token_sums() -> None:
    spec = SketchSpec(d=16, K=3000, m=128, seed=1)
    assert spec.error_projection == "srht"
    sk = Sketcher(spec, chunk_rows=8)
    a, e, ids = _data(12, 16, 3000, seed=3)
    whole = sk.sketch(a, e, ids)
    state = SketchState.empty(spec)
    for lo in range(0, ids.size, 5):  # cuts samples across calls
        sk.update(state, a[lo : lo + 5], e[lo : lo + 5], ids[lo : lo + 5])
    assert _rel(state.sums, whole.sums) <= 1e-12
    np.testing.assert_array_equal(state.token_counts, whole.token_counts)


def test_splits_follow_the_sample_hash() -> None:
    spec = SketchSpec(d=8, K=10, m=32, seed=9)
    a, e, ids = _data(30, 8, 10)
    state = Sketcher(spec, chunk_rows=8).sketch(a, e, ids)
    split = split_of_array(ids, 9)
    np.testing.assert_array_equal(state.token_counts, np.bincount(split, minlength=2))
    feats = Sketcher(spec, chunk_rows=8).features(a, e)
    for f, x in enumerate(feats):
        x = x.double().numpy()
        for s in (0, 1):
            np.testing.assert_allclose(state.sums[s, f], x[split == s].sum(0), rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(state.sq_norms[s, f], (x[split == s] ** 2).sum(), rtol=1e-9)


def test_round_trip_and_refusals() -> None:
    spec = SketchSpec(d=8, K=2500, m=64, seed=2)
    a, e, ids = _data(10, 8, 2500)
    state = Sketcher(spec, chunk_rows=8).sketch(a, e, ids)
    blob = state.to_bytes()
    back = SketchState.from_bytes(blob, spec=spec)
    assert back.spec == spec
    np.testing.assert_array_equal(back.sums, state.sums)
    np.testing.assert_array_equal(back.sq_norms, state.sq_norms)
    np.testing.assert_array_equal(back.token_counts, state.token_counts)
    np.testing.assert_array_equal(back.sample_counts, state.sample_counts)
    assert SketchState.from_bytes(blob).spec.fingerprint() == spec.fingerprint()
    assert SketchState.from_bytes(bytearray(blob)).n_tokens == state.n_tokens

    other = SketchSpec(d=8, K=2500, m=64, seed=3)
    with pytest.raises(SpecMismatch, match="seed=2"):
        SketchState.from_bytes(blob, spec=other)
    with pytest.raises(SpecMismatch):
        state.merge(SketchState.empty(other))
    with pytest.raises(SpecMismatch):
        Sketcher(other, chunk_rows=8).update(state, a, e, ids)

    corrupt = bytearray(blob)
    corrupt[len(blob) // 2] ^= 0x01
    with pytest.raises(CorruptState, match="checksum"):
        SketchState.from_bytes(bytes(corrupt))
    with pytest.raises(CorruptState):
        SketchState.from_bytes(blob[:-10])
    with pytest.raises(CorruptState):
        SketchState.from_bytes(b"NOPE" + blob[4:])
    with pytest.raises(CorruptState):
        SketchState.from_bytes(b"")
    with pytest.raises(ValueError):  # all errors are ValueErrors
        SketchState.from_bytes(b"garbage")


def test_blob_of_another_algorithm_version_is_refused() -> None:
    import hashlib
    import json
    import struct

    spec = SketchSpec(d=4, K=6, m=8)
    blob = SketchState.empty(spec).to_bytes()
    prefix = struct.Struct("<4sHHI")
    _, _, _, hlen = prefix.unpack_from(blob, 0)
    header = json.loads(blob[prefix.size : prefix.size + hlen])
    header["spec"]["algorithm_version"] = 99
    new_header = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body = prefix.pack(b"FSKS", FORMAT_VERSION, 0, len(new_header)) + new_header + blob[prefix.size + hlen : -32]
    forged = body + hashlib.blake2b(body, digest_size=32).digest()
    with pytest.raises(SpecMismatch, match="version"):
        SketchState.from_bytes(forged)


def test_signature_and_accessors() -> None:
    spec = SketchSpec(d=8, K=10, m=64, seed=0)
    empty = SketchState.empty(spec)
    sig = empty.signature()
    assert sig.dtype == np.float32 and sig.shape == (64,) and not sig.any()
    assert not empty.has_signature
    assert not np.isnan(empty.mean("ae")).any() and empty.n_tokens == 0 and empty.n_samples == 0
    a, e, ids = _data(5, 8, 10)
    state = Sketcher(spec, chunk_rows=8).sketch(a, e, ids)
    sig = state.signature()
    assert state.has_signature
    assert sig.dtype == np.float32 and abs(float(np.linalg.norm(sig)) - 1.0) < 1e-6
    mu = state.mean("ae")
    np.testing.assert_allclose(sig, mu / np.linalg.norm(mu), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(state.mean("a"), (state.sums[0, 1] + state.sums[1, 1]) / state.n_tokens)
    n_a = state.token_counts[0]
    np.testing.assert_allclose(state.mean("e", split="A"), state.sums[0, 2] / n_a)
    assert len(state.to_bytes()) < 6 * 64 * 8 + 1024
    zero = Sketcher(spec, chunk_rows=8).sketch(np.zeros((3, 8), np.float32), e[:3], ids[:3])
    assert not zero.has_signature and not zero.signature().any()
    with pytest.raises(SketchError):
        state.mean("x")  # type: ignore[arg-type]


def test_state_size_at_paper_shape() -> None:
    spec = SketchSpec(d=4096, K=128256, m=4096)
    state = SketchState.empty(spec)
    assert state.sums.nbytes == 192 * 1024
    assert state.signature().nbytes == 16 * 1024
    assert len(state.to_bytes()) < 192 * 1024 + 1024


def test_features_are_invariant_to_batch_composition() -> None:
    spec = SketchSpec(d=32, K=5000, m=128, seed=6)
    sk = Sketcher(spec, chunk_rows=16)
    gen = torch.Generator().manual_seed(0)
    a, e = torch.randn(37, 32, generator=gen), torch.randn(37, 5000, generator=gen)
    full = sk.features(a, e)
    parts = [sk.features(a[lo : lo + 7], e[lo : lo + 7]) for lo in range(0, 37, 7)]
    for k in range(3):
        assert torch.equal(torch.cat([p[k] for p in parts]), full[k])
