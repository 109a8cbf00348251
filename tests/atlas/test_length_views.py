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
    SHORT_PROMPT_SHARE,
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
    ``SHORT_PROMPT_SHARE`` times the ``SHORT_PROMPT_QUANTILE`` quantile of the whole views' tokens."""
    lv = LengthViews.from_records(records)
    whole = [r[0] for r in records if r[2]]
    if not whole or len(records) < MIN_CALIBRATION:
        assert lv is None
        return
    assert lv is not None
    assert lv.short_below == pytest.approx(SHORT_PROMPT_SHARE * float(np.quantile(whole, SHORT_PROMPT_QUANTILE)))
    assert lv.short(n) is (n < lv.short_below)
    gaps = np.abs(np.log([r[0] for r in records]) - math.log(n))
    near = np.argsort(gaps, kind="stable")[:LENGTH_NEIGHBOURS]
    farther = np.setdiff1d(np.arange(len(records)), near)
    assert farther.size == 0 or gaps[near].max() <= gaps[farther].min()
    expected = calibrate([records[i][1] for i in near], rate).threshold
    assert lv.threshold(n, rate) == expected
    assert lv.threshold(n, rate) == expected  # memoised: the same value
    assert expected is None or -1.0 <= expected <= 1.0


@settings(max_examples=80, deadline=None)
@given(_views, st.integers(1, 800), st.floats(-1, 1), st.one_of(st.none(), st.floats(-1, 1)),
       st.sampled_from([None, 0.01, 0.2]))
def test_an_override_moves_every_length_s_threshold_by_as_much(records: list, n: int, calibrated: float,
                                                               override: float | None, rate: float | None) -> None:
    """:func:`atlas.routing.prompt_threshold`: a prompt that is not short for the task is held to its threshold (its
    override, else its calibrated one); a short one, without an override, to the lower of the calibrated threshold
    and its length's bound, and with one, to that moved by exactly as much as the override moves the calibrated
    threshold — never above what whole prompts are held to (before 2026-12-01 an override that raised the threshold
    left short prompts at their bound: ``fisher-atlas routing boolq --threshold 0.9`` still answered "To be or not to
    be" with BoolQ)."""
    lv = LengthViews.from_records(records)
    state = _state(0, 4, 0.0, 1)
    plain = routing.Candidate(1, "t", state, threshold=calibrated, length_views=lv, false_reject_rate=rate,
                              calibrated=calibrated)
    held = routing.prompt_threshold(plain, n, 0.05, per_task=True)
    local = None if lv is None or not lv.short(n) else lv.threshold(n, 0.05 if rate is None else rate)
    if local is None:
        assert (held.threshold, held.length_matched, held.length_drop) == (calibrated, False, None)
    else:
        assert held.threshold == min(calibrated, local) and held.length_drop == max(0.0, calibrated - local)
    if override is not None:
        moved = routing.prompt_threshold(routing.Candidate(1, "t", state, threshold=override, overridden=True,
                                                           length_views=lv, false_reject_rate=rate,
                                                           calibrated=calibrated), n, 0.05, per_task=True)
        assert moved.threshold <= override and moved.length_drop == held.length_drop
        assert moved.threshold == pytest.approx(held.threshold + (override - calibrated), abs=1e-12)
        # an override of a task calibrated on too few samples (no calibrated threshold) holds every prompt to it (it
        # was measured from itself: min(override, local), so a raise left short prompts at their length's bound)
        bare = routing.prompt_threshold(routing.Candidate(1, "t", state, threshold=override, overridden=True,
                                                          length_views=lv, false_reject_rate=rate), n, 0.05, True)
        assert (bare.threshold, bare.length_drop) == (override, None)
    for held in (routing.prompt_threshold(plain, n, 0.3, per_task=False),  # a request's own threshold
                 routing.prompt_threshold(routing.Candidate(1, "t", state, length_views=lv), n, 0.3, True)):
        assert (held.threshold, held.length_matched, held.length_drop) == (0.3, False, None)


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


def test_a_short_prompt_meets_its_lengths_threshold_and_neither_novelty_nor_template() -> None:
    """In :func:`atlas.routing.rerank_route` a prompt short for the answered task is held to its length's route
    threshold at the full rate (reported as the match's threshold, ``rejected_by.length_matched``) and to neither
    the novelty nor the template test; a prompt as long as the samples keeps the split threshold and both tests."""
    from atlas.lexical import TermCounts
    from atlas.template import TaskTemplate

    class AlwaysNovel:
        def rejects(self, vector: object, task_id: int, rate: float) -> tuple[bool, float, float]:
            return True, 2.0, 1.0

        def nearer_share(self, task_id: int, distance: float) -> float:
            return 0.99

        def tested(self, task_id: int, rate: float) -> bool:
            return True

    task = _state(1, 40, 0.5, 1)
    records = [[40, 0.9, True]] * 20 + [[20, 0.6, False]] * 20 + [[5, 0.2, False]] * 20 + [[2, -0.5, False]] * 20
    lv = LengthViews.from_records(records)
    assert lv is not None and lv.short(6) and not lv.short(40)
    template = TaskTemplate.of_texts(["alpha beta"] * 60)  # every sample has "alpha": an active template
    assert template.active
    c = routing.Candidate(1, "t", task, threshold=0.8, split_threshold=0.85, length_views=lv, template=template)
    lacking = TermCounts.from_texts(["gamma"])

    def route(tokens: int) -> routing.RouteAnswer:
        return routing.rerank_route(_state(2, tokens, 0.5, 9), [c], k=1, threshold=0.05, per_task=True,
                                    novelty=AlwaysNovel(), prompt_vector=np.zeros(3),  # type: ignore[arg-type]
                                    prompt_terms=lacking)

    short = route(6)
    assert not short.novelty_rejects and not short.template_rejects
    assert short.matches[0].threshold == pytest.approx(min(0.8, lv.threshold(6, 0.05)))  # the full rate
    assert short.matches[0].threshold < 0.8
    if short.none:
        assert short.rejected_by is not None and short.rejected_by.length_matched
        assert "held-out sample prefixes" in short.rejected_by.message
    whole = route(40)
    assert whole.novelty_rejects and whole.template_rejects and whole.matches[0].threshold == 0.85
    # an override is measured from what whole prompts are held to without it — here the split threshold, the novelty
    # test applying to them: an override equal to it leaves the short prompt's threshold, a raise moves it as much
    for override in (0.85, 0.95):
        c = routing.Candidate(1, "t", task, threshold=override, overridden=True, calibrated=0.8, split_threshold=0.85,
                              length_views=lv, template=template)
        assert route(6).matches[0].threshold == pytest.approx(short.matches[0].threshold + override - 0.85, abs=1e-12)
        assert route(6).matches[0].length_drop == pytest.approx(0.85 - short.matches[0].threshold, abs=1e-12)
