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

The studies: :mod:`bench.quality.openset_unseen`, :mod:`bench.quality.openset_small_tasks` and
:mod:`bench.quality.openset_completion`, on the product's scores in matrix form (:mod:`bench.quality.route_matrices`).

Run: ``python -m bench.quality.openset`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from atlas import routing
from atlas.lexical import TaskTerms, TermCounts
from atlas.template import TaskTemplate
from bench.quality import report
from bench.quality.common import log, pct, run_and_report
from bench.quality.openset_completion import COMPLETION_SETS, completion_tasks
from bench.quality.openset_small_tasks import small_tasks
from bench.quality.openset_unseen import ROUTERS, UNSEEN_SHARE, novelty_of, open_set
from bench.quality.route_matrices import _unit, hybrid_best, rank_matrix, rank_parts_matrix, score_matrix
from bench.quality.routing_setup import (
    calibration_states,
    load_encoder,
    load_experiment,
    parse_routing_args,
    routing_settings,
    typicals,
)


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
