"""Thresholds matched to a prompt's length: held-out views of the calibration samples (docs/SCORES.md, "Prompts
shorter than the samples"; :class:`atlas.route_calibration.LengthViews`, :func:`atlas.routing.prompt_threshold`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas import routing
from atlas.route_calibration import (
    LENGTH_NEIGHBOURS,
    MAX_CAL_VIEWS,
    MIN_CALIBRATION,
    SHORT_PROMPT_QUANTILE,
    LengthViews,
    calibrate,
    validate_views,
)
from fishersketch import Sketcher, SketchSpec

_SK = Sketcher(SketchSpec(d=6, K=9, m=256, seed=4), chunk_rows=64)

_views = st.lists(st.tuples(st.integers(1, 600), st.floats(-1, 1), st.booleans()).map(list), max_size=120)


def _state(seed: int, tokens: int, offset: float, sample: int) -> object:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((tokens, 6)) + offset
    e = rng.standard_normal((tokens, 9)) + offset
    return _SK.sketch(a, e, np.full(tokens, sample))


@settings(max_examples=60, deadline=None)
@given(_views, st.integers(1, 800), st.sampled_from([0.01, 0.05, 0.2]))
def test_a_prompts_threshold_is_calibrated_on_the_views_nearest_its_length(records: list, n: int, rate: float) -> None:
    """The threshold of a prompt of ``n`` tokens is :func:`calibrate` of the ``LENGTH_NEIGHBOURS`` views nearest ``n``
    in log length — none nearer is left out for a farther one — and a prompt is short below the
    ``SHORT_PROMPT_QUANTILE`` of the whole views' tokens."""
    lv = LengthViews.from_records(records)
    whole = [r[0] for r in records if r[2]]
    if not whole or len(records) < MIN_CALIBRATION:
        assert lv is None
        return
    assert lv is not None
    assert lv.short_below == pytest.approx(float(np.quantile(whole, SHORT_PROMPT_QUANTILE)))
    assert lv.short(n) is (n < lv.short_below)
    gaps = np.abs(np.log([r[0] for r in records]) - math.log(n))
    near = np.argsort(gaps, kind="stable")[:LENGTH_NEIGHBOURS]
    farther = np.setdiff1d(np.arange(len(records)), near)
    assert farther.size == 0 or gaps[near].max() <= gaps[farther].min()
    expected = calibrate([records[i][1] for i in near], rate).threshold
    assert lv.threshold(n, rate) == expected
    assert lv.threshold(n, rate) == expected  # memoised: the same value
    assert expected is None or -1.0 <= expected <= 1.0


@settings(max_examples=60, deadline=None)
@given(_views, st.integers(1, 800), st.floats(-1, 1), st.booleans(), st.sampled_from([None, 0.01, 0.2]))
def test_a_length_matched_threshold_only_ever_lowers_the_calibrated_one(records: list, n: int, calibrated: float,
                                                                        overridden: bool, rate: float | None) -> None:
    """:func:`atlas.routing.prompt_threshold`: an override is kept as set; a prompt that is not short for the task is
    held to the calibrated threshold; a short one to the lower of it and its length's — never a higher one."""
    lv = LengthViews.from_records(records)
    state = _state(0, 4, 0.0, 1)
    c = routing.Candidate(1, "t", state, threshold=calibrated, overridden=overridden, length_views=lv,
                          false_reject_rate=rate)
    thr, matched = routing.prompt_threshold(c, n, 0.05, per_task=True)
    assert thr <= calibrated
    if overridden or lv is None or not lv.short(n):
        assert (thr, matched) == (calibrated, False)
    else:
        local = lv.threshold(n, 0.05 if rate is None else rate)
        assert thr == (calibrated if local is None else min(calibrated, local)) and matched is (local is not None)
    assert routing.prompt_threshold(c, n, 0.3, per_task=False) == (0.3, False)  # a request's own threshold
    assert routing.prompt_threshold(routing.Candidate(1, "t", state, length_views=lv), n, 0.3, True) == (0.3, False)


@given(st.lists(st.one_of(st.none(), st.text(max_size=3), st.integers(), st.floats(allow_nan=True),
                          st.lists(st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.booleans(),
                                             st.text(max_size=2)), max_size=4)), max_size=8))
def test_stored_views_are_validated_on_import_and_malformed_records_never_calibrate(records: list) -> None:
    """An export's ``cal_views`` is all valid ``[tokens >= 1, score in [-1, 1], whole]`` records or refused (no
    NaN, no bool for a count); :meth:`LengthViews.from_records` ignores anything else in what it reads."""
    def ok(r: object) -> bool:
        return (isinstance(r, list) and len(r) == 3 and type(r[0]) is int and r[0] >= 1
                and type(r[1]) in (int, float) and -1.0 <= r[1] <= 1.0 and type(r[2]) in (bool, int))
    if all(ok(r) for r in records):
        assert validate_views(records) == [[int(t), float(s), bool(w)] for t, s, w in records][-MAX_CAL_VIEWS:]
    else:
        with pytest.raises(ValueError, match="cal_views"):
            validate_views(records)
    lv = LengthViews.from_records(records)
    good = [r for r in records if ok(r)]
    if lv is not None:
        assert len(lv.tokens) == len(good) and np.all(np.abs(lv.scores) <= 1.0)


def test_a_prefix_view_is_scored_with_its_whole_sample_held_out() -> None:
    """:func:`atlas.routing.leave_one_out_views`: the whole view's score is the leave-one-out score, and a prefix of
    the sample is scored against the task without the *whole* sample (not merely without the prefix)."""
    wholes = [_state(s, 12, 0.5, s) for s in range(6)]
    prefixes = [[_state(100 + s, 6, 0.5, s), _state(200 + s, 3, 0.5, s)] for s in range(6)]
    task = wholes[0].copy()
    for w in wholes[1:]:
        task.merge_(w)
    views = routing.leave_one_out_views(task, list(zip(wholes, prefixes, strict=True)))
    loo = routing.leave_one_out_scores(task, wholes)
    assert [v[0] for v in views] == [12, 6, 3] * 6 and [v[2] for v in views] == [True, False, False] * 6
    for i in range(6):
        rest = [w for j, w in enumerate(wholes) if j != i]
        acc = rest[0].copy()
        for w in rest[1:]:
            acc.merge_(w)
        assert views[3 * i][1] == pytest.approx(loo[i], abs=1e-9)
        for k, p in enumerate(prefixes[i]):
            assert views[3 * i + 1 + k][1] == pytest.approx(routing.route_score(routing.unit_signature(p), acc),
                                                            abs=1e-5)


def test_a_short_prompt_meets_its_lengths_thresholds_and_no_template() -> None:
    """In :func:`atlas.routing.rerank_route` a prompt short for the answered task is held to its length's route
    threshold (reported as the match's threshold, ``rejected_by.length_matched``) and to the novelty test at its
    length: at the split rate where the novelty model has the task's prefix views, at the full rate (no novelty test)
    where it has none; a prompt as long as the samples keeps the split threshold and the whole-sample test."""
    from atlas.lexical import TermCounts
    from atlas.template import TaskTemplate

    class Novelty:
        def __init__(self, has_views: bool) -> None:
            self.has_views = has_views

        def rejects(self, vector: object, task_id: int, rate: float) -> tuple[bool, float, float]:
            return True, 2.0, 1.0

        def rejects_at_length(self, vector: object, task_id: int, n: int, rate: float
                              ) -> tuple[bool, float | None, float | None]:
            return (True, 3.0, 2.5) if self.has_views else (False, None, None)

        def nearer_share(self, task_id: int, distance: float) -> float:
            return 0.99

    task = _state(1, 40, 0.5, 1)
    records = [[40, 0.9, True]] * 20 + [[20, 0.6, False]] * 20 + [[5, 0.2, False]] * 20 + [[2, -0.5, False]] * 20
    lv = LengthViews.from_records(records)
    assert lv is not None and lv.short(6) and not lv.short(40)
    template = TaskTemplate.of_texts(["alpha beta"] * 60)  # every sample has "alpha": an active template
    assert template.active
    c = routing.Candidate(1, "t", task, threshold=0.8, split_threshold=0.85, length_views=lv, template=template,
                          terms=None)
    lacking = TermCounts.from_texts(["gamma"])

    def route(tokens: int, novelty: Novelty) -> routing.RouteAnswer:
        return routing.rerank_route(_state(2, tokens, 0.5, 9), [c], k=1, threshold=0.05, per_task=True,
                                    novelty=novelty, prompt_vector=np.zeros(3),  # type: ignore[arg-type]
                                    prompt_terms=lacking)

    bare = route(6, Novelty(has_views=False))
    assert not bare.novelty_rejects and not bare.template_rejects
    assert bare.matches[0].threshold == pytest.approx(min(0.8, lv.threshold(6, 0.05)))  # full rate
    assert bare.matches[0].threshold < 0.8
    if bare.none:
        assert bare.rejected_by is not None and bare.rejected_by.length_matched
        assert "held-out sample prefixes" in bare.rejected_by.message
    tested = route(6, Novelty(has_views=True))
    assert tested.novelty_rejects and tested.none and not tested.template_rejects
    assert tested.matches[0].threshold == pytest.approx(min(0.85, lv.threshold(6, 0.025)))  # the split rate
    whole = route(40, Novelty(has_views=True))
    assert whole.novelty_rejects and whole.template_rejects and whole.matches[0].threshold == 0.85


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 400), st.integers(0, 6), st.integers(1, 8))
def test_view_vectors_round_trip_and_malformed_blobs_are_refused(v: int, cut: int, r: int) -> None:
    from atlas.route_calibration import decode_view_vectors, encode_view_vectors

    rng = np.random.default_rng(v)
    tokens = rng.integers(1, 500, size=v % 50)
    vectors = rng.standard_normal((tokens.size, r)).astype(np.float32)
    blob = encode_view_vectors(tokens, vectors)
    got = decode_view_vectors(blob)
    assert got is not None and np.array_equal(got[0], tokens) and np.array_equal(got[1], vectors)
    assert decode_view_vectors(None) is None
    with pytest.raises(ValueError):
        decode_view_vectors(blob[:len(blob) - 1 - cut])  # truncated
    with pytest.raises(ValueError):
        decode_view_vectors(b"XXXX" + blob[4:])
    if tokens.size:
        bad = tokens.copy()
        bad[0] = 0
        with pytest.raises(ValueError):
            decode_view_vectors(encode_view_vectors(bad, vectors))


def test_a_short_prompts_novelty_threshold_is_calibrated_on_the_task_s_prefix_views() -> None:
    """:meth:`SpaceNovelty.threshold_at_length`: prefixes lie farther from the task's samples than whole samples (a
    short text is a noisier draw), so the whole-sample threshold rejects most short own prompts; the threshold of the
    prefix views nearest the prompt's length keeps the rate on fresh short prompts and still rejects a shifted kind."""
    from atlas.novelty import SpaceNovelty

    rng = np.random.default_rng(1)
    r, n = 12, 100
    scales = np.geomspace(3.0, 0.2, r)
    means = rng.standard_normal((4, r)) * 3.0

    def draw(t: int, k: int, noise: float = 0.0) -> np.ndarray:
        return means[t] + rng.standard_normal((k, r)) * scales + rng.standard_normal((k, r)) * noise

    def views(t: int) -> tuple[np.ndarray, np.ndarray]:  # prefixes: the whole sample's draw plus short-text noise
        return np.full(96, 8), draw(t, 96, noise=1.0)

    model = SpaceNovelty.fit({t: draw(t, n) for t in range(4)}, views_loader=views)
    assert model is not None
    fresh_short = draw(0, 400, noise=1.0)
    by_whole = np.mean([model.rejects(x, 0, 0.05)[0] for x in fresh_short])
    by_length = np.mean([model.rejects_at_length(x, 0, 8, 0.05)[0] for x in fresh_short])
    assert by_whole > 0.5 and by_length <= 0.1, (by_whole, by_length)
    thr = model.threshold_at_length(0, 8, 0.05)
    assert thr is not None and thr > model.threshold(0, 0.05)  # type: ignore[operator]
    shift = np.zeros(r)
    shift[-6:] = 4.0  # another kind: along directions the task never varies in
    assert np.mean([model.rejects_at_length(x + shift, 0, 8, 0.05)[0] for x in draw(0, 200, noise=1.0)]) > 0.9
    bare = SpaceNovelty.fit({t: draw(t, n) for t in range(4)})  # no views: a short prompt is not tested
    assert bare is not None and bare.rejects_at_length(fresh_short[0], 0, 8, 0.05) == (False, None, None)
