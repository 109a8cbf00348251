"""Experiment 4b — open set, small-task robustness and completion-mode routing (issue 13).

Same 105 multitask_instructions tasks, splits, index cache and prompts as experiment 4
(:mod:`bench.quality.routing`), scored with the product's route score and calibration
(:mod:`atlas.routing`, :mod:`workers.calibration`, :mod:`atlas.route_fit`):

* **Open set.** In each of ``--repeats`` random draws 20 % of the tasks are *unseen* (left out of the
  index). Every task's threshold is calibrated as a job does it (up to 32 of its signature samples
  scored leave-one-out, 5 % false-reject target). The indexed tasks' 10 held-out prompts are split
  5 for ``fit`` / 5 for evaluation; the unseen tasks are split in two halves, one giving "none"
  examples to ``fit``, the other evaluated (and then swapped: cross-fitting, so no unseen task is
  both fitted on and evaluated). Routers: FisherAtlas with its calibrated thresholds and template test (no labels),
  FisherAtlas after ``fit``, and a threshold fitted by accuracy on the same labelled prompts
  (semantic-router's ``fit`` objective) for FisherAtlas and for a MiniLM centroid router.
  Reported: "none" on unseen prompts (goal ≥ 0.90), "none" on indexed prompts (goal ≤ 0.05),
  answered-right on indexed prompts, and the AUROC of the best score (indexed vs unseen).
* **Small tasks.** For source tasks drawn at random and k = 1, 2, 3, the task is replaced in the
  index by one built from k of its samples; counted: other tasks' held-out prompts whose top-1
  becomes the small task, under the product score and under the old score (cosine over the bare
  unbiased self-similarity, no prior).
* **Completion-mode tasks.** BoolQ, RTE and CB (SuperGLUE) added as prompt/completion pairs
  (passage + question → " yes"/" no") beside the 105 text tasks; their held-out prompts routed on
  the prompt-side state (the product) and on the completion state (before), with MiniLM on the
  prompts for reference.

Run: ``python -m bench.quality.openset`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from atlas import lexicon_repo, routing
from atlas.lexical import TaskTerms, TermCounts
from atlas.route_calibration import FALSE_REJECT_RATE, split_rates
from atlas.route_fit import FitItem, fit_thresholds, novelty_to_turn_off, templates_to_turn_off
from atlas.samples import Sample
from atlas.template import TaskTemplate
from atlas.whitening import WHITEN_MIN_TASKS, fit_space_whitening
from bench.quality import report
from bench.quality.common import log, make_extractor, make_sketcher, pct, run_and_report
from bench.quality.data import load_superglue_binary
from bench.quality.routing import (
    calibration_states,
    load_encoder,
    load_experiment,
    parse_routing_args,
    routing_settings,
    typicals,
)
from bench.quality.space_threshold import space_threshold
from workers.calibration import prompt_side

UNSEEN_SHARE = 0.2
N_FIT = 5
DEFAULT_THRESHOLD = 0.05
ORACLE_FALSE_NONE = 0.05
"""The open-set goal's rate of "none" on indexed prompts, at which the oracle rows are read."""
COMPLETION_SETS = ("boolq", "rte", "cb")


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def score_matrix(prompt_states: list[Any], task_states: list[Any], *, prior: bool = True) -> np.ndarray:
    """Route scores, shape (prompts, tasks): the product's score, or (``prior=False``) the old one.

    The old score divides by the bare unbiased self-similarity ``√Ŝ`` (no prior, no noise term).
    """
    units = np.stack([routing.unit_signature(s) for s in prompt_states])
    cols = []
    for st in task_states:
        s, q, n = routing.totals(st)
        if prior:
            den = routing.denominator(s[0], q[0], n, int(st.n_samples))
        else:
            den = routing.denominator(s[0], q[0], n, int(st.n_samples), prior_draws=0.0, prior_samples=0.0)
        cols.append(s[0] / max(n, 1) / den if den > 0 else np.zeros_like(s[0]))
    out: np.ndarray = units @ np.stack(cols).T
    return np.clip(out, -1.0, 1.0) if prior else out


def rank_matrix(prompt_states: list[Any], task_states: list[Any], fit_cols: np.ndarray,
                typical: np.ndarray, min_tasks: int = WHITEN_MIN_TASKS) -> np.ndarray:
    """The product's ranking scores, shape (prompts, tasks): :func:`rank_parts_matrix`'s second part."""
    return rank_parts_matrix(prompt_states, task_states, fit_cols, typical, min_tasks)[1]


def rank_parts_matrix(prompt_states: list[Any], task_states: list[Any], fit_cols: np.ndarray,
                      typical: np.ndarray, min_tasks: int = WHITEN_MIN_TASKS) -> tuple[np.ndarray, np.ndarray]:
    """The shrunk whitened cosines and the ranking scores, shapes (prompts, tasks) — the matrix form of
    :func:`atlas.routing.rank_parts`: whitened ``ae`` and error cosines, averaged, shrunk by the prior;
    then less ``RANK_TYPICAL_WEIGHT`` times the task's ``typical`` score (T,).

    The whitening is fitted on the unit means of the tasks ``fit_cols`` (the indexed ones), as the
    service fits it on the space's routing means (:mod:`atlas.whitening`); below ``min_tasks`` tasks the
    service ranks by :func:`atlas.routing.unwhitened_rank`, and so does this.
    """
    p = np.stack([routing.unit_means(s) for s in prompt_states])  # (P, 2, m): ae, error
    t = np.stack([routing.unit_means(s) for s in task_states])
    w = fit_space_whitening(t[fit_cols, 0], t[fit_cols, 1], min_tasks=min_tasks)
    if w is None:  # too few tasks to whiten: the service ranks by routing.unwhitened_rank
        prior = routing.evidence_prior([int(s.n_samples) for s in task_states])
        route = score_matrix(prompt_states, task_states) * prior[None, :]
        return route, route
    cos = w.ae.apply(p[:, 0]) @ w.ae.apply(t[:, 0]).T
    if w.error is not None:
        cos = (cos + w.error.apply(p[:, 1]) @ w.error.apply(t[:, 1]).T) / 2.0
    views = [routing.state_view(s) for s in task_states]
    shrink = routing.size_shrink(np.array([np.linalg.norm(v[0][0]) for v in views]), np.array([v[2] for v in views]),
                                 np.array([int(s.n_samples) for s in task_states]))
    lam = routing.RANK_TYPICAL_WEIGHT
    shrunk = cos * shrink[None, :]
    return shrunk, (shrunk - lam * np.asarray(typical)[None, :]) / (1.0 + lam)


def hybrid_best(rank: np.ndarray, sig: np.ndarray, prompt_terms: list[Any], task_terms: list[Any],
                n_samples: np.ndarray, cols: np.ndarray, always: np.ndarray | None = None) -> np.ndarray:
    """The task the product answers for each prompt, shape (P,): among ``cols``, the FAISS candidates (top
    ``default_candidates(3)`` by signature cosine ``sig`` (P, T), plus the ``always`` columns: completion
    tasks) ordered by :func:`atlas.lexical.fuse` of the ranking scores ``rank`` (P, T) and the prior-weighted
    lexical scores, as :func:`atlas.routing.rerank_route` does with terms."""
    from atlas.analysis import default_candidates
    from atlas.lexical import hybrid_key

    prior = routing.evidence_prior(n_samples)
    extra = np.array([], dtype=int) if always is None else np.intersect1d(always, cols)
    out = np.empty(len(rank), dtype=int)
    for i in range(len(rank)):
        top = cols[np.argsort(-sig[i, cols], kind="stable")[:default_candidates(3)]]
        cand = np.union1d(top, extra)
        key, _ = hybrid_key(rank[i, cand], prompt_terms[i], [task_terms[j] for j in cand], prior[cand])
        out[i] = cand[np.lexsort((-rank[i, cand], -key))[0]]
    return out


def lexical_cost(task_texts: list[list[str]], repeats: int = 3) -> dict[str, float]:
    """Microseconds per word (median of ``repeats``) of what a job computes of its samples' words: the term
    counts alone, and the counts with the template (:class:`atlas.lexicon_repo.LexicalDelta`)."""
    import time

    from atlas.lexicon_repo import LexicalDelta

    words = max(sum(len(t.split()) for texts in task_texts for t in texts), 1)
    out = {}
    for key, make in (("counts_us", TermCounts.from_texts), ("delta_us", LexicalDelta.of_texts)):
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for texts in task_texts:
                make(texts)
            runs.append(time.perf_counter() - t0)
        out[key] = float(np.median(runs)) / words * 1e6
    return out


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


def small_tasks(S_new: np.ndarray, S_old: np.ndarray, truth: np.ndarray, small_new: dict[tuple[int, int], np.ndarray],
                small_old: dict[tuple[int, int], np.ndarray], R: np.ndarray | None = None,
                small_rank: dict[tuple[int, int], np.ndarray] | None = None,
                small_top: dict[tuple[int, int], np.ndarray] | None = None) -> list[dict[str, Any]]:
    """Captures of other tasks' prompts by a k-sample task replacing its source, per k and score
    (``small_top``: the product's answered column per prompt with lexical evidence, :func:`hybrid_best`)."""
    rows = []
    for k in (1, 2, 3) if small_top else ():
        sel = [(src, top) for (src, kk), top in small_top.items() if kk == k]
        other = [(truth != src, top == src) for src, top in sel]
        rows.append({"k": k, "score": "ranking fused with lexical (product)",
                     "taken": int(sum(np.sum(hit[o]) for o, hit in other)),
                     "total": int(sum(o.sum() for o, _ in other)),
                     "own": int(sum(np.sum(hit[~o]) for o, hit in other)),
                     "own_total": int(sum((~o).sum() for o, _ in other)), "max_score": float("nan")})
    kinds = [("route score", S_new, small_new), ("old score (no prior)", S_old, small_old)]
    if R is not None and small_rank is not None:
        kinds.insert(0, ("whitened ranking alone", R, small_rank))
    for k in (1, 2, 3):
        for name, S, small in kinds:
            taken = total = own = own_total = 0
            max_score = -np.inf
            for (src, kk), col in small.items():
                if kk != k:
                    continue
                if col.ndim == 2:  # a whole re-fitted ranking matrix
                    Sx, col = col, col[:, src]
                else:
                    Sx = S.copy()
                    Sx[:, src] = col
                other = truth != src
                top = np.argmax(Sx, axis=1)
                taken += int(np.sum(top[other] == src))
                total += int(other.sum())
                own += int(np.sum(top[~other] == src))
                own_total += int((~other).sum())
                max_score = max(max_score, float(col.max()))
            rows.append({"k": k, "score": name, "taken": taken, "total": total, "own": own, "own_total": own_total,
                         "max_score": max_score})
    return rows


def landing(answered: np.ndarray, names: list[str], top: int = 3) -> list[tuple[str, int]]:
    """The ``top`` tasks most often in ``answered`` (task indices into ``names``), with their counts."""
    ids, counts = np.unique(answered, return_counts=True)
    order = np.lexsort((ids, -counts))[:top]
    return [(names[int(ids[i])], int(counts[i])) for i in order]


def completion_tasks(args: argparse.Namespace, lm: Any, encoder: Any, index: Any, S_text: np.ndarray,
                     typical: np.ndarray, n_sig: int, n_held: int) -> dict[str, Any]:
    """Route held-out prompts of SuperGLUE completion tasks added beside the text tasks."""
    ex = make_extractor(lm, make_sketcher(lm, args.m, args.seeds[0]), args)
    comp, side, side_cal, held, minilm_c, comp_terms = [], [], [], {}, [], []
    for k, ds in enumerate(COMPLETION_SETS):
        rows = load_superglue_binary(ds)
        perm = np.random.default_rng(1000 + k).permutation(len(rows))
        samples = [Sample(prompt=f"{rows[i][0]}\nQuestion: {rows[i][1]}\nAnswer:",
                          completion=" yes" if rows[i][2] else " no") for i in perm[: n_sig + n_held]]
        sig, held[ds] = samples[:n_sig], [s.prompt or "" for s in samples[n_sig:]]
        comp.append(ex.extract(sig, mode="completion").state)
        ps = prompt_side(ex, sig, "completion")
        side.append(ps.prompt_sum)
        side_cal.append(ps.cal_states)
        comp_terms.append(lexicon_repo.LexicalDelta.of_samples(sig, "completion").counts)  # the job stores these
        if encoder is not None:
            minilm_c.append(encoder.encode([s.prompt or "" for s in sig]).mean(0))
    prompts = [ex.prompt(t).state for ds in COMPLETION_SETS for t in held[ds]]
    truth = np.repeat(np.arange(len(COMPLETION_SETS)) + S_text.shape[1], n_held)
    text_cols = score_matrix(prompts, index.states)
    out: dict[str, Any] = {"n_signature": n_sig, "n_heldout": n_held, "rows": {}}
    all_side = [*index.states, *side]
    R = rank_matrix(prompts, all_side, np.arange(len(all_side)), np.concatenate([typical, typicals(side, side_cal)]))
    cols = np.unique(truth)
    n_text = len(index.states)
    sig = np.stack([p.signature() for p in prompts]) @ np.stack([*index.signatures(), *[c.signature() for c in comp]]).T
    terms = [*index.terms, *[TaskTerms.of(t) for t in comp_terms]]
    top = hybrid_best(R, sig, [TermCounts.from_texts([t]) for ds in COMPLETION_SETS for t in held[ds]], terms,
                      np.array([int(s.n_samples) for s in all_side]), np.arange(len(all_side)),
                      always=np.arange(n_text, len(all_side)))
    out["rows"]["prompt-side state, ranking fused with lexical (product)"] = {
        ds: float(np.mean(top[truth == c] == c)) for ds, c in zip(COMPLETION_SETS, cols, strict=True)}
    out["elsewhere"] = {ds: landing(top[(truth == c) & (top != c)], index.names + list(COMPLETION_SETS))
                        for ds, c in zip(COMPLETION_SETS, cols, strict=True)}
    top = np.argmax(R, axis=1)
    out["rows"]["prompt-side state, whitened ranking alone"] = {
        ds: float(np.mean(top[truth == c] == c)) for ds, c in zip(COMPLETION_SETS, cols, strict=True)}
    for name, states in (("prompt-side state, route score", side), ("completion state (before)", comp)):
        S = np.concatenate([text_cols, score_matrix(prompts, states)], axis=1)
        top = np.argmax(S, axis=1)
        out["rows"][name] = {ds: float(np.mean(top[truth == c] == c)) for ds, c in
                             zip(COMPLETION_SETS, np.unique(truth), strict=True)}
    if encoder is not None and index.minilm:
        cent = _unit(np.concatenate([np.stack([e.mean(0) for e in index.minilm]), np.stack(minilm_c)]))
        q = _unit(encoder.encode([t for ds in COMPLETION_SETS for t in held[ds]]))
        top = np.argmax(q @ cent.T, axis=1)
        out["rows"]["all-MiniLM-L6-v2 centroid (prompts)"] = {
            ds: float(np.mean(top[truth == c] == c)) for ds, c in zip(COMPLETION_SETS, np.unique(truth), strict=True)}
    return out


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


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build (or load) the routing index and calibration, then the three studies."""
    from bench.quality.common import load_model

    lm = load_model(args)
    encoder = load_encoder(args)
    ex = load_experiment(args, lm, encoder, quick_stride=5)
    splits, names, index, feats, truth = ex.splits, ex.names, ex.index, ex.feats, ex.truth
    counts: dict[int, int] = {}
    ranks = []
    for t in truth:  # rank of each prompt within its task
        ranks.append(counts.get(int(t), 0))
        counts[int(t)] = ranks[-1] + 1
    per_prompt = np.array(ranks)
    cal_states = calibration_states(args, lm, names, splits)
    cal = [routing.calibrate(routing.leave_one_out_scores(index.states[i], cal_states[n])) for i, n in enumerate(names)]
    prompt_states = [f.state for f in feats]
    S = score_matrix(prompt_states, index.states)
    S_old = score_matrix(prompt_states, index.states, prior=False)
    if encoder is not None:
        M = _unit(np.stack([f.minilm for f in feats])) @ _unit(np.stack([e.mean(0) for e in index.minilm])).T
    else:
        M = S.copy()
    typical = np.array([routing.typical_score(c.scores) for c in cal])
    R = rank_matrix(prompt_states, index.states, np.arange(len(names)), typical)
    log(f"top-1: route score {np.mean(np.argmax(S, 1) == truth):.3f}, "
        f"whitened ranking {np.mean(np.argmax(R, 1) == truth):.3f}")
    sig = np.stack([f.signature for f in feats]) @ index.signatures().T  # the FAISS stage's scores
    p_terms = [f.terms for f in feats]
    n_samp = np.array([int(st.n_samples) for st in index.states])
    H = hybrid_best(R, sig, p_terms, index.terms, n_samp, np.arange(len(names)))
    log(f"top-1: ranking fused with lexical (product) {np.mean(truth == H):.3f}")
    templates = [TaskTemplate.of_texts(x.input for x in splits[n][0]) for n in names]  # one job each
    cost = lexical_cost([[x.input for x in splits[n][0]] for n in names])
    lacks = np.array([[t.missing(pt) > 0 for t in templates] for pt in p_terms])
    log(f"templates: {sum(t.active for t in templates)} of {len(names)} active; own prompts lacking theirs "
        f"{np.mean(lacks[np.arange(len(truth)), truth]):.2%}")
    novelty = novelty_of(args, lm, names, splits, index.heldout, [f.task for f in feats], cal)
    opens = open_set(S, M, truth, per_prompt, cal, args.repeats, args.seeds[0],
                     rank=lambda cols: rank_parts_matrix(prompt_states, index.states, cols, typical),
                     hybrid=lambda ranked, cols: hybrid_best(ranked, sig, p_terms, index.terms, n_samp, cols),
                     lacks=lacks, novelty=novelty)
    rng = np.random.default_rng(args.seeds[0] + 7)
    sources = rng.choice(len(names), min(args.small_sources, len(names)), replace=False)
    small_new, small_old, small_rank, small_top = {}, {}, {}, {}
    for src in sources:
        for k in (1, 2, 3):
            sts = cal_states[names[src]][:k]
            if len(sts) < k:
                continue
            st = sts[0].copy()
            for x in sts[1:]:
                st.merge_(x)
            small_new[(int(src), k)] = score_matrix(prompt_states, [st])[:, 0]
            small_old[(int(src), k)] = score_matrix(prompt_states, [st], prior=False)[:, 0]
            states_k = [*index.states[:src], st, *index.states[src + 1:]]  # the small task replaces its source
            # the whole matrix: the whitening is re-fitted with the small task in the space, as the service does
            typical_k = typical.copy()  # the small task's own calibration (none for 1 sample: the prior)
            typical_k[src] = typicals([st], [sts])[0]
            small_rank[(int(src), k)] = rank_matrix(prompt_states, states_k, np.arange(len(names)), typical_k)
            sig_k, terms_k, n_k = sig.copy(), list(index.terms), n_samp.copy()
            sig_k[:, src] = np.stack([f.signature for f in feats]) @ st.signature()
            pick = sorted(routing.calibration_pick(len(splits[names[src]][0])))[:k]  # the samples of cal_states
            terms_k[src] = TaskTerms.of(TermCounts.from_texts(splits[names[src]][0][i].input for i in pick))
            n_k[src] = k
            small_top[(int(src), k)] = hybrid_best(small_rank[(int(src), k)], sig_k, p_terms, terms_k, n_k,
                                                   np.arange(len(names)))
    small = small_tasks(S, S_old, truth, small_new, small_old, R, small_rank, small_top)
    comp = completion_tasks(args, lm, encoder, index, S, typical, 12 if args.quick else args.completion_signature,
                            5 if args.quick else args.completion_heldout)
    thr = np.array([c.threshold for c in cal if c.threshold is not None])
    return {"names": names, "n_prompts": len(feats), "open_set": opens, "small": small, "completion": comp,
            "top1": float(np.mean(np.argmax(S, 1) == truth)), "n_sources": len(sources),
            "top1_ranked": float(np.mean(np.argmax(R, 1) == truth)), "top1_hybrid": float(np.mean(truth == H)),
            "threshold_quantiles": np.quantile(thr, [0, 0.25, 0.5, 0.75, 1]).tolist() if thr.size else [],
            "repeats": args.repeats, "lm": lm, "templates_active": int(sum(t.active for t in templates)),
            "own_lacking": float(np.mean(lacks[np.arange(len(truth)), truth])), "lexical_cost": cost}


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


def render(res: dict[str, Any], facts: str) -> str:
    """Markdown for ``quality.md``."""
    o = res["open_set"]
    t1 = report.table(["Router", "none on unseen (goal ≥ 0.90)", "none on indexed (goal ≤ 0.05)",
                       "answered right, indexed", "AUROC (best score; product: its rank score)"],
                      [[ROUTERS[k], f"{v['none_unseen']:.3f}", f"{v['none_indexed']:.3f}",
                        pct(v["right_indexed"]), f"{v['auroc']:.3f}"] for k, v in o.items()])
    t2 = report.table(["Samples in the small task", "Score", "other tasks' prompts taken (top-1)",
                       "its source's prompts routed to it", "highest score it reached"],
                      [[r["k"], r["score"], f"{r['taken']} / {r['total']}", f"{r['own']} / {r['own_total']}",
                        f"{r['max_score']:.3f}" if np.isfinite(r["max_score"]) else "–"] for r in res["small"]])
    c = res["completion"]
    t3 = report.table(["Routed on", *COMPLETION_SETS],
                      [[k, *[pct(v[d]) for d in COMPLETION_SETS]] for k, v in c["rows"].items()])
    elsewhere = "".join(
        f"- {ds}: the product's other answers went to "
        + (", ".join(f"{name} ({k})" for name, k in c["elsewhere"][ds]) or "no other task") + "\n"
        for ds in COMPLETION_SETS if "elsewhere" in c)
    elsewhere += "\n" if elsewhere else ""
    n = len(res["names"])
    q = ", ".join(f"{x:.3f}" for x in res["threshold_quantiles"])
    return (
        f"{n} multitask_instructions tasks, {res['n_prompts']} held-out prompts (experiment 4's splits and index); "
        f"top-1 on all {n}: ranking fused with lexical (product) {res.get('top1_hybrid', float('nan')):.1%}, whitened "
        f"ranking alone {res['top1_ranked']:.1%}, route score alone {res['top1']:.1%}. "
        "Calibrated thresholds (min, quartiles, "
        f"max): {q}. Templates (atlas.template, one job of each task's signature samples): "
        f"{res.get('templates_active', 0)} of {n} active; {res.get('own_lacking', 0.0):.2%} of the held-out prompts "
        "lack their own task's. Worker cost per word of the tasks' samples (median of 3): term counts alone "
        f"{res.get('lexical_cost', {}).get('counts_us', float('nan')):.2f} µs, counts + template (the job's "
        f"lexical delta) {res.get('lexical_cost', {}).get('delta_us', float('nan')):.2f} µs.\n\n"
        f"**Open set** ({int(UNSEEN_SHARE * 100)} % of tasks unseen, {res['repeats']} draws × 2 cross-fitted halves; "
        "each column its own median over the runs):\n\n" + t1 + "\n\n"
        f"**Small tasks** (a task replaced by one of k of its samples; {res['n_sources']} random source tasks per k; "
        "prompts of all other tasks):\n\n" + t2 + "\n\n"
        f"**Completion-mode tasks** (SuperGLUE as prompt → \" yes\"/\" no\", {c['n_signature']} pairs each, "
        f"{c['n_heldout']} held-out prompts each, beside the {n} text tasks; share of own prompts routed to the "
        "task):\n\n" + t3 + "\n\n" + elsewhere + facts
    )


def main() -> None:
    """Command-line entry point."""
    import sys

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--repeats", type=int, default=5)
    extra.add_argument("--no-novelty", action="store_true", help="leave the novelty test out (no vectors computed)")
    extra.add_argument("--small-sources", type=int, default=30)
    extra.add_argument("--completion-heldout", type=int, default=100,
                       help="held-out prompts per completion task (CB has 250 rows: at most 250 minus the pairs)")
    extra.add_argument("--completion-signature", type=int, default=64,
                       help="prompt/completion pairs per completion task (CB has 250 rows)")
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_routing_args(__doc__.split("\n")[0])
    args.repeats, args.small_sources, args.no_novelty = known.repeats, known.small_sources, known.no_novelty
    args.completion_heldout, args.completion_signature = known.completion_heldout, known.completion_signature
    run_and_report("openset", "4b. Open set, small tasks and completion-mode routing (issue 13)", args, run, render,
                   lambda res: routing_settings(args))


if __name__ == "__main__":
    main()
