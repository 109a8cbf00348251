"""Experiment 4b's open-set study (:mod:`bench.quality.openset`): routers on prompts of tasks left out of the index.

In each of ``--repeats`` random draws 20 % of the tasks are *unseen* (left out of the index). Every task's
threshold is calibrated as a job does it (up to 32 of its signature samples scored leave-one-out, 5 % false-reject
target). The indexed tasks' 10 held-out prompts are split 5 for ``fit`` / 5 for evaluation; the unseen tasks are
split in two halves, one giving "none" examples to ``fit``, the other evaluated (and then swapped: cross-fitting,
so no unseen task is both fitted on and evaluated). Routers (:data:`ROUTERS`): FisherAtlas with its calibrated
thresholds and template test (no labels), FisherAtlas after ``fit``, and a threshold fitted by accuracy on the
same labelled prompts (semantic-router's ``fit`` objective) for FisherAtlas and for a MiniLM centroid router.
Reported: "none" on unseen prompts (goal ≥ 0.90), "none" on indexed prompts (goal ≤ 0.05), answered-right on
indexed prompts, and the AUROC of the best score (indexed vs unseen).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from atlas import routing
from atlas.route_calibration import FALSE_REJECT_RATE, split_rates
from atlas.route_fit import FitItem, fit_thresholds, novelty_to_turn_off, templates_to_turn_off
from bench.quality.common import log, make_extractor
from bench.quality.space_threshold import space_threshold

UNSEEN_SHARE = 0.2
N_FIT = 5
DEFAULT_THRESHOLD = 0.05
ORACLE_FALSE_NONE = 0.05
"""The open-set goal's rate of "none" on indexed prompts, at which the oracle rows are read."""


def _best(scores: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Best column (as a task index) and its score, per row, among ``cols``."""
    sub = scores[:, cols]
    j = np.argmax(sub, axis=1)
    return cols[j], sub[np.arange(len(sub)), j]


def _fit_global(best_score: np.ndarray, best: np.ndarray, labels: np.ndarray) -> float:
    """The single threshold that maximises accuracy on labelled prompts (label −1 = none)."""
    grid = np.unique(np.concatenate([best_score, [-1.0, 1.0]]))
    acc = [np.mean(np.where(best_score >= t, best, -1) == labels) for t in grid]
    return float(grid[int(np.argmax(acc))])


def _rates(answer: np.ndarray, truth: np.ndarray, unseen: np.ndarray, in_score: np.ndarray) -> dict[str, float]:
    """none on unseen / indexed prompts, answered right on indexed prompts, AUROC (answer −1 = none)."""
    return {"none_unseen": float(np.mean(answer[unseen] == -1)),
            "none_indexed": float(np.mean(answer[~unseen] == -1)),
            "right_indexed": float(np.mean(answer[~unseen] == truth[~unseen])),
            "auroc": float(roc_auc_score(~unseen, in_score))}


def _oracle_rates(best: np.ndarray, score: np.ndarray, label: np.ndarray, unseen: np.ndarray,
                  is_eval: np.ndarray) -> dict[str, float]:
    """Rates of the one threshold on ``score`` that answers "none" to exactly ``ORACLE_FALSE_NONE`` of the
    *evaluated* indexed prompts — chosen on the test prompts themselves: the most "none" on unseen prompts
    any single threshold on this score can reach at the goal's false-"none" rate (a ceiling, not a router)."""
    thr = float(np.quantile(score[is_eval & ~unseen], ORACLE_FALSE_NONE))
    ans = np.where(score >= thr, best, -1)
    return _rates(ans[is_eval], label[is_eval], unseen[is_eval], score[is_eval])


@dataclass
class Novelty:
    """The product's novelty test in one draw's space (:func:`bench.quality.novelty.novelty_rejects`).

    Attributes
    ----------
    rejects : ndarray, shape (P, T), bool
        The task's test (at half its false-reject rate) rejects the prompt.
    tested : ndarray, shape (T,), bool
    split_thresholds : ndarray, shape (T,)
        Each task's route threshold calibrated at half its rate (used for tested tasks).
    """

    rejects: np.ndarray
    tested: np.ndarray
    split_thresholds: np.ndarray


def _per_task_rows(S: np.ndarray, top: np.ndarray, top_score: np.ndarray, thr_auto: np.ndarray,
                   cal: list[routing.Calibration], indexed: np.ndarray, label: np.ndarray, unseen: np.ndarray,
                   is_fit: np.ndarray, is_eval: np.ndarray, nearest: np.ndarray | None = None,
                   auroc_score: np.ndarray | None = None, lacks: np.ndarray | None = None,
                   nearest_needs_route_score: bool = True, novelty: Novelty | None = None
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """Rates with the calibrated per-task thresholds, then after ``fit`` on the ``is_fit`` prompts, for the
    answers ``top`` held to their task's threshold on the route score ``top_score`` and, with ``nearest``
    (the task nearest before the typical-score term), to that task's threshold too, and with ``lacks``
    (P, T) bool (the prompt lacks the task's active template) to the answered task's template, as
    :func:`atlas.routing.rerank_route` does (the nearest task rejects only when it is nearer by the route score
    too, unless ``nearest_needs_route_score`` is false: the rule before 2026-11-25), and with ``novelty`` to the
    answered task's novelty test, a tested task's route threshold then taken at half its rate (unless ``fit``
    overrode it). ``fit`` then runs as the product's does: it turns off the template and novelty tests of the tasks
    whose ``is_fit`` prompts they reject too often (:func:`atlas.route_fit.templates_to_turn_off`,
    :func:`atlas.route_fit.novelty_to_turn_off`; such a task is then held to its full-rate threshold) before it
    tunes the thresholds. AUROC on ``auroc_score`` (default ``top_score``)."""
    rows = np.arange(len(top))
    nearest = top if nearest is None else nearest
    template = np.zeros(len(top), bool) if lacks is None else lacks[rows, top]
    nearer = S[rows, nearest] >= S[rows, top] if nearest_needs_route_score else np.ones(len(top), bool)
    novel = np.zeros(len(top), bool) if novelty is None else novelty.rejects[rows, top]
    tested = np.zeros(len(thr_auto), bool) if novelty is None else novelty.tested

    def rejects(thr: np.ndarray, tests_on: np.ndarray) -> np.ndarray:
        """Answers forced to "none" whatever the answered task's own threshold; ``tests_on`` (T, 2) bool: each
        task's template and novelty switches."""
        return np.asarray(((nearest != top) & nearer & (S[rows, nearest] < thr[nearest]))
                          | (template & tests_on[top, 0]) | (novel & tests_on[top, 1]))

    def answer_threshold(thr: np.ndarray, overridden: np.ndarray, split: np.ndarray) -> np.ndarray:
        """The answered task's threshold: its half-rate one when it has a novelty test and no override."""
        if novelty is None:
            return thr[top]
        return np.where(split[top] & ~overridden[top], novelty.split_thresholds[top], thr[top])

    tests_on = np.ones((len(thr_auto), 2), bool)
    floored = rejects(thr_auto, tests_on)
    auroc_score = top_score if auroc_score is None else auroc_score
    no_override = np.zeros(len(thr_auto), bool)
    ans = np.where((top_score >= answer_threshold(thr_auto, no_override, tested)) & ~floored, top, -1)
    auto = _rates(ans[is_eval], label[is_eval], unseen[is_eval], auroc_score[is_eval])
    fit_rows = np.flatnonzero(is_fit)
    labels = [int(label[i]) if label[i] >= 0 else None for i in fit_rows]
    answered: list[int | None] = [int(top[i]) for i in fit_rows]
    tests_on[list(templates_to_turn_off(labels, answered, template[fit_rows].tolist())), 0] = False
    tests_on[list(novelty_to_turn_off(labels, answered, novel[fit_rows].tolist())), 1] = False
    split = tested & tests_on[:, 1]
    floored = rejects(thr_auto, tests_on)
    items = [FitItem(lab, {int(t): float(S[i, t]) for t in indexed}, int(top[i]), forced_none=bool(floored[i]))
             for lab, i in zip(labels, fit_rows, strict=True)]
    # as the product's fit: a task with a novelty test starts from its half-rate threshold and caps at half its rate
    current = {int(t): float(novelty.split_thresholds[t]) if novelty is not None and split[t] else float(thr_auto[t])
               for t in indexed}
    rates = {int(t): split_rates(FALSE_REJECT_RATE)[0] if split[t] else FALSE_REJECT_RATE for t in indexed}
    fitted = fit_thresholds(items, current, {t: cal[t].scores for t in indexed}, default=DEFAULT_THRESHOLD,
                            false_reject_rate=rates)
    thr_fit = thr_auto.copy()
    overridden = np.zeros(len(thr_auto), bool)
    for t, v in fitted.thresholds.items():
        thr_fit[t], overridden[t] = v, True
    ans = np.where((top_score >= answer_threshold(thr_fit, overridden, split)) & ~rejects(thr_fit, tests_on), top, -1)
    return auto, _rates(ans[is_eval], label[is_eval], unseen[is_eval], auroc_score[is_eval])


def open_set(S: np.ndarray, M: np.ndarray, truth: np.ndarray, per_prompt: np.ndarray, cal: list[routing.Calibration],
             repeats: int, seed: int, rank: Any = None, hybrid: Any = None, lacks: np.ndarray | None = None,
             novelty: Callable[[np.ndarray], Novelty] | None = None) -> dict[str, Any]:
    """The open-set protocol of the module notes; medians over repeats (cross-fitted halves averaged).

    ``rank(indexed)``, when given, returns the product's shrunk cosines and ranking matrix for a draw's
    indexed tasks (:func:`rank_parts_matrix`): the answered task is the ranking's best column, held to
    that task's threshold on the route score ``S`` and to that of the cosines' best column.
    ``hybrid(ranked, indexed)``, when given, returns the product's answered column per prompt with
    lexical evidence (:func:`hybrid_best`): the product rows then use it, the ranking's best column
    gives the "no lexical" row. ``lacks`` (P, T) bool, when given: the prompt lacks the task's active
    template (:mod:`atlas.template`); the product rows answer "none" then, the "no template" row does not.
    ``novelty(indexed)``, when given, returns the draw's :class:`Novelty` (the test fitted on the indexed tasks):
    the product rows apply it, the "no novelty test" row does not.
    """
    T = S.shape[1]
    thr_auto = np.array([c.threshold if c.threshold is not None else DEFAULT_THRESHOLD for c in cal])
    rng = np.random.default_rng(seed)
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):
        unseen_tasks = rng.choice(T, round(UNSEEN_SHARE * T), replace=False)
        halves = np.array_split(rng.permutation(unseen_tasks), 2)
        indexed = np.setdiff1d(np.arange(T), unseen_tasks)
        nov = novelty(indexed) if novelty is not None else None
        for fit_half, eval_half in ((halves[0], halves[1]), (halves[1], halves[0])):
            is_fit = (np.isin(truth, indexed) & (per_prompt < N_FIT)) | np.isin(truth, fit_half)
            is_eval = (np.isin(truth, indexed) & (per_prompt >= N_FIT)) | np.isin(truth, eval_half)
            label = np.where(np.isin(truth, indexed), truth, -1)
            unseen = ~np.isin(truth, indexed)
            res: dict[str, dict[str, float]] = {}
            best, bs = _best(S, indexed)
            res["fs_auto"], res["fs_fit"] = _per_task_rows(S, best, bs, thr_auto, cal, indexed, label, unseen,
                                                           is_fit, is_eval)
            g = _fit_global(bs[is_fit], best[is_fit], label[is_fit])
            ans = np.where(bs >= g, best, -1)
            res["fs_global"] = _rates(ans[is_eval], label[is_eval], unseen[is_eval], bs[is_eval])
            if rank is not None:
                near, ranked = rank(indexed)
                wb, wr = _best(ranked, indexed)
                nb, _ = _best(near, indexed)
                rows = (indexed, label, unseen, is_fit, is_eval)
                if hybrid is not None:
                    res["fsw_fisher_only"], _ = _per_task_rows(S, wb, S[np.arange(len(S)), wb], thr_auto, cal,
                                                               *rows, nearest=nb, auroc_score=wr)
                    wb = hybrid(ranked, indexed)
                    wr = ranked[np.arange(len(S)), wb]
                ws = S[np.arange(len(S)), wb]
                res["fsw_auto"], res["fsw_fit"] = _per_task_rows(S, wb, ws, thr_auto, cal, *rows, nearest=nb,
                                                                 auroc_score=wr, lacks=lacks, novelty=nov)
                if nov is not None:
                    res["fsw_no_novelty"], res["fsw_fit_no_novelty"] = _per_task_rows(
                        S, wb, ws, thr_auto, cal, *rows, nearest=nb, auroc_score=wr, lacks=lacks)
                if lacks is not None:
                    res["fsw_no_template"], _ = _per_task_rows(S, wb, ws, thr_auto, cal, *rows, nearest=nb,
                                                               auroc_score=wr, novelty=nov)
                res["fsw_nearest_whitened"], _ = _per_task_rows(S, wb, ws, thr_auto, cal, *rows, nearest=nb,
                                                                auroc_score=wr, lacks=lacks,
                                                                nearest_needs_route_score=False, novelty=nov)
                res["fsw_alone"], _ = _per_task_rows(S, wb, ws, thr_auto, cal, *rows, auroc_score=wr)
                res["fsw_oracle"] = _oracle_rates(wb, wr, label, unseen, is_eval)
                # a replay, not the product: one threshold for the space, the 5 % quantile of the indexed tasks'
                # pooled held-out route scores (bench 4d's reading), on the answered task's route score
                space = space_threshold((x for t in indexed for x in cal[t].scores), FALSE_REJECT_RATE)
                res["fsw_space"] = _rates(np.where(ws >= space, wb, -1)[is_eval], label[is_eval], unseen[is_eval],
                                          ws[is_eval])
            mb, ms = _best(M, indexed)
            g = _fit_global(ms[is_fit], mb[is_fit], label[is_fit])
            ans = np.where(ms >= g, mb, -1)
            res["minilm_global"] = _rates(ans[is_eval], label[is_eval], unseen[is_eval], ms[is_eval])
            res["minilm_oracle"] = _oracle_rates(mb, ms, label, unseen, is_eval)
            for k, v in res.items():
                runs.setdefault(k, []).append(v)
    return {k: {m: float(np.median([r[m] for r in v])) for m in v[0]} | {"runs": len(v)} for k, v in runs.items()}


def novelty_of(args: argparse.Namespace, lm: Any, names: list[str], splits: dict[str, Any],
               heldout: dict[str, list[str]], prompt_tasks: list[str], cal: list[routing.Calibration]
               ) -> Callable[[np.ndarray], Novelty] | None:
    """The product's novelty test for a draw's indexed tasks: every task's stored vectors (its signature samples'
    bottom-k) and every held-out prompt's vector, computed once (``None`` with ``--no-novelty``)."""
    from bench.quality.novelty_vectors import kept_vectors, novelty_rejects, text_vectors

    if getattr(args, "no_novelty", False):
        return None
    ext = make_extractor(lm, None, args)
    task_vectors = [kept_vectors(ext, [x.input for x in splits[n][0]]) for n in names]
    texts = {n: list(heldout[n]) for n in names}
    prompts = [texts[t].pop(0) for t in prompt_tasks]  # the prompts in the order of the features
    prompt_vectors = text_vectors(ext, prompts)
    route_rate, novelty_rate = split_rates(FALSE_REJECT_RATE)
    full = [c.threshold if c.threshold is not None else DEFAULT_THRESHOLD for c in cal]
    parts = [routing.calibrate(c.scores, route_rate).threshold for c in cal]
    split = np.array([f if h is None else h for f, h in zip(full, parts, strict=True)])  # too few: the full one
    log(f"novelty vectors: {sum(len(v) for v in task_vectors)} of tasks, {len(prompts)} of prompts")

    def draw(indexed: np.ndarray) -> Novelty:
        rejects, tested = novelty_rejects(task_vectors, prompt_vectors, indexed, novelty_rate)
        return Novelty(rejects, tested, split)
    return draw

ROUTERS = {"fsw_auto": "FisherAtlas (product: ranking fused with lexical; answered and nearest task's thresholds, "
                       "answered task's template and novelty test), calibrated per-task thresholds (no labels)",
           "fsw_no_template": "FisherAtlas (product) without the template test",
           "fsw_no_novelty": "FisherAtlas (product) without the novelty test (before 2026-11-27)",
           "fsw_fit_no_novelty": "FisherAtlas (product) without the novelty test + `fit`",
           "fsw_nearest_whitened": "FisherAtlas (product), the nearest task by whitened cosine alone rejecting "
                                   "(before 2026-11-25)",
           "fsw_fit": "FisherAtlas (product) + `fit` (labelled prompts incl. none)",
           "fsw_alone": "FisherAtlas, ranking score, the answered task's threshold alone",
           "fsw_fisher_only": "FisherAtlas ordered by the Fisher ranking alone (no lexical evidence), calibrated",
           "fs_auto": "FisherAtlas ranked by route score (before), calibrated per-task thresholds",
           "fs_fit": "FisherAtlas ranked by route score (before) + `fit`",
           "fs_global": "FisherAtlas, one threshold fitted by accuracy",
           "minilm_global": "all-MiniLM-L6-v2 centroid, one threshold fitted by accuracy",
           "fsw_space": "replay, not the product: the product's answer, one space threshold on its route score (the "
                        "5 % quantile of the indexed tasks' pooled held-out scores, no labels)",
           "fsw_oracle": "ceiling: FisherAtlas rank score, one threshold set on the test prompts (5 % none, indexed)",
           "minilm_oracle": "ceiling: MiniLM best cosine, one threshold set on the test prompts (5 % none, indexed)"}
