"""The novelty test's per-task switch (``task_routing.novelty_test``) and ``fit``'s rule for turning it off.

* The route: a task switched off is never novelty-tested and answers exactly as a task without a test (its
  full-rate route threshold, not the half-rate ``split_threshold``), hypothesis over prompts and overrides.
* ``fit``'s rule (:func:`atlas.route_fit.novelty_to_turn_off`): documented examples, and hypothesis
  properties over open-ended label sets.
* The store (SQLite and PostgreSQL): the switch is read into the route's candidates, and an export carries it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session, sessionmaker

from atlas import repository, routing, routing_repo
from atlas.novelty import SpaceNovelty
from atlas.route_answer import RouteAnswer
from atlas.route_calibration import FALSE_REJECT_RATE, Calibration, split_rates
from atlas.route_fit import NOVELTY_FALSE_REJECT, NOVELTY_MIN_REJECTS, novelty_to_turn_off
from atlas.samples import Sample
from fishersketch import Sketcher, SketchSpec
from tests.atlas.fixtures import random_state

# --------------------------------------------------------------------------------------------------
# The route


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), far=st.booleans(), overridden=st.booleans())
def test_a_task_switched_off_is_never_novelty_rejected_and_answers_as_one_without_a_test(
        seed: int, far: bool, overridden: bool) -> None:
    rng = np.random.default_rng(seed)
    sk = Sketcher(SketchSpec(d=6, K=9, m=128, seed=4), chunk_rows=64)

    def state(offset: float, n: int) -> object:
        return sk.sketch(rng.standard_normal((n * 3, 6)) + offset, rng.standard_normal((n * 3, 9)) + offset,
                         np.repeat(np.arange(n) + int(rng.integers(1 << 30)), 3))

    model = SpaceNovelty.fit({1: rng.standard_normal((40, 4)), 2: rng.standard_normal((40, 4)) + 5.0})
    assert model is not None
    on = [routing.Candidate(1, "one", state(0.5, 8), threshold=0.3, split_threshold=0.2, overridden=overridden),
          routing.Candidate(2, "two", state(-0.5, 8), threshold=0.3, split_threshold=0.2)]
    off = [replace(c, novelty_test=False) for c in on]
    prompt = state(0.5, 1)
    vector = rng.standard_normal(4) + (40.0 if far else 0.0)  # far: novel for both tasks

    def route(cands: list[routing.Candidate], novelty: SpaceNovelty | None) -> RouteAnswer:
        return routing.rerank_route(prompt, cands, k=2, threshold=0.05, per_task=True, novelty=novelty,
                                    prompt_vector=None if novelty is None else vector)

    switched, without, tested = route(off, model), route(on, None), route(on, model)
    assert switched == without  # "switched off" is "has no novelty test": the same answer, field for field
    assert not switched.novelty_rejects and switched.matches[0].threshold == 0.3  # the full-rate threshold
    assert switched.rejected_by is None or switched.rejected_by.reason != "novelty"
    assert switched.none == (switched.matches[0].score < 0.3 or switched.nearest_rejects)
    first = tested.matches[0].task_id
    assert tested.matches[0].threshold == (0.3 if first == 1 and overridden else 0.2)  # with the test: the split
    if far:  # ... and the novel prompt is rejected
        assert tested.novelty_rejects and tested.none
    # only the answered task's own switch counts: the other task's switch off changes nothing
    mixed = [c if c.task_id == first else replace(c, novelty_test=False) for c in on]
    assert route(mixed, model) == tested


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(20, 38), far=st.booleans())
def test_a_task_with_too_few_vectors_for_its_rate_has_no_test_and_keeps_its_full_rate_threshold(
        seed: int, n: int, far: bool) -> None:
    """At the default rate the test gets 2.5 %: its split-conformal quantile needs ⌈(n + 1)(1 − 0.025)⌉ ≤ n, 39
    vectors. A task of 20–38 is calibrated but has no threshold at that rate, so it is not tested — and its route
    threshold stays at the full rate (before, it took the half-rate one for a test that could never reject)."""
    rng = np.random.default_rng(seed)
    sk = Sketcher(SketchSpec(d=6, K=9, m=128, seed=4), chunk_rows=64)
    task = sk.sketch(rng.standard_normal((24, 6)), rng.standard_normal((24, 9)), np.repeat(np.arange(8), 3))
    model = SpaceNovelty.fit({1: rng.standard_normal((n, 4)), 2: rng.standard_normal((40, 4))})
    assert model is not None and model.task(1) is not None  # calibrated...
    _, novelty_rate = split_rates(FALSE_REJECT_RATE)
    assert not model.tested(1, novelty_rate) and model.tested(2, novelty_rate)  # ...but not tested at 2.5 %
    assert model.tested(1, FALSE_REJECT_RATE) == (n >= 19)  # at 5 % it would be (19 vectors and up)
    cand = routing.Candidate(1, "one", task, threshold=0.3, split_threshold=0.2)
    vector = rng.standard_normal(4) + (1e3 if far else 0.0)
    prompt = sk.sketch(rng.standard_normal((3, 6)), rng.standard_normal((3, 9)), np.zeros(3, dtype=np.int64))
    tested = routing.rerank_route(prompt, [cand], k=1, threshold=0.05, per_task=True, novelty=model,
                                  prompt_vector=vector)
    without = routing.rerank_route(prompt, [cand], k=1, threshold=0.05, per_task=True)
    assert tested == without and not tested.novelty_rejects and tested.matches[0].threshold == 0.3


# --------------------------------------------------------------------------------------------------
# fit's rule


def _examples(*groups: tuple[int | None, int | None, bool, int]
              ) -> tuple[list[int | None], list[int | None], list[bool]]:
    """``(label, answered task, novel, count)`` groups as fit's labels, answered tasks and novelty rejections."""
    labels: list[int | None] = []
    answered: list[int | None] = []
    novel: list[bool] = []
    for label, task, no, n in groups:
        labels += [label] * n
        answered += [task] * n
        novel += [no and task is not None] * n  # (no answer: nothing to test)
    return labels, answered, novel


def test_the_documented_examples_of_the_rule() -> None:
    assert (NOVELTY_FALSE_REJECT, NOVELTY_MIN_REJECTS) == (0.10, 3)  # docs/SCORES.md, "fit"
    assert novelty_to_turn_off(*_examples((1, 1, True, 3))) == {1}  # every labelled prompt rejected
    assert novelty_to_turn_off(*_examples((1, 1, True, 2))) == set()  # two: what chance gives
    assert novelty_to_turn_off(*_examples((1, 1, True, 3), (1, 1, False, 27))) == set()  # 10 %: not more
    assert novelty_to_turn_off(*_examples((1, 1, True, 4), (1, 1, False, 26))) == {1}  # 13 %
    # a task calibrated at a false-reject rate above 10 % spends more on the test: twice its half is the bar
    assert novelty_to_turn_off(*_examples((1, 1, True, 4), (1, 1, False, 26)), {1: 0.3}) == set()
    assert novelty_to_turn_off(*_examples((1, 1, True, 10), (1, 1, False, 20)), {1: 0.3}) == {1}
    # only the task's own prompts count, answered by it: another task's, or a "none" prompt, never
    assert novelty_to_turn_off(*_examples((1, 2, True, 5), (None, 1, True, 5), (2, 1, True, 5))) == set()
    assert novelty_to_turn_off(*_examples((1, None, False, 3), (2, 2, True, 3))) == {2}


_GROUPS = st.lists(st.tuples(st.sampled_from([None, 1, 2, 3]), st.sampled_from([None, 1, 2, 3]), st.booleans(),
                             st.integers(1, 12)), max_size=8)
_RATES = st.dictionaries(st.sampled_from([1, 2, 3]), st.floats(0.001, 0.5))


@settings(max_examples=200, deadline=None)
@given(groups=_GROUPS, rates=_RATES, task=st.sampled_from([1, 2, 3]))
def test_the_rule_counts_own_rejections_and_is_monotone(groups: list[Any], rates: dict[int, float],
                                                        task: int) -> None:
    labels, answered, novel = _examples(*groups)
    off = novelty_to_turn_off(labels, answered, novel, rates)
    for t in off:  # each one turned off: enough of its own prompts, answered by it, rejected by its test
        own = [(task, no) for lab, task, no in zip(labels, answered, novel, strict=True) if lab == t]
        rejected = sum(no and task == t for task, no in own)
        assert rejected >= NOVELTY_MIN_REJECTS and rejected / len(own) > max(NOVELTY_FALSE_REJECT,
                                                                              rates.get(t, 0.05))
    assert off <= {lab for lab in labels if lab is not None}
    assert novelty_to_turn_off(labels, answered, novel, {}) >= off  # a stored rate only raises the bar
    if all(r <= NOVELTY_FALSE_REJECT for r in rates.values()):  # ... above 10 %
        assert off == novelty_to_turn_off(labels, answered, novel)
    # one more own prompt rejected never turns the test back on; one more clean own prompt never turns it off
    more_novel = novelty_to_turn_off(*_examples(*groups, (task, task, True, 1)), rates)
    more_clean = novelty_to_turn_off(*_examples(*groups, (task, task, False, 1)), rates)
    assert (task in off) <= (task in more_novel) and (task in more_clean) <= (task in off)
    assert more_novel - {task} == off - {task} == more_clean - {task}  # other tasks are left as they are
    # prompts of other labels, or answered by another task, change nothing for the task
    foreign = novelty_to_turn_off(*_examples(*groups, (None, task, True, 5), (task % 3 + 1, task, True, 5)), rates)
    assert (task in foreign) == (task in off)


def test_the_default_rate_is_the_bar_for_a_task_without_a_stored_rate() -> None:
    labels, answered, novel = _examples((1, 1, True, 4), (1, 1, False, 26))
    assert FALSE_REJECT_RATE < NOVELTY_FALSE_REJECT
    assert novelty_to_turn_off(labels, answered, novel, {2: 0.5}) == novelty_to_turn_off(labels, answered, novel) \
        == {1}


# --------------------------------------------------------------------------------------------------
# The store

SPEC = SketchSpec(d=8, K=16, m=32, seed=0)


def _tasks(factory: sessionmaker[Session], names: list[str]) -> list[int]:
    with factory.begin() as s:
        space = repository.get_or_create_space(
            s, model_fingerprint="model-nsw", spec_fingerprint=SPEC.fingerprint(), model_name="tiny", d=8, K=16,
            m=32, seed=0, spec=SPEC.to_dict())
        ids = []
        for name in names:
            task, _ = repository.create_task_with_job(s, space.id, name, "text", {}, [Sample(text=name)])
            routing_repo.store_routing(s, task.id, prompt_state=None,
                                       calibration=Calibration([0.2 + 0.01 * i for i in range(20)], 0.2, 0.05, 0.05))
            ids.append(int(task.id))
        return ids


class _Loaded:
    def __init__(self, task_id: int, name: str) -> None:
        self.task_id, self.name, self.state, self.view = task_id, name, random_state(SPEC, task_id), None


def test_the_switch_reaches_the_routes_candidates_and_an_export_carries_it(factory: sessionmaker[Session]) -> None:
    on, off, older, copy = _tasks(factory, ["on", "off", "older", "copy"])
    with factory.begin() as s:
        routing_repo.set_novelty_test(s, off, False)
        assert routing_repo.get_routing(s, off).template_test is True  # the other switch is left as it is
    with factory() as s:
        routes = routing_repo.get_task_routes(s, [on, off])
        assert (routes[on].novelty_test, routes[off].novelty_test) == (True, False)
        cands = {c.task_id: c for c in routing_repo.route_candidates(
            s, SPEC, [_Loaded(on, "on"), _Loaded(off, "off")], {})}
        assert (cands[on].novelty_test, cands[off].novelty_test) == (True, False)
        # switched off keeps its split threshold stored: turning the test on again needs no re-calibration
        assert cands[off].split_threshold == cands[on].split_threshold is not None
        records = routing_repo.export_records(s, [on, off])
    assert (records[on]["novelty_test"], records[off]["novelty_test"]) == (True, False)
    with factory.begin() as s:
        routing_repo.import_record(s, copy, records[off], SPEC)
        routing_repo.import_record(s, older, {k: v for k, v in records[off].items() if k != "novelty_test"}, SPEC)
    with factory() as s:
        routes = routing_repo.get_task_routes(s, [copy, older])
        assert routes[copy].novelty_test is False  # the export carries the switch
        assert routes[older].novelty_test is True  # an export from before the switch: the test on, as it was
    with factory.begin() as s:
        routing_repo.set_novelty_test(s, off, True)
    with factory() as s:
        assert routing_repo.get_task_routes(s, [off])[off].novelty_test is True


def test_switching_a_task_without_a_routing_row_creates_it_and_an_unknown_task_is_not_found(
        factory: sessionmaker[Session]) -> None:
    from atlas.errors import NotFound

    (tid,) = _tasks(factory, ["bare"])
    with factory.begin() as s:
        row = routing_repo.get_routing(s, tid)
        assert row is not None
        s.delete(row)
    with factory.begin() as s:
        routing_repo.set_novelty_test(s, tid, False)
    with factory() as s:
        assert routing_repo.get_task_routes(s, [tid])[tid].novelty_test is False
    with factory.begin() as s, pytest.raises(NotFound):
        routing_repo.set_novelty_test(s, 10**9, False)
