"""The families open-set protocol of ``bench.quality.openset_families``: its task set and its tally."""

from __future__ import annotations

import pytest

from atlas.routing import RouteAnswer, RouteMatch
from bench.quality.data import trained_on
from bench.quality.openset_families import INSTRUCTION_TASKS, _tally, family_tasks


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


@pytest.mark.slow
def test_one_task_per_family_without_the_bundled_models_training_rows() -> None:
    tasks = family_tasks()
    assert len(tasks) == 22
    assert set(INSTRUCTION_TASKS) <= set(tasks)
    assert {"news", "reviews", "trec", "scicite", "titles", "biomed", "zinc_smiles"} <= set(tasks)
    assert all(len(texts) >= 120 for texts in tasks.values())  # 100 signature samples + 20 held out
    assert not any(trained_on("multidomain_text", {"domain": "literature_shakespeare", "text": t})
                   for t in tasks["shakespeare"])
