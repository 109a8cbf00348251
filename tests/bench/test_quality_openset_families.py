"""The families open-set protocol of ``bench.quality.openset_families``: its task set and its tally."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from atlas.routing import RouteAnswer, RouteMatch
from bench.quality.data import trained_on
from bench.quality.openset_families import (
    INSTRUCTION_TASKS,
    _tally,
    _which,
    calibrated_knn_rates,
    family_tasks,
    knn_route_scores,
    landing_tasks,
)
from bench.quality.space_threshold import pooled_held_out_scores, space_threshold_rates


def _answer(task: str, *, none: bool, rank: float, template: bool = False, nearest: bool = False) -> RouteAnswer:
    match = RouteMatch(task_id=1, name=task, score=0.5, faiss_score=0.5, activation=0.0, error=0.0, threshold=0.1,
                       rank_score=rank)
    return RouteAnswer(matches=[match], none=none, best_score=0.5, threshold=0.1, template_rejects=template,
                       nearest_rejects=nearest)


def test_the_tally_counts_none_right_answers_and_why() -> None:
    prompts = [("a", "p1"), ("a", "p2"), ("b", "p3"), ("b", "p4"), ("u", "p5"), ("u", "p6")]
    answers = [_answer("a", none=False, rank=0.9), _answer("b", none=False, rank=0.8),  # a right, a wrong
               _answer("b", none=True, rank=0.1, template=True), _answer("b", none=False, rank=0.7),
               _answer("a", none=True, rank=0.0, nearest=True), _answer("b", none=False, rank=0.2)]
    res = _tally(prompts, answers, unseen=["u"])
    assert res["none_unseen"] == 0.5 and res["none_indexed"] == 0.25
    assert res["right"] == 0.5 and res["top1"] == 0.75  # the template "none" was the right task
    assert res["indexed_none_by"] == {"template": 1}
    assert res["unseen_accepted"] == {"u -> b": 1}
    assert len(res["prompts"]) == 6
    ceiling = res["ceiling"]  # one threshold on the rank score at the 5 % quantile of the indexed prompts' ranks
    assert ceiling["none_indexed"] == 0.25 and ceiling["none_unseen"] == 0.5


def test_a_prompt_without_matches_counts_as_none() -> None:
    empty = RouteAnswer(matches=[], none=True, best_score=None, threshold=0.1)
    res = _tally([("a", "p"), ("u", "q")], [_answer("a", none=False, rank=0.5), empty], unseen=["u"])
    assert res["none_unseen"] == 1.0 and res["right"] == 1.0


def _cluster(axis: int, n: int, rng: np.random.Generator, spread: float = 0.1) -> np.ndarray:
    x = np.eye(4)[axis] + spread * rng.standard_normal((n, 4))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_knn_scores_leave_each_utterance_out_of_its_own_route() -> None:
    u = [np.eye(3)[:2], np.eye(3)[2:]]  # route 0: e0, e1; route 1: e2
    own = knn_route_scores(u, u[0], leave_one_out=0)
    assert own[:, 0].tolist() == [0.0, 0.0]  # each meets only the other (orthogonal) utterance
    assert knn_route_scores(u, u[0])[:, 0].tolist() == [0.5, 0.5]  # mean of itself (1) and the other (0)


def test_the_calibrated_knn_router_answers_none_off_every_route() -> None:
    rng = np.random.default_rng(0)
    routes = [_cluster(0, 40, rng), _cluster(1, 40, rng)]
    queries = np.concatenate([_cluster(0, 10, rng), _cluster(1, 10, rng), _cluster(3, 10, rng)])
    truth = [0] * 10 + [1] * 10 + [None] * 10
    res = calibrated_knn_rates(routes, queries, truth, rate=0.05)
    assert res["none_unseen"] == 1.0 and res["top1"] == 1.0
    assert res["none_indexed"] <= 0.2 and res["right"] == 1.0 - res["none_indexed"]
    strict = calibrated_knn_rates(routes, queries, truth, rate=0.5)  # thresholds near the routes' median own score
    assert strict["none_indexed"] > res["none_indexed"]


@pytest.mark.slow
def test_one_task_per_family_without_the_bundled_models_training_rows() -> None:
    tasks = family_tasks()
    assert len(tasks) == 22
    assert set(INSTRUCTION_TASKS) <= set(tasks)
    assert {"news", "reviews", "trec", "scicite", "titles", "biomed", "zinc_smiles"} <= set(tasks)
    assert all(len(texts) >= 120 for texts in tasks.values())  # 100 signature samples + 20 held out
    assert not any(trained_on("multidomain_text", {"domain": "literature_shakespeare", "text": t})
                   for t in tasks["shakespeare"])


def test_a_draw_is_named_by_its_shorter_task_list() -> None:
    small = {"indexed_tasks": ["a", "b"], "unseen_tasks": ["c", "d", "e"]}
    assert _which(small) == "indexed a, b"
    large = {"indexed_tasks": ["a", "b", "c"], "unseen_tasks": ["d"]}
    assert _which(large) == "unseen d"
    assert _which({"unseen_tasks": ["d"]}) == "unseen d"  # result files written before the indexed list


def test_landing_tasks_compare_a_threshold_with_the_own_prompts_and_the_foreign_ones() -> None:
    def rec(task: str, top: str | None, score: float | None, thr: float | None = 0.1,
            own: float | None = None) -> dict[str, object]:
        own = score if own is None and top == task else own
        return {"task": task, "top": top, "score": score, "threshold": thr, "own_score": own}

    records = [rec("a", "a", s) for s in (0.2, 0.3, 0.4, 0.5)]  # a's own prompts
    records += [rec("u", "a", s) for s in (0.1, 0.25, 0.6)]  # unseen prompts topped by a
    records += [rec("b", "b", 0.9), rec("v", "b", 0.05), rec("v", None, None), rec("b", "a", 0.35, own=0.3)]  # b's own

    rows = landing_tasks(records, unseen=["u", "v"], rate=0.0)  # the 0 quantile: the lowest own score
    assert [r["task"] for r in rows] == ["a", "b"]  # most foreign prompts first; b's misrouted prompt is not foreign
    a = rows[0]
    assert a["own"] == 4 and a["foreign"] == 3 and a["threshold"] == 0.1
    assert a["own_quantile"] == 0.2
    assert a["foreign_pass_quantile"] == 2 / 3  # 0.25 and 0.6 reach the lowest own score
    assert a["auroc"] == 7 / 12  # own above foreign: all four above 0.1, three above 0.25, none above 0.6
    b = rows[1]
    assert b["own"] == 2 and b["own_quantile"] == 0.3  # its misrouted own prompt counts (at its score on b)
    assert b["auroc"] == 1.0 and b["foreign_pass_quantile"] == 0.0


class _RecordingAtlas:
    """What ``_with_fit`` calls on the library: records the labelled prompts of each ``fit`` and the prompts routed."""

    def __init__(self) -> None:
        self.fitted: list[list[tuple[str, str]]] = []
        self.routed: list[list[str]] = []

    def set_threshold(self, task: str, value: float | None) -> None:
        pass

    def set_template_test(self, task: str, on: bool) -> None:
        pass

    def set_novelty_test(self, task: str, on: bool) -> None:
        pass

    def fit(self, labelled: list[tuple[str, str]]) -> None:
        self.fitted.append(list(labelled))

    def route(self, prompts: list[str], k: int = 3) -> list[RouteAnswer]:
        self.routed.append(list(prompts))
        return [_answer("a", none=False, rank=0.5) for _ in prompts]


@pytest.mark.parametrize("seed", range(5))
def test_fit_is_cross_fitted_by_unseen_task_so_no_unseen_task_is_fitted_on_and_evaluated(seed: int) -> None:
    from bench.quality.openset_families import _with_fit

    indexed, unseen = ["a", "b", "c"], ["u1", "u2", "u3", "u4"]
    prompts = [(t, f"{t}-{i}") for t in indexed + unseen for i in range(20)]
    task_of = {p: t for t, p in prompts}
    atlas = _RecordingAtlas()
    _with_fit(atlas, prompts, indexed, unseen, np.random.default_rng(seed))
    assert len(atlas.fitted) == 2 and len(atlas.routed) == 2
    for fitted, routed in zip(atlas.fitted, atlas.routed, strict=True):
        none_tasks = {task_of[p] for p, label in fitted if label == "none"}
        evaluated_unseen = {task_of[p] for p in routed if task_of[p] in unseen}
        assert none_tasks and evaluated_unseen  # both halves have unseen tasks
        assert not none_tasks & evaluated_unseen  # the "none" examples come from other unseen tasks
        assert {p for p, _ in fitted}.isdisjoint(routed)  # and no prompt is both fitted on and answered
        fitted_indexed = {task_of[p] for p, label in fitted if label != "none"}
        assert fitted_indexed == set(indexed)  # every indexed task has labelled prompts in each fit


def test_the_space_threshold_replay_pools_the_exported_scores_and_ors_with_the_product(tmp_path: Path) -> None:
    export = tmp_path / "space.jsonl"
    lines = [{"format": "header"}, {"name": "a", "routing": {"cal_scores": [0.1, 0.2, 0.3]}},
             {"name": "b", "routing": None}, {"name": "c", "routing": {"cal_scores": [0.4]}}]
    export.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    pooled = pooled_held_out_scores(export)
    assert pooled == [0.1, 0.2, 0.3, 0.4]
    records = [{"task": "a", "top": "a", "none": False, "score": 0.35},  # above the space threshold: right
               {"task": "a", "top": "a", "none": True, "score": 0.35},  # the product says none
               {"task": "c", "top": "a", "none": False, "score": 0.15},  # below it: none
               {"task": "u", "top": "a", "none": False, "score": 0.12},  # unseen, caught by it
               {"task": "u", "top": "c", "none": False, "score": None}]  # no match at all: none
    res = space_threshold_rates(records, ["u"], pooled, 0.5)
    assert res["threshold"] == float(np.quantile(pooled, 0.5)) == 0.25
    assert res["alone"] == {"none_unseen": 1.0, "none_indexed": 1 / 3, "right": 2 / 3}
    assert res["with_product"] == {"none_unseen": 1.0, "none_indexed": 2 / 3, "right": 1 / 3}
