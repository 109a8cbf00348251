"""Routing quality on real data with the bundled model (docs/SCORES.md, issue 13).

One module fixture sketches, with the real extractor and the same routing code the job and the
engine run (:mod:`workers.calibration`, :mod:`atlas.routing`, :mod:`atlas.route_fit`):

* four well-populated text tasks (40 samples each) from ``multidomain_text``;
* tasks of 1, 2 and 3 samples from other domains;
* a completion-mode BoolQ task (passage + question → yes/no), routed on its prompt-side state.

Prompts are ranked as the service ranks them (:mod:`atlas.whitening`: by the route score in a space of
fewer than ``WHITEN_MIN_TASKS`` tasks, as here, fused with the lexical score of the terms a job stores,
:mod:`atlas.lexical`), open-set decisions on the best match's route score and threshold. The whitened
ranking of larger spaces is measured on 105 tasks in bench/results/quality.md.

Only rows the bundled model was not trained on are used (its split rule: sha256 bucket ≥ 4).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from atlas import lexicon_repo, routing
from atlas.lexical import TaskTerms, TermCounts
from atlas.route_fit import FitItem, fit_thresholds
from atlas.samples import Sample
from atlas.whitening import WHITEN_MIN_TASKS, fit_space_whitening
from tests.shared_data import DATA, require_shared_data
from workers.calibration import prompt_side

BIG = ("wikipedia", "literature_shakespeare", "questions_trec")
SMALL = ("biomedical_abstracts", "news_sports", "scientific_citations")
UNSEEN = ("news_world", "academic_paper_titles")
N_TASK, N_HELD, N_FIT = 24, 16, 6
SKETCH_DIM = 4096  # the service default: at m = 1024 sketch noise (~1/√m ≈ 0.03) is as large as the score gaps here


@dataclass(frozen=True)
class Routed:
    """A prompt's route scores per task and the task the product ranks first (whitened ranking)."""

    scores: dict[int, float]
    best: int


def _bucket(key: str) -> int:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10


def _texts() -> dict[str, list[str]]:
    require_shared_data()
    want = set(BIG) | set(SMALL) | set(UNSEEN)
    out: dict[str, list[str]] = {d: [] for d in want}
    with (DATA / "multidomain_text" / "multidomain_text.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            d, t = rec["domain"], rec["text"]
            if d in want and 30 <= len(t) <= 200 and _bucket(t) >= 4 and len(out[d]) < N_TASK + N_HELD + N_FIT:
                out[d].append(t)
    return out


def test_a_text_tasks_state_is_the_sum_of_its_samples_prompt_states(world: dict[str, Any]) -> None:
    ex, samples = world["extractor"], [Sample(text=t) for t in world["texts"]["wikipedia"][:3]]
    whole = ex.extract(samples, mode="text").state
    side = prompt_side(ex, samples, "text")
    summed = side.cal_states[0].merge(side.cal_states[1]).merge(side.cal_states[2])
    whole_sums = np.asarray(whole.sums)
    # float32 sums accumulated in a different order: tolerance relative to the largest entry
    np.testing.assert_allclose(np.asarray(summed.sums), whole_sums, rtol=1e-4, atol=1e-6 * np.abs(whole_sums).max())
    assert summed.n_draws == whole.n_draws


def _boolq() -> list[Sample]:
    rows = []
    with (DATA / "superglue" / "BoolQ_val.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            prompt = f"{rec['passage'][:160]}\nQuestion: {rec['question']}?\nAnswer:"
            if _bucket(prompt) >= 4:
                rows.append(Sample(prompt=prompt, completion=" yes" if rec["label"] else " no"))
            if len(rows) >= N_TASK + N_HELD:
                break
    return rows



@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    from atlas.settings import Settings
    from fishersketch import Sketcher
    from workers.extraction import Extractor
    from workers.model_loading import load_causal_lm

    texts = _texts()
    s = Settings()
    lm = load_causal_lm("bundled", device="cpu")
    spec = lm.make_spec(m=SKETCH_DIM, seed=s.sketch_seed, error_projection=s.error_projection)
    ex = Extractor(lm, Sketcher(spec, device=lm.device), max_tokens_per_sample=s.max_tokens_per_sample)

    def task(samples: list[Sample], mode: str) -> tuple[Any, Any, routing.Calibration, TaskTerms]:
        side = prompt_side(ex, samples, mode)  # every sample is a calibration sample (n <= 32)
        if mode == "completion":
            state, route_state = ex.extract(samples, mode=mode).state, side.prompt_sum
        else:  # a text task's state is the sum of its samples' prompt-mode states (same forward)
            state = side.cal_states[0].copy()
            for st in side.cal_states[1:]:
                state.merge_(st)
            route_state = state
        cal = routing.calibrate(routing.leave_one_out_scores(route_state, side.cal_states))
        record = lexicon_repo.LexicalRecord.empty().add(lexicon_repo.LexicalDelta.of_samples(samples, mode))
        return state, route_state, cal, record.terms()  # what the job stores and the router reads

    tasks: dict[str, tuple[Any, Any, routing.Calibration, TaskTerms]] = {}
    for d in BIG:
        tasks[d] = task([Sample(text=t) for t in texts[d][:N_TASK]], "text")
    for n, d in zip((1, 2, 3), SMALL, strict=True):
        tasks[f"small{n}"] = task([Sample(text=t) for t in texts[d][:n]], "text")
    boolq = _boolq()
    tasks["boolq"] = task(boolq[:N_TASK], "completion")
    names = list(tasks)
    cands = [routing.Candidate(i, nm, tasks[nm][1], 0.0, routing.state_view(tasks[nm][1]),
                               threshold=tasks[nm][2].threshold, scale=tasks[nm][2].scale, terms=tasks[nm][3])
             for i, nm in enumerate(names)]
    # The service's ranking transform, fitted on the stored (indexed) signatures of the space; None
    # here (fewer than WHITEN_MIN_TASKS tasks), so prompts are ranked by the route score, as the service does.
    means = np.stack([routing.unit_means(c.state) for c in cands])  # what each task routes on
    whitening = fit_space_whitening(means[:, 0], means[:, 1])
    assert (whitening is None) == (len(names) < WHITEN_MIN_TASKS)

    def scores(text: str) -> Routed:
        ans = routing.rerank_route(ex.prompt(text).state, cands, k=len(cands), threshold=0.0, per_task=True,
                                   whitening=whitening, prompt_terms=TermCounts.from_texts([text]))
        return Routed({m.task_id: m.score for m in ans.matches}, ans.matches[0].task_id)

    held = {d: [scores(t) for t in texts[d][N_TASK : N_TASK + N_HELD]] for d in BIG}
    fit = {d: [scores(t) for t in texts[d][N_TASK + N_HELD :]] for d in BIG}
    held["boolq"] = [scores(smp.prompt or "") for smp in boolq[N_TASK:]]
    none_fit = [scores(t) for d in UNSEEN for t in texts[d][:N_FIT]]
    none_held = [scores(t) for d in UNSEEN for t in texts[d][N_FIT : N_FIT + N_HELD]]
    return {"names": names, "tasks": tasks, "cands": cands, "held": held, "fit": fit, "none_fit": none_fit,
            "none_held": none_held, "default": s.route_threshold,
            "extractor": ex, "texts": texts}


def _top(r: Routed) -> int:
    return r.best


def test_small_tasks_never_take_a_well_populated_tasks_prompts(world: dict[str, Any]) -> None:
    names = world["names"]
    small = {i for i, nm in enumerate(names) if nm.startswith("small")}
    taken = 0
    for d in BIG:
        own = names.index(d)
        tops = [_top(sc) for sc in world["held"][d]]
        taken += sum(t in small for t in tops)
        assert sum(t == own for t in tops) >= 0.6 * len(tops), (d, [names[t] for t in tops])
    total = len(BIG) * N_HELD
    print(f"small tasks took the top-1 of {taken} of {total} held-out prompts of the well-populated tasks")
    # Never (the old score gave 21 %). At m = 1024 sketch noise let one wikipedia sentence reach the
    # 2-sample news_sports task; at the service's m = 4096 none does.
    assert taken == 0, taken
    for r in (x for d in BIG for x in world["held"][d]):
        assert all(-1.0 <= v <= 1.0 for v in r.scores.values())


def test_a_completion_task_receives_its_own_prompts(world: dict[str, Any]) -> None:
    names = world["names"]
    own = names.index("boolq")
    tops = [_top(sc) for sc in world["held"]["boolq"]]
    rate = sum(t == own for t in tops) / len(tops)
    print(f"completion-mode BoolQ: {rate:.0%} of its held-out prompts routed to it")
    assert rate >= 0.8, [names[t] for t in tops]


def test_fit_lowers_false_accepts_within_the_false_reject_rate(world: dict[str, Any]) -> None:
    names, tasks = world["names"], world["tasks"]
    default = world["default"]
    current = {i: tasks[nm][2].threshold for i, nm in enumerate(names) if tasks[nm][2].threshold is not None}
    items = [FitItem(names.index(d), r.scores, r.best) for d in BIG for r in world["fit"][d]]
    items += [FitItem(None, r.scores, r.best) for r in world["none_fit"]]
    cal = {i: tasks[nm][2].scores for i, nm in enumerate(names)}
    res = fit_thresholds(items, current, cal, default=default)
    after = {**current, **res.thresholds}

    def accepted(r: Routed, thr: dict[int, float]) -> int | None:
        t = _top(r)
        return t if r.scores[t] >= thr.get(t, default) else None

    fa_before = np.mean([accepted(sc, current) is not None for sc in world["none_held"]])
    fa_after = np.mean([accepted(sc, after) is not None for sc in world["none_held"]])
    in_task = [(names.index(d), sc) for d in BIG for sc in world["held"][d]]
    fr_before = np.mean([accepted(sc, current) != lab for lab, sc in in_task if _top(sc) == lab])
    fr_after = np.mean([accepted(sc, after) != lab for lab, sc in in_task if _top(sc) == lab])
    print(f"fit: false accepts {fa_before:.2f} -> {fa_after:.2f}; false rejects {fr_before:.2f} -> {fr_after:.2f}; "
          f"fit accuracy {res.accuracy_before:.2f} -> {res.accuracy_after:.2f}")
    assert res.accuracy_after >= res.accuracy_before
    # Strictly lower (measured 0.94 -> 0.81 on these close unseen news/paper-title domains).
    assert fa_after < fa_before
    # documented rate 5 %, plus the sampling error of 40 held-out prompts (one prompt = 2.5 %)
    assert fr_after <= max(fr_before, routing.FALSE_REJECT_RATE + 0.05)
