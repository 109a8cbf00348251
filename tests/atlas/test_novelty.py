"""The open set's novelty test (atlas.novelty) and the novelty vectors kept in a task's baseline blob.

Pure numpy on synthetic clusters (the distribution is known, so the calibrated false-reject rate can be checked
on fresh draws), and hypothesis for the blob format and the bottom-k merge.
"""

from __future__ import annotations

import itertools
import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas.baselines import BaselineSums
from atlas.novelty import MAX_NOVELTY_SAMPLES, MIN_NOVELTY_SAMPLES, NOVELTY_DIM, SpaceNovelty, project, vectors_needed


def _clusters(rng: np.random.Generator, n_tasks: int, n: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Task means and a shared anisotropic within-task covariance factor (tasks differ along the loose axes)."""
    means = rng.standard_normal((n_tasks, r)) * 3.0
    scales = np.geomspace(5.0, 0.1, r)  # a few loose directions, many tight ones
    return means, np.diag(scales)


def _draw(rng: np.random.Generator, mean: np.ndarray, factor: np.ndarray, n: int) -> np.ndarray:
    return mean + rng.standard_normal((n, len(mean))) @ factor


def test_calibrated_rate_holds_on_fresh_samples_and_a_shifted_kind_is_rejected() -> None:
    rng = np.random.default_rng(0)
    r, n_tasks = 16, 6
    means, factor = _clusters(rng, n_tasks, 100, r)
    vectors = {t: _draw(rng, means[t], factor, 100) for t in range(n_tasks)}
    model = SpaceNovelty.fit(vectors)
    assert model is not None and all(model.tested(t) for t in range(n_tasks))
    fresh = [model.rejects(x, t)[0] for t in range(n_tasks) for x in _draw(rng, means[t], factor, 400)]
    assert 0.02 <= np.mean(fresh) <= 0.09, np.mean(fresh)  # the documented 5 %, cross-fitted
    # A text of another kind: the same loose-axis position, shifted along the tight axes the task never varies in.
    shift = np.zeros(r)
    shift[-8:] = 1.0
    novel = [model.rejects(x + shift, 0)[0] for x in _draw(rng, means[0], factor, 200)]
    assert np.mean(novel) > 0.95
    # ... while a shift of the same length along the loose axes (topic) is no novelty.
    loose = np.zeros(r)
    loose[0] = np.sqrt(8.0)
    assert np.mean([model.rejects(x + loose, 0)[0] for x in _draw(rng, means[0], factor, 200)]) < 0.2


def test_in_sample_calibration_would_be_biased_low() -> None:
    """Why the calibration is cross-fitted: with as many dimensions as samples per task, the in-sample distances
    of the task's own samples are far below those of fresh samples."""
    rng = np.random.default_rng(1)
    r, n_tasks = 60, 3
    means, factor = _clusters(rng, n_tasks, 30, r)
    vectors = {t: _draw(rng, means[t], factor, 30) for t in range(n_tasks)}
    model = SpaceNovelty.fit(vectors)
    assert model is not None
    in_sample = np.median([model.distance(x, 0) for x in vectors[0]])
    fresh = np.median([model.distance(x, 0) for x in _draw(rng, means[0], factor, 200)])
    fit0 = model.task(0)
    assert fit0 is not None
    cross = np.median(fit0.own_distances)
    print(f"median distance: in-sample {in_sample:.3f}, cross-fitted {cross:.3f}, fresh {fresh:.3f}")
    assert in_sample < 0.7 * fresh
    assert abs(cross - fresh) < abs(in_sample - fresh)  # and on the conservative side: fewer false rejects
    assert cross > in_sample


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), rates=st.lists(st.floats(0.001, 0.5), min_size=2, max_size=4))
def test_threshold_is_monotone_in_the_rate_and_confidence_in_range(seed: int, rates: list[float]) -> None:
    rng = np.random.default_rng(seed)
    vectors = {t: rng.standard_normal((MIN_NOVELTY_SAMPLES + t, 5)) + t for t in range(3)}
    model = SpaceNovelty.fit(vectors)
    assert model is not None
    thresholds = [model.threshold(0, r) for r in sorted(rates)]
    assert all(a is not None and b is not None and a >= b for a, b in itertools.pairwise(thresholds))
    x = rng.standard_normal(5) * 10
    novel, d, thr = model.rejects(x, 0, rates[0])
    n = MIN_NOVELTY_SAMPLES
    if math.ceil((n + 1) * (1 - rates[0]) - 1e-9) > n:  # too few own distances to bound this rate: no test
        assert not model.tested(0, rates[0]) and (novel, d, thr) == (False, None, None)
        return
    assert model.tested(0, rates[0])
    assert d is not None and thr is not None and math.isfinite(thr) and novel == (d > thr)
    assert 0.0 <= model.nearer_share(0, d) <= 1.0
    own = model.task(0).own_distances  # type: ignore[union-attr]
    # one minus the split-conformal p-value: below 1 however far (a novelty "none" of an own prompt said 1.0)
    assert model.nearer_share(0, float(own[-1]) * 10 + 1) == len(own) / (len(own) + 1)


def test_small_tasks_and_foreign_vectors_are_not_tested() -> None:
    rng = np.random.default_rng(2)
    vectors = {1: rng.standard_normal((MIN_NOVELTY_SAMPLES - 1, 4)), 2: rng.standard_normal((30, 4))}
    model = SpaceNovelty.fit(vectors)
    assert model is not None and model.tested(2) and not model.tested(1)
    assert model.rejects(np.zeros(4), 1) == (False, None, None)  # too few vectors: never tested
    assert model.rejects(np.zeros(5), 2) == (False, None, None)  # another width (another model): not compared
    assert model.rejects(None, 2) == (False, None, None)  # an older worker sent no vector
    assert SpaceNovelty.fit({1: vectors[1]}) is None
    # widths that differ (an import now refuses them): the space's other width is left out, never a 500 on routes
    mixed = SpaceNovelty.fit({1: rng.standard_normal((30, 4)), 2: rng.standard_normal((30, 4)),
                              3: rng.standard_normal((30, 5))})
    assert mixed is not None and mixed.tested(1) and mixed.tested(2) and not mixed.tested(3)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16), st.integers(MIN_NOVELTY_SAMPLES, 60), st.floats(0.01, 0.2))
def test_a_task_of_identical_samples_accepts_its_own_vector_and_rejects_another(seed: int, n: int,
                                                                                  rate: float) -> None:
    """Samples identical where the model reads them (a preamble longer than the token cap): every own distance is
    0, and the prompt of that preamble (a distance of ~1e-29 from float32 noise) is a tie, not novel."""
    rng = np.random.default_rng(seed)
    one = rng.standard_normal(8).astype(np.float32)
    vectors = {1: np.repeat(one[None, :], n, axis=0).astype(np.float64), 2: rng.standard_normal((40, 8))}
    model = SpaceNovelty.fit(vectors)
    fit1 = model.task(1) if model is not None else None
    assert model is not None and fit1 is not None and float(fit1.own_distances.max()) == 0.0
    # the prompt's vector from another forward batch: the same up to float32 noise (one ulp here)
    same = np.nextafter(one, np.float32(np.inf)).astype(np.float64)
    rejects, distance, threshold = model.rejects(same, 1, rate)
    if not model.tested(1, rate):  # too few samples for the rate: no test, nothing is novel
        assert (rejects, distance, threshold) == (False, None, None)
        assert math.ceil((n + 1) * (1 - rate) - 1e-9) > n
    else:
        assert threshold is not None and distance is not None and distance <= threshold and not rejects
        assert model.rejects(one + 0.5, 1, rate)[0]  # another text is novel for it
    assert (n + 1) * (1 - 0.05) > n or model.rejects(one + 0.5, 1, 0.05)[0]


def test_projection_keeps_narrow_vectors_and_maps_wide_ones_alike() -> None:
    rng = np.random.default_rng(3)
    narrow = rng.standard_normal((3, 64))
    np.testing.assert_allclose(project(narrow), narrow.astype(np.float32))
    wide = rng.standard_normal((3, 1024))
    out = project(wide)
    assert out.shape == (3, NOVELTY_DIM) and out.dtype == np.float32
    np.testing.assert_allclose(project(wide[0]), out[0], rtol=1e-6)  # one row alone, the same map
    # orthonormal columns: lengths shrink to about sqrt(r / H), never grow
    assert np.all(np.linalg.norm(out, axis=1) <= np.linalg.norm(wide, axis=1) + 1e-4)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), sizes=st.lists(st.integers(0, 90), min_size=1, max_size=4))
def test_vectors_merge_as_a_bottom_k_sample_in_any_order_and_round_trip(seed: int, sizes: list[int]) -> None:
    rng = np.random.default_rng(seed)
    parts = []
    for n in sizes:
        keys = rng.choice(2**62, size=n, replace=False).astype(np.int64)
        parts.append(BaselineSums(d=8).with_sample_vectors(keys, rng.standard_normal((n, 8)).astype(np.float32)))
    forward, backward = BaselineSums(d=8), BaselineSums(d=8)
    for p in parts:
        forward = forward.merge(p)
    for p in reversed(parts):
        backward = backward.merge(p)
    all_keys = np.unique(np.concatenate([p.sample_keys for p in parts]))
    assert len(forward.sample_keys) == min(len(all_keys), MAX_NOVELTY_SAMPLES)
    np.testing.assert_array_equal(forward.sample_keys, all_keys[:MAX_NOVELTY_SAMPLES])
    np.testing.assert_array_equal(forward.sample_keys, backward.sample_keys)
    np.testing.assert_array_equal(forward.sample_vectors, backward.sample_vectors)
    again = BaselineSums.from_bytes(forward.to_bytes())
    np.testing.assert_array_equal(again.sample_keys, forward.sample_keys)
    np.testing.assert_array_equal(again.sample_vectors, forward.sample_vectors)
    assert forward.merge(forward).sample_keys.tolist() == forward.sample_keys.tolist()  # a sample counts once


def test_version_1_blobs_read_without_vectors_and_bad_vector_blocks_are_refused() -> None:
    d = 4
    head = struct.pack("<4sIIdqq", b"FABL", 1, d, 1.5, 10, 2)
    body = head + np.arange(2 * d, dtype="<f8").tobytes()
    old = BaselineSums.from_bytes(body + struct.pack("<I", zlib.crc32(body)))
    assert old.n_tokens == 10 and old.sample_vectors.shape == (0, 0) and old.sample_keys.size == 0
    good = BaselineSums(d=d).with_sample_vectors(np.array([3, 1]), np.ones((2, d), dtype=np.float32))
    blob = good.to_bytes()
    n_at = struct.calcsize("<4sIIdqq") + 16 * d

    def patched(n_v: int, r: int) -> bytes:
        b = blob[:n_at] + struct.pack("<II", n_v, r) + blob[n_at + 8:-4]
        return b + struct.pack("<I", zlib.crc32(b))

    for n_v, r in ((MAX_NOVELTY_SAMPLES + 1, d), (2, d + 1), (0, d), (3, d)):
        with pytest.raises(ValueError):
            BaselineSums.from_bytes(patched(n_v, r))
    nan = bytearray(blob[:-4])
    nan[-4:] = np.float32(np.nan).tobytes()
    with pytest.raises(ValueError, match="invalid novelty"):
        BaselineSums.from_bytes(bytes(nan) + struct.pack("<I", zlib.crc32(bytes(nan))))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), far=st.booleans(), overridden=st.booleans())
def test_the_route_answer_splits_the_budget_and_names_the_novelty_rule(seed: int, far: bool, overridden: bool) -> None:
    """A task with a novelty test is held to its route threshold at half its rate (``split_threshold``) and to the
    test at the other half; an override is kept as it is; a novel prompt is ``none`` with reason ``novelty``."""
    from atlas import routing
    from fishersketch import Sketcher, SketchSpec

    rng = np.random.default_rng(seed)
    sk = Sketcher(SketchSpec(d=6, K=9, m=128, seed=4), chunk_rows=64)

    def state(offset: float, n: int) -> object:
        return sk.sketch(rng.standard_normal((n * 3, 6)) + offset, rng.standard_normal((n * 3, 9)) + offset,
                         np.repeat(np.arange(n) + int(rng.integers(1 << 30)), 3))

    vectors = {1: rng.standard_normal((40, 4)), 2: rng.standard_normal((40, 4)) + 5.0}
    model = SpaceNovelty.fit(vectors)
    assert model is not None
    cands = [routing.Candidate(1, "one", state(0.5, 8), threshold=0.3, split_threshold=0.2, overridden=overridden),
             routing.Candidate(2, "two", state(-0.5, 8), threshold=0.3, split_threshold=0.2)]
    prompt = state(0.5, 1)
    vector = rng.standard_normal(4) + (40.0 if far else 0.0)
    ans = routing.rerank_route(prompt, cands, k=2, threshold=0.05, per_task=True, novelty=model, prompt_vector=vector)
    first = next(c for c in cands if c.task_id == ans.matches[0].task_id)
    assert ans.matches[0].threshold == (0.3 if first.overridden else 0.2)
    novel, dist, thr = model.rejects(vector, first.task_id, 0.025)
    assert ans.novelty_rejects == novel
    assert ans.none == (ans.matches[0].score < ans.matches[0].threshold or novel or ans.nearest_rejects)
    if far:
        assert novel and ans.none and ans.rejected_by is not None
    if ans.rejected_by is not None and ans.rejected_by.reason == "novelty":
        assert dist is not None and thr is not None and ans.rejected_by.score == dist > ans.rejected_by.threshold
        assert "novelty threshold" in ans.rejected_by.message and 0.5 <= ans.confidence <= 1.0
    plain = routing.rerank_route(prompt, cands, k=2, threshold=0.05, per_task=True)  # no vectors: the full rate
    assert plain.matches[0].threshold == 0.3 and not plain.novelty_rejects


def _reference_thresholds(vectors: dict[int, np.ndarray], rate: float, folds: int = 5,
                          ridge: float = 0.05) -> dict[int, float]:
    """The test's definition written out plainly: fold f of each task scored against its mean without fold f, in
    the pooled within-task covariance without fold f of any task (shrunk by ``ridge``); the conformal quantile."""
    import math

    def whitener(keep_fold: dict[int, np.ndarray]) -> np.ndarray:
        parts = [x[keep_fold[t]] - x[keep_fold[t]].mean(0) for t, x in vectors.items()]
        scatter = sum(p.T @ p for p in parts)
        dof = sum(len(p) - 1 for p in parts)
        c = np.asarray(scatter) / dof
        r = c.shape[0]
        c = (1 - ridge) * c + ridge * np.trace(c) / r * np.eye(r)
        w, v = np.linalg.eigh(c)
        return np.asarray(v / np.sqrt(w))

    own: dict[int, list[float]] = {t: [] for t in vectors}
    for f in range(folds):
        keep = {t: np.arange(len(x)) % folds != f for t, x in vectors.items()}
        w = whitener(keep)
        for t, x in vectors.items():
            held, mu = x[~keep[t]], x[keep[t]].mean(0)
            own[t] += list((((held - mu) @ w) ** 2).sum(1) / x.shape[1])
    out = {}
    for t, d in own.items():
        k = math.ceil((len(d) + 1) * (1 - rate) - 1e-9)
        out[t] = sorted(d)[k - 1] if k <= len(d) else math.inf
    return out


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.integers(MIN_NOVELTY_SAMPLES, 45), min_size=1, max_size=5),
       st.sampled_from([0.025, 0.05, 0.1]))
def test_the_fit_matches_the_tests_plain_definition(seed: int, sizes: list[int], rate: float) -> None:
    """The fit keeps per-task fold sums and one set of per-fold moments (memory independent of the tasks' count
    beyond O(T·r)); its thresholds are those of the definition computed directly."""
    rng = np.random.default_rng(seed)
    vectors = {t: rng.standard_normal((n, 5)) * rng.uniform(0.5, 2.0, 5) + rng.standard_normal(5)
               for t, n in enumerate(sizes)}
    model = SpaceNovelty.fit(vectors)
    assert model is not None
    want = _reference_thresholds(vectors, rate)
    for t in vectors:
        got = model.threshold(t, rate)
        assert got is not None
        assert (got == want[t] == np.inf) or abs(got - want[t] - 1e-6) < 1e-9 * max(1.0, want[t])


def test_tasks_outside_the_fitted_sample_are_calibrated_on_first_use_once() -> None:
    from atlas.novelty import NOVELTY_FIT_TASKS, NoveltyCache

    rng = np.random.default_rng(11)
    n_tasks = NOVELTY_FIT_TASKS + 40
    centres = rng.standard_normal((n_tasks, 4)) * 3
    vectors = {t: centres[t] + rng.standard_normal((MIN_NOVELTY_SAMPLES + 4, 4)) for t in range(n_tasks)}
    sample = set(np.linspace(0, n_tasks - 1, NOVELTY_FIT_TASKS).round().astype(int).tolist())  # evenly spaced
    outside_ids = [t for t in range(n_tasks) if t not in sample]
    wide = outside_ids[-1]
    vectors[7] = vectors[7][:3]  # too few: never tested
    vectors[wide] = rng.standard_normal((30, 5))  # another width (another model's vectors): never tested
    calls: list[list[int]] = []

    def load(ids: list[int]) -> dict[int, np.ndarray]:
        calls.append(list(ids))
        return {t: vectors[t] for t in ids if t in vectors}

    model = NoveltyCache().get(1, mark=0, task_ids=lambda: list(range(n_tasks)), load=load)
    assert model is not None and len(calls) == 1 and len(calls[0]) == NOVELTY_FIT_TASKS  # the fit's sample
    assert set(calls[0]) == sample
    outside = outside_ids[0]
    assert model.tested(outside) and calls[-1] == [outside]
    thr = model.threshold(outside)
    assert thr is not None and np.isfinite(thr)
    own = centres[outside] + rng.standard_normal((400, 4))
    d = model.distances(own, outside)
    assert d is not None and 0.0 < float(np.mean(d > thr)) < 0.15  # its rate (5 %), calibrated in that covariance
    assert model.rejects(centres[outside] + 20.0, outside)[0]
    n_calls = len(calls)
    model.threshold(outside)
    model.rejects(centres[outside], outside)
    assert len(calls) == n_calls  # kept: read once
    for t in (7, wide, n_tasks + 5):  # too few vectors, another width, no such task
        assert not model.tested(t) and model.rejects(np.zeros(4), t) == (False, None, None)
    looked_up = len(calls)
    assert looked_up == n_calls + sum(t not in sample for t in (7, wide, n_tasks + 5))  # the sample's: fitted
    assert not any(model.tested(t) for t in (7, wide, n_tasks + 5))
    assert len(calls) == looked_up  # an untested task is remembered too


@given(rate=st.floats(min_value=1e-4, max_value=0.5))
def test_vectors_needed_is_the_fewest_with_a_finite_threshold(rate: float) -> None:
    """``vectors_needed(b)``: the fewest own distances whose split-conformal quantile at ``b`` exists (what
    ``GET …/routing`` reports as ``novelty_samples_needed``), never under ``MIN_NOVELTY_SAMPLES``."""
    def exists(n: int) -> bool:  # SpaceNovelty.threshold's rank within n
        return math.ceil((n + 1) * (1.0 - rate) - 1e-9) <= n

    n = vectors_needed(rate)
    assert exists(n) and n >= MIN_NOVELTY_SAMPLES
    assert n == MIN_NOVELTY_SAMPLES or not exists(n - 1)


def test_vectors_needed_for_a_vanishing_rate_is_finite() -> None:
    """A task may be calibrated at any rate in (0, 0.5], 5e-324 included (its routing info answered 500: 1/rate
    overflowed)."""
    assert vectors_needed(5e-324 / 2) == vectors_needed(5e-324) == vectors_needed(1e-17) == 10**12  # half: 0.0
    assert MAX_NOVELTY_SAMPLES < 10**12
