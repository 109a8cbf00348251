"""Experiment 4d — the open set where no task has a twin: distinct data families, end to end.

Experiment 4b measures the open set on the 105 instruction tasks, where every unseen MMLU subject or LAMA
relation has near-twins among the indexed ones (same frame, another topic). A user's space is more often a
set of *different* tasks. This experiment takes one task per data family of ``shared/data`` (22 in all,
:func:`family_tasks`: the natural text families of experiment 3 with their slices merged, SuperGLUE passages,
MMLU question stems, ZINC SMILES, and eight instruction tasks of distinct formats, BBH and LAMA), and runs the
**product itself** through the library (:class:`fisher_atlas.Atlas`: in-process worker, SQLite, FAISS, the
bundled model, every default): per draw, 20 % of the tasks are left out (unseen), the others are added from
``--signature`` samples each, and every held-out prompt is routed. No labels are used (calibrated thresholds
only), except in the ``fit`` row (``Atlas.fit`` on half of the held-out prompts, answers on the other half).

Reported (medians over ``--draws`` draws): "none" on unseen tasks' prompts (goal ≥ 0.90), on indexed tasks'
prompts (goal ≤ 0.05), the share of indexed prompts answered right; against all-MiniLM-L6-v2 twice: the
router a user would pick (each route scored by the mean cosine of its 5 nearest utterances, after
semantic-router's ``top_k``; per-route thresholds calibrated without labels as ours are,
:func:`calibrated_knn_rates`), and its centroid router with the best single threshold set on the
test prompts themselves at 5 % "none" on indexed prompts (a ceiling no fitted threshold reaches).

Per draw it also reports where the unseen prompts went (:func:`landing_tasks`): for the indexed tasks that were
their top match, the calibrated threshold beside the task's own held-out prompts' 5 % quantile, and how well the
route score separates its own prompts from the foreign ones.

``--indexed N`` indexes N tasks per draw and leaves the rest unseen: experiment 4e, the open set of a small space
(``--indexed 6``).

Run: ``python -m bench.quality.openset_families`` (full, ~8 min on 2 cores with ``--threads 2``) or ``--quick``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from atlas.route_calibration import FALSE_REJECT_RATE, calibrate
from bench.quality.common import load_model, log, make_parser, pct, run_and_report
from bench.quality.data import instruction_tasks, text_domains
from bench.quality.openset_unseen import _oracle_rates
from bench.quality.space_threshold import pooled_held_out_scores, space_rows, space_threshold_rates

KNN_K = 5
"""Utterances per route averaged by the calibrated MiniLM router (semantic-router's ``top_k``)."""

INSTRUCTION_TASKS = ("bbh_boolean_expressions", "bbh_date_understanding", "bbh_dyck_languages",
                     "bbh_geometric_shapes", "bbh_navigate", "bbh_sports_understanding",
                     "lama_trex_P36_capital", "lama_trex_P106_occupation")

MERGED_FAMILIES = frozenset({"news", "reviews", "trec", "scicite", "titles", "biomed"})
"""Experiment 3's domain families whose slices (topics, labels, fields, corpora) become one task here."""


def family_tasks() -> dict[str, list[str]]:
    """One task per data family: name → its texts (file order, the bundled model's training rows removed).

    The natural text domains of experiment 3 with the slices of one family merged (AG News topics, SST-2
    polarities, TREC classes, citation intents, MAG fields, the two biomedical corpora), and the inputs of
    eight instruction tasks of distinct formats.
    """
    families: dict[str, list[str]] = defaultdict(list)
    for name, texts in text_domains().items():
        prefix = name.split("_")[0]
        families[prefix if prefix in MERGED_FAMILIES else name].extend(texts)
    instr = instruction_tasks()
    for name in INSTRUCTION_TASKS:
        families[name] = [ex.input for ex in instr[name]]
    return dict(sorted(families.items()))


def split_texts(texts: list[str], n_sig: int, n_held: int, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """A random ``n_sig`` signature texts and ``n_held`` held-out ones (disjoint) of a task's ``texts``."""
    perm = rng.permutation(len(texts))
    return [texts[i] for i in perm[n_held:n_held + n_sig]], [texts[i] for i in perm[:n_held]]


def _ceiling(best: list[str], score: np.ndarray, truth: list[str], unseen: list[str]) -> dict[str, float]:
    """Experiment 4b's ceiling (:func:`bench.quality.openset_unseen._oracle_rates`: one threshold on ``score`` set on
    the test prompts at the goal's 5 % "none" on indexed prompts) for answers by task name, plus the top-1."""
    names = sorted({*best, *truth})
    b, y = np.array([names.index(t) for t in best]), np.array([names.index(t) for t in truth])
    is_unseen = np.array([t in unseen for t in truth])
    rates = _oracle_rates(b, np.asarray(score, dtype=np.float64), y, is_unseen, np.ones(len(b), dtype=bool))
    return {"none_unseen": rates["none_unseen"], "none_indexed": rates["none_indexed"],
            "right": rates["right_indexed"], "top1": float(np.mean(b[~is_unseen] == y[~is_unseen])),
            "auroc": rates["auroc"]}


def landing_tasks(records: list[dict[str, Any]], unseen: list[str], rate: float = FALSE_REJECT_RATE
                  ) -> list[dict[str, Any]]:
    """Per indexed task that was the top match of unseen tasks' prompts: how its threshold compares with its own
    held-out prompts' scores, and how well the route score separates its own prompts from the foreign ones.

    Parameters
    ----------
    records : list of dict
        :func:`_tally`'s per-prompt records (``task``, ``top``, ``score``, ``own_score`` — the route score on its
        own task when that was among the matches —, ``threshold``).
    unseen : list of str
    rate : float
        The quantile of the own prompts' scores reported beside the threshold (the documented false-reject rate).

    Returns
    -------
    list of dict
        ``task``, ``threshold`` (the calibrated one the answers used), ``own`` (the task's own prompts, wherever
        they were routed) / ``foreign`` (unseen tasks' prompts whose top match is this task), ``own_quantile``
        (the ``rate`` quantile of the own prompts' route scores), ``auroc`` (own vs foreign route scores),
        ``foreign_pass_quantile`` (share of the foreign prompts at or above ``own_quantile``); most foreign
        prompts first.
    """
    by_task: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"own": [], "foreign": [], "thr": []})
    for r in records:
        if r.get("own_score") is not None:  # every own prompt, wherever it was routed (not only those it topped)
            by_task[r["task"]]["own"].append(r["own_score"])
        if r["top"] is None or r["score"] is None:
            continue
        entry = by_task[r["top"]]
        if r["threshold"] is not None:
            entry["thr"].append(r["threshold"])
        if r["task"] != r["top"] and r["task"] in unseen:
            entry["foreign"].append(r["score"])
    rows = []
    for task, e in by_task.items():
        own, foreign = np.asarray(e["own"]), np.asarray(e["foreign"])
        if not foreign.size or not own.size:
            continue
        q = float(np.quantile(own, rate))
        auroc = float(roc_auc_score(np.r_[np.ones(own.size), np.zeros(foreign.size)], np.r_[own, foreign]))
        rows.append({"task": task, "threshold": float(np.median(e["thr"])) if e["thr"] else None,
                     "own": int(own.size), "foreign": int(foreign.size), "own_quantile": q, "auroc": auroc,
                     "foreign_pass_quantile": float(np.mean(foreign >= q))})
    return sorted(rows, key=lambda r: -r["foreign"])


def _minilm_rows(encoder: Any, sig: dict[str, list[str]], held: dict[str, list[str]], indexed: list[str],
                 unseen: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """The MiniLM rows: (the centroid router with one threshold on its best cosine set at 5 % "none" on indexed
    prompts, the kNN router with per-route thresholds calibrated without labels (:func:`calibrated_knn_rates`)).
    Each text is embedded once."""
    utterances = [encoder.encode(sig[t]) for t in indexed]
    cents = np.stack([u.mean(0) for u in utterances])
    cents /= np.linalg.norm(cents, axis=1, keepdims=True)
    truth = [t for t in indexed + unseen for _ in held[t]]
    queries = encoder.encode([p for t in indexed + unseen for p in held[t]])
    cos = queries @ cents.T
    calibrated = calibrated_knn_rates(utterances, queries, [indexed.index(t) if t in indexed else None for t in truth])
    return _ceiling([indexed[j] for j in cos.argmax(1)], cos.max(1), truth, unseen), calibrated


def _route_knn(utterances: np.ndarray, queries: np.ndarray, k: int, leave_self_out: bool = False) -> np.ndarray:
    """One route's score for each query, shape (Q,): the mean cosine to its ``k`` nearest utterances (with
    ``leave_self_out`` the queries are these utterances, in order, and each one's own is left out)."""
    sims = queries @ utterances.T
    if leave_self_out:
        np.fill_diagonal(sims, -np.inf)
    kk = min(k, utterances.shape[0] - int(leave_self_out))
    return -np.sort(-sims, axis=1)[:, :kk].mean(1)


def knn_route_scores(utterances: list[np.ndarray], queries: np.ndarray, k: int = KNN_K,
                     leave_one_out: int | None = None) -> np.ndarray:
    """Each route's score for each query: the mean cosine of the query to its ``k`` nearest utterances of the route.

    Parameters
    ----------
    utterances : list of ndarray, each shape (n_r, D)
        Unit vectors of each route's utterances.
    queries : ndarray, shape (Q, D)
        Unit query vectors.
    k : int
    leave_one_out : int, optional
        When the queries are the utterances of this route (same order), each one's own vector is left out of it.

    Returns
    -------
    ndarray, shape (Q, R)
    """
    return np.stack([_route_knn(u, queries, k, r == leave_one_out) for r, u in enumerate(utterances)], axis=1)


def calibrated_knn_rates(utterances: list[np.ndarray], queries: np.ndarray, truth: list[int | None],
                         rate: float = FALSE_REJECT_RATE) -> dict[str, float]:
    """A kNN router with per-route thresholds calibrated as the product calibrates its tasks, with no labels: each
    route's threshold is :func:`atlas.route_calibration.calibrate` (the lower tolerance bound at ``rate``) of its
    own utterances' leave-one-out scores; a query goes to its best route, or "none" below that route's threshold.

    Parameters
    ----------
    utterances, queries
        As :func:`knn_route_scores`.
    truth : list of int or None, length Q
        Each query's route, ``None`` for an unseen task's.
    rate : float
        The false-reject rate the thresholds are set at.

    Returns
    -------
    dict
        ``none_unseen``, ``none_indexed``, ``right`` (indexed, answered and right), ``top1`` (indexed, no open set).
    """
    cals = [calibrate(_route_knn(u, u, KNN_K, leave_self_out=True), rate).threshold for u in utterances]
    thresholds = np.array([-np.inf if c is None else c for c in cals])  # too few utterances: never "none"
    scores = knn_route_scores(utterances, queries)
    best = scores.argmax(1)
    none = scores[np.arange(len(best)), best] < thresholds[best]
    unseen = np.array([t is None for t in truth])
    hit = np.array([t == b for t, b in zip(truth, best, strict=True)])
    return {"none_unseen": float(none[unseen].mean()), "none_indexed": float(none[~unseen].mean()),
            "right": float((hit & ~none)[~unseen].mean()), "top1": float(hit[~unseen].mean())}


def _tally(prompts: list[tuple[str, str]], answers: list[Any], unseen: list[str]) -> dict[str, Any]:
    """Rates of one draw, why indexed prompts were answered "none", and which task took unseen prompts."""
    none_unseen, none_indexed, right, top1, records = [], [], [], [], []
    why: dict[str, int] = defaultdict(int)
    taken: dict[str, int] = defaultdict(int)
    for (t, _), a in zip(prompts, answers, strict=True):
        top = a.matches[0].name if a.matches else None
        own = next((m.score for m in a.matches if m.name == t), None)  # this prompt's route score on its own task
        records.append({"task": t, "top": top, "none": a.none, "score": a.best_score, "own_score": own,
                        "threshold": a.threshold,
                        "rank": a.matches[0].rank_score if a.matches else None,
                        "nearest": a.nearest_rejects, "template": a.template_rejects,
                        "novelty": bool(getattr(a, "novelty_rejects", False))})
        if t in unseen:
            none_unseen.append(a.none)
            if not a.none:
                taken[f"{t} -> {top}"] += 1
            continue
        none_indexed.append(a.none)
        right.append((not a.none) and top == t)
        top1.append(top == t)
        if a.none:
            flags = "template" if a.template_rejects else "nearest" if a.nearest_rejects else "threshold"
            why[a.rejected_by.reason if a.rejected_by is not None else flags] += 1
    rank = np.array([r["rank"] if r["rank"] is not None else -2.0 for r in records])  # no match: below any rank
    ceiling = _ceiling([r["top"] or "" for r in records], rank, [r["task"] for r in records], unseen)
    own_top = np.array(top1, dtype=bool)
    refused = np.array(none_indexed, dtype=bool)
    # an indexed prompt's "none" split by its top match: its own task's threshold refused it (a false reject in the
    # sense of the task's stated rate), or a wrong task's (a wrong answer withheld)
    split = {"none_own_top": float(refused[own_top].mean()) if own_top.any() else 0.0,
             "none_wrong_top": float(refused[~own_top].mean()) if (~own_top).any() else 0.0}
    return {"none_unseen": float(np.mean(none_unseen)), "none_indexed": float(np.mean(none_indexed)), **split,
            "ceiling": ceiling, "landing": landing_tasks(records, unseen), "right": float(np.mean(right)),
            "top1": float(np.mean(top1)), "indexed_none_by": dict(why), "unseen_accepted": dict(taken),
            "prompts": records}


def _at_rate(atlas: Any, prompts: list[tuple[str, str]], indexed: list[str], unseen: list[str], rate: float
             ) -> dict[str, float]:
    """The product with every indexed task re-calibrated at false-reject rate ``rate`` (no labels), then back at
    the default."""
    for t in indexed:
        atlas.set_false_reject_rate(t, rate)
    res = _tally(prompts, atlas.route([p for _, p in prompts], k=3), unseen)
    for t in indexed:
        atlas.set_false_reject_rate(t, FALSE_REJECT_RATE)
    return {k: res[k] for k in ("none_unseen", "none_indexed", "right", "top1")}


def fit_halves(prompts: list[tuple[str, str]], unseen: list[str], rng: np.random.Generator) -> np.ndarray:
    """Cross-fitting half (0 or 1) of each ``(task, prompt)``: an indexed task's prompts are split at random within
    the task; the unseen *tasks* are split in two halves, so no unseen task gives "none" examples to ``fit`` and is
    also answered (experiment 4b's protocol: at query time an unseen task is one nobody labelled)."""
    half = np.empty(len(prompts), dtype=int)
    tasks = sorted({t for t, _ in prompts})
    unseen_tasks = [t for t in tasks if t in unseen]
    unseen_half = {t: h for h, part in enumerate(np.array_split(rng.permutation(unseen_tasks), 2)) for t in part}
    for t in tasks:
        rows = np.array([i for i, (tt, _) in enumerate(prompts) if tt == t])
        if t in unseen_half:
            half[rows] = unseen_half[t]
        else:
            half[rows] = rng.permutation(len(rows)) % 2
    return half


def _with_fit(atlas: Any, prompts: list[tuple[str, str]], indexed: list[str], unseen: list[str],
              rng: np.random.Generator, labelled: list[tuple[str, str]] | None = None) -> dict[str, float]:
    """The product after ``fit``, cross-fitted: fit on one half of the held-out prompts (labelled with their task,
    or "none" for an unseen task's), answer the other half; both halves, rates averaged (:func:`fit_halves`: the
    unseen tasks are halved by task, so the "none" examples never come from the unseen tasks answered). Every
    task's threshold override, template and novelty switches are reset before each fit. ``labelled``: the prompts
    ``fit`` is given in place of ``prompts`` (the same ones another way, pair by pair: bench 4f fits on whole
    prompts and answers them cut)."""
    half = fit_halves(prompts, unseen, rng)
    labelled = prompts if labelled is None else labelled
    rates: list[dict[str, Any]] = []
    for h in (0, 1):
        for t in indexed:
            atlas.set_threshold(t, None)
            atlas.set_template_test(t, True)
            atlas.set_novelty_test(t, True)
        atlas.fit([(p, t if t in indexed else "none") for (t, p), hh in zip(labelled, half, strict=True) if hh == h])
        rest = [tp for tp, hh in zip(prompts, half, strict=True) if hh != h]
        rates.append(_tally(rest, atlas.route([p for _, p in rest], k=3), unseen))
    return {k: float(np.mean([r[k] for r in rates])) for k in ("none_unseen", "none_indexed", "right", "top1")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.quality.embed import MiniLMEncoder
    from fisher_atlas import Atlas

    tasks = {k: v for k, v in family_tasks().items() if len(v) >= args.signature + args.heldout}
    names = sorted(tasks)
    n_unseen = len(names) - args.indexed if args.indexed else max(1, round(0.2 * len(names)))
    if not 1 <= n_unseen < len(names):
        raise SystemExit(f"--indexed must be between 1 and {len(names) - 1}")
    encoder = MiniLMEncoder()
    draws: list[dict[str, Any]] = []
    for d in range(args.draws):
        rng = np.random.default_rng(1000 * (1 + args.seeds[0]) + d)  # seed 0: draws 1000, 1001, ...
        sig, held = {}, {}
        for t in names:
            sig[t], held[t] = split_texts(tasks[t], args.signature, args.heldout, rng)
        unseen = sorted(rng.choice(names, size=n_unseen, replace=False).tolist())
        indexed = [t for t in names if t not in unseen]
        t0 = time.perf_counter()
        product = {"model": args.model, "device": args.device, "torch_threads": args.threads, "sketch_dim": args.m,
                   "max_tokens_per_sample": args.max_tokens}
        with tempfile.TemporaryDirectory() as tmp:
            with Atlas(tmp, **product) as atlas:
                for t in indexed:
                    atlas.add(t, sig[t], progress=False)
                add_s = time.perf_counter() - t0
                prompts = [(t, p) for t in indexed + unseen for p in held[t]]
                # k = every indexed task (top and "none" do not depend on k: every task is a candidate in these
                # spaces), so each own prompt's score on its own task is at hand for the landing table.
                answers = atlas.route([p for _, p in prompts], k=len(indexed))
                looser = _at_rate(atlas, prompts, indexed, unseen, args.alt_rate)
                pooled = pooled_held_out_scores(atlas.export(Path(tmp) / "space.jsonl"))
            with Atlas(tmp, route_novelty=False, **product) as plain:  # the same store, the novelty test off
                plain_answers = plain.route([p for _, p in prompts], k=len(indexed))
            with Atlas(tmp, route_length_match=False, **product) as whole:  # every prompt judged as a whole sample
                whole_answers = whole.route([p for _, p in prompts], k=len(indexed))
            with Atlas(tmp, **product) as atlas:  # fit last: it stores thresholds
                fitted = _with_fit(atlas, prompts, indexed, unseen, rng)
        draw = _tally(prompts, answers, unseen)
        off = _tally(prompts, plain_answers, unseen)
        draw["without_novelty"] = {k: off[k] for k in ("none_unseen", "none_indexed", "right")}
        unmatched = _tally(prompts, whole_answers, unseen)
        draw["without_length_match"] = {k: unmatched[k] for k in ("none_unseen", "none_indexed", "right")}
        draw["space_threshold"] = space_threshold_rates(draw["prompts"], unseen, pooled, FALSE_REJECT_RATE)
        mini_ceiling, mini_cal = _minilm_rows(encoder, sig, held, indexed, unseen)
        draw.update(unseen_tasks=unseen, indexed_tasks=indexed, add_s=add_s, fit=fitted, at_rate=looser,
                    minilm=mini_ceiling,
                    mini_cal=mini_cal)
        mini = draw["minilm"]
        log(f"draw {d}: unseen {unseen}: none {draw['none_unseen']:.3f} unseen / {draw['none_indexed']:.3f} indexed, "
            f"right {draw['right']:.3f}; MiniLM ceiling {mini['none_unseen']:.3f} / {mini['none_indexed']:.3f}, "
            f"calibrated {mini_cal['none_unseen']:.3f} / {mini_cal['none_indexed']:.3f}")
        draws.append(draw)
    # the model the library ran, loaded once more here for the run facts only
    return {"tasks": {t: len(tasks[t]) for t in names}, "n_unseen": n_unseen, "draws": draws, "lm": load_model(args),
            "alt_rate": args.alt_rate}


def _at_rate_row(draws: list[dict[str, Any]], rate: float | None) -> str:
    """The table row of the product at another false-reject rate (absent from older result files)."""
    if rate is None or any("at_rate" not in d for d in draws):
        return ""
    keys = ("none_unseen", "none_indexed", "right", "top1")
    cols = [float(np.median([d["at_rate"][k] for d in draws])) for k in keys]
    return (f"| FisherAtlas (product), every task calibrated at {rate:.0%} false rejects (`false_reject_rate`, no "
            f"labels) | {cols[0]:.3f} | {cols[1]:.3f} | {pct(cols[2])} | {pct(cols[3])} |\n")


def _which(draw: dict[str, Any]) -> str:
    """The shorter of a draw's two task lists (older result files name the unseen tasks only)."""
    indexed, unseen = draw.get("indexed_tasks"), draw["unseen_tasks"]
    if indexed is not None and len(indexed) < len(unseen):
        return "indexed " + ", ".join(indexed)
    return "unseen " + ", ".join(unseen)


def _landing_table(draws: list[dict[str, Any]]) -> str:
    """Where the unseen prompts went: the three indexed tasks of each draw that took the most (absent from result
    files written before :func:`landing_tasks`)."""
    rows = [(i, r) for i, d in enumerate(draws) for r in d.get("landing", [])[:3]]
    if not rows:
        return ""
    head = ("\n\nWhere the unseen prompts went (per draw, the three indexed tasks that were the top match of most; "
            "route scores; own = the task's own held-out prompts):\n\n"
            "| draw | task | unseen prompts it topped | its calibrated threshold | own prompts' 5 % quantile | "
            "AUROC own vs unseen | unseen at or above that quantile |\n|---:|:---|---:|---:|---:|---:|---:|\n")
    lines = []
    for i, r in rows:
        thr = "–" if r["threshold"] is None else f"{r['threshold']:.3f}"
        lines.append(f"| {i} | {r['task']} | {r['foreign']} | {thr} | {r['own_quantile']:.3f} | {r['auroc']:.3f} | "
                     f"{r['foreign_pass_quantile']:.2f} |")
    return head + "\n".join(lines)


def _without_row(draws: list[dict[str, Any]], key: str, label: str) -> str:
    """The product on the same store with one rule off (``key``: ``without_novelty``, ``route_novelty=False``;
    ``without_length_match``, ``route_length_match=False``; absent from older result files)."""
    if any(key not in d for d in draws):
        return ""
    keys = ("none_unseen", "none_indexed", "right")
    cols = [float(np.median([d[key][k] for d in draws])) for k in keys]
    top1 = float(np.median([d["top1"] for d in draws]))
    return f"| FisherAtlas (product) {label} | {cols[0]:.3f} | {cols[1]:.3f} | {pct(cols[2])} | {pct(top1)} |\n"


def render(res: dict[str, Any], facts: str) -> str:
    draws = res["draws"]

    def med(key: str, sub: str | None = None) -> float:
        return float(np.median([(d[sub] if sub else d)[key] for d in draws]))

    table = (
        "| Router | none on unseen (goal ≥ 0.90) | none on indexed (goal ≤ 0.05) | answered right, indexed | "
        "top-1, indexed (no open set) |\n"
        "|:---|---:|---:|---:|---:|\n"
        f"| FisherAtlas (product, library, calibrated thresholds, no labels) | {med('none_unseen'):.3f} | "
        f"{med('none_indexed'):.3f} | {pct(med('right'))} | {pct(med('top1'))} |\n"
        + _without_row(draws, "without_novelty", "without the novelty test (`route_novelty=False`, same store)")
        + _without_row(draws, "without_length_match", "judging every prompt as a whole sample "
                       "(`route_length_match=False`, same store; before 2026-11-28)")
        + _at_rate_row(draws, res.get("alt_rate")) + space_rows(draws) +
        f"| FisherAtlas (product) + `fit` (labelled prompts incl. none; cross-fitted halves) | "
        f"{med('none_unseen', 'fit'):.3f} | {med('none_indexed', 'fit'):.3f} | {pct(med('right', 'fit'))} | "
        f"{pct(med('top1', 'fit'))} |\n"
        f"| ceiling: FisherAtlas rank score, one threshold set on the test prompts (5 % none, indexed) | "
        f"{med('none_unseen', 'ceiling'):.3f} | {med('none_indexed', 'ceiling'):.3f} | "
        f"{pct(med('right', 'ceiling'))} | {pct(med('top1', 'ceiling'))} |\n"
        f"| MiniLM kNN (mean of {KNN_K} nearest utterances per route), per-route thresholds calibrated like ours "
        f"(leave-one-out tolerance bound at {FALSE_REJECT_RATE:.0%} false rejects), no labels | "
        f"{med('none_unseen', 'mini_cal'):.3f} | "
        f"{med('none_indexed', 'mini_cal'):.3f} | {pct(med('right', 'mini_cal'))} | {pct(med('top1', 'mini_cal'))} |\n"
        f"| ceiling: MiniLM centroid, one threshold set on the test prompts (5 % none, indexed) | "
        f"{med('none_unseen', 'minilm'):.3f} | {med('none_indexed', 'minilm'):.3f} | {pct(med('right', 'minilm'))} | "
        f"{pct(med('top1', 'minilm'))} |\n"
    )
    per_draw = "\n".join(
        f"- draw {i}: {_which(d)}: none {d['none_unseen']:.3f} / {d['none_indexed']:.3f}; "
        f"indexed prompts answered none by {d['indexed_none_by'] or '-'}; unseen accepted "
        f"{dict(sorted(d['unseen_accepted'].items(), key=lambda kv: -kv[1])[:4]) or '-'}"
        for i, d in enumerate(draws))
    tasks = ", ".join(f"{t} ({n})" for t, n in res["tasks"].items())
    per_draw += _landing_table(draws)
    n_indexed = len(res["tasks"]) - res["n_unseen"]
    return (f"{len(res['tasks'])} tasks, one per data family: {tasks}. {n_indexed} indexed and {res['n_unseen']} "
            f"unseen per draw; "
            f"{len(draws)} draws; each column is its own median over the draws (a row's pair of rates need not come "
            f"from one draw; the per-draw lines below give each draw's).\n\n{table}\n{per_draw}\n\n{facts}")


def family_parser(description: str, draws: int) -> argparse.ArgumentParser:
    """The parser of an experiment on the data families: the shared options plus ``--draws``, ``--signature``
    (samples per indexed task) and ``--heldout`` (prompts per task)."""
    p = make_parser(description, m=4096, max_tokens=512, seeds=[0])
    p.add_argument("--draws", type=int, default=draws)
    p.add_argument("--signature", type=int, default=100, help="samples per indexed task")
    p.add_argument("--heldout", type=int, default=20, help="held-out prompts per task")
    return p


def family_args(p: argparse.ArgumentParser) -> argparse.Namespace:
    """Parsed arguments, ``--quick`` shrunk to one small draw."""
    args = p.parse_args()
    if args.quick:
        args.draws, args.signature, args.heldout = 1, 48, 8
    return args


def main() -> None:
    """Command-line entry point."""
    p = family_parser(__doc__.split("\n")[0], draws=5)
    p.add_argument("--indexed", type=int, default=None,
                   help="tasks indexed per draw, the rest unseen (default: 80 %%; a small number asks the open set "
                        "of a small space, written as experiment 4e)")
    p.add_argument("--alt-rate", type=float, default=0.10,
                   help="the false-reject rate of the row with every task re-calibrated (PATCH false_reject_rate)")
    args = family_args(p)
    key, title = "openset_families", "4d. Open set without twins: one task per data family (issue 13)"
    if args.indexed:
        key, title = "openset_small", "4e. Open set of small spaces: a few data families indexed (issue 13)"
    run_and_report(key, title, args, run, render,
                   lambda res: {"signature samples": args.signature, "held-out prompts": args.heldout,
                                "indexed tasks per draw": len(res["tasks"]) - res["n_unseen"],
                                "product": "library defaults (bundled model, m=4096)"})


if __name__ == "__main__":
    main()
