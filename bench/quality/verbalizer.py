"""Experiment 2 — verbalizer shift (paper: Section "Identifiability Stress Test: Verbalizer Shift",
tab:verbalizer-shift, and Appendix "Verbalizer-Shift Experiment Details").

BoolQ (validation split — the only one staged), RTE (train) and CB (train, binarised entailment vs not)
with the paper's fixed prefix ``Passage: …\\n\\nQuestion: …\\n\\nThe answer is`` (passages cut to
``--passage-tokens`` tokens) and six single-token verbalizer pairs valid in the model's tokenizer,
including the flipped first pair. Every verbalizer of a dataset sees the same prompts, so the
answer-position activations are identical and ``S_cov(M_a) ≈ 1``; only the error geometry moves.

Per seed and dataset: disjoint sketch / train / eval splits (500 / 200 / 100; CB 118 / 94 / 38 as in the
paper); a FisherSketch state per verbalizer from the sketch split (completion mode: only the verbalizer
token counts) through the product's Extractor; ``align_matrix`` gives A_F (FisherSketch), its EB-shrunk
version, ``S_cov(Γ_e)`` and ``S_cov(M_a)``. The transfer oracle fine-tunes only the output head on each
source verbalizer's train split and measures every target verbalizer's eval loss (full-vocabulary
cross-entropy of the verbalizer token; see :mod:`bench.quality.transfer`).

Run: ``python -m bench.quality.verbalizer`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from bench.quality import report
from bench.quality.common import (
    TaskSignature,
    extract_task,
    float_or_none,
    fmt,
    log,
    make_extractor,
    make_parser,
    make_sketcher,
    mean_std,
    pct,
    run_and_report,
    timing_settings,
)
from bench.quality.data import disjoint_splits
from bench.quality.data_superglue import choose_verbalizers, verbalized, verbalizer_prompts
from bench.quality.transfer import (
    HeadCache,
    add_oracle_args,
    cache_head_inputs,
    oracle_from_args,
    oracle_setting,
    random_scores,
    selection_metrics,
    transfer_matrix,
)

DATASETS = ("boolq", "rte", "cb")
SPLITS = {"boolq": (500, 200, 100), "rte": (500, 200, 100), "cb": (118, 94, 38)}
QUICK_SPLITS = {"boolq": (40, 30, 20), "rte": (40, 30, 20), "cb": (40, 30, 20)}

METHODS = (("FisherSketch", "fisher"), ("FisherSketch (EB-shrunk)", "fisher_eb"),
           ("S_cov(Γe) alone (error-only)", "error"), ("S_cov(M_a) alone (activation-only)", "activation"),
           ("Random", None))

PAPER = {  # tab:verbalizer-shift + tab:verbalizer-per-run aggregate
    "FisherSketch": {"top1": 0.667, "pct": 0.957, "max_regret": 0.952},
    "S_cov(Γe) alone (error-only)": {"top1": 0.722, "pct": 1.0, "max_regret": None},
    "S_cov(M_a) alone (activation-only)": {"top1": 0.20, "pct": None, "max_regret": None},
    "Random": {"top1": 0.20, "pct": None, "max_regret": None},
}


def shared_forward_states(extractor: Any, prompts: list[Any], verbs: list[tuple[Any, int, int]]) -> list[Any] | None:
    """FisherSketch states of every verbalizer from one body forward over the prompts.

    All verbalizers share the prompts, so the answer-position activation ``a`` and the softmax ``p`` are
    the same; only the target changes: ``e_v = e_0 + f'·(onehot(y_0) − onehot(y_v))`` for the identity
    or a scaling post-head transform. Each verbalizer's tokens get the sample ids the product would give
    its own samples, and are fed to the product's ``Sketcher.update`` — the same sums
    :meth:`Extractor.extract` would produce (checked against it on the first run, see ``run``), at one
    sixth of the forward cost. Returns None for a soft-capped head (no shortcut; the caller extracts).
    """
    from atlas.samples import sample_id
    from fishersketch import SketchState

    transform = extractor.lm.logit_transform
    if transform.kind == "softcap":
        return None
    factor = transform.value if transform.kind == "scale" else 1.0
    sketcher = extractor.sketcher
    per_v = [verbalized(prompts, v) for v, _, _ in verbs]
    index_of = {sample_id(s): i for i, s in enumerate(per_v[0])}
    ids = torch.tensor([[sample_id(s) for s in samples] for samples in per_v], dtype=torch.int64)
    target = torch.tensor([[t if p.label else f for p in prompts] for _, t, f in verbs], dtype=torch.int64)
    states = [SketchState.empty(sketcher.spec) for _ in verbs]
    for hb in extractor.iter_head_batches(per_v[0], mode="completion"):
        idx = torch.tensor([index_of[int(x)] for x in hb.sample_ids], dtype=torch.int64)
        rows = torch.arange(len(hb))
        if not torch.equal(target[0, idx], hb.targets):
            raise RuntimeError("verbalizer targets do not match the extracted completion tokens")
        for k in range(len(verbs)):
            e = hb.e.clone()
            e[rows, target[0, idx]] += factor
            e[rows, target[k, idx]] -= factor
            sketcher.update(states[k], hb.a, e, ids[k, idx])
    return states


def shared_caches(extractor: Any, prompts: list[Any], verbs: list[tuple[Any, int, int]]) -> dict[str, HeadCache]:
    """Oracle caches of every verbalizer from one forward: the same head inputs, per-verbalizer targets."""
    from atlas.samples import sample_id

    samples0 = verbalized(prompts, verbs[0][0])
    index_of = {sample_id(s): i for i, s in enumerate(samples0)}
    base = cache_head_inputs(extractor, samples0, "completion")
    assert base.ids is not None
    idx = torch.tensor([index_of[int(x)] for x in base.ids], dtype=torch.int64)
    labels = torch.tensor([p.label for p in prompts], dtype=torch.bool)[idx]
    out = {}
    for v, t, f in verbs:
        y = torch.where(labels, torch.tensor(t), torch.tensor(f))
        out[v.name] = HeadCache(a=base.a, y=y)
    first_t, first_f = verbs[0][1], verbs[0][2]
    if not torch.equal(torch.where(labels, torch.tensor(first_t), torch.tensor(first_f)), base.y):
        raise RuntimeError("verbalizer targets do not match the extracted completion tokens")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every (seed, dataset); returns the raw results."""
    from fishersketch import align_matrix

    lm = _load(args)
    verbs = choose_verbalizers(lm.tokenizer)
    names = [v.name for v, _, _ in verbs]
    log("verbalizers: " + ", ".join(f"{v.name}=({v.true!r}:{t}, {v.false!r}:{f})" for v, t, f in verbs))
    splits = QUICK_SPLITS if args.quick else SPLITS
    datasets = DATASETS[:2] if args.quick else DATASETS
    runs: list[dict[str, Any]] = []
    timings: dict[str, float] = {"sketch_s": 0.0, "oracle_s": 0.0}
    for seed in args.seeds:
        sketcher = make_sketcher(lm, args.m, seed)
        extractor = make_extractor(lm, sketcher, args)
        oracle = oracle_from_args(lm, args)
        for ds in datasets:
            prompts = verbalizer_prompts(ds, lm.tokenizer, args.passage_tokens)
            sk_idx, tr_idx, ev_idx = disjoint_splits(len(prompts), splits[ds], seed)
            log(f"seed {seed} {ds}: {len(prompts)} prompts, sketch/train/eval "
                f"{len(sk_idx)}/{len(tr_idx)}/{len(ev_idx)}")
            t = time.perf_counter()
            sk_prompts = [prompts[i] for i in sk_idx]
            states = None if args.no_shared_forward else shared_forward_states(extractor, sk_prompts, verbs)
            check = None
            if states is None:
                sigs: list[TaskSignature] = [
                    extract_task(extractor, f"{ds}/{v.name}", verbalized(sk_prompts, v), "completion")
                    for v, _, _ in verbs]
                states = [sg.state for sg in sigs]
            elif not runs:
                # the shortcut must give what the product's Extractor gives: check one verbalizer
                ref = extract_task(extractor, f"{ds}/{names[-1]} (check)", verbalized(sk_prompts, verbs[-1][0]),
                                   "completion").state
                mine = states[-1]
                scale = float(np.max(np.abs(ref.sums))) or 1.0
                check = {"max_rel_diff_sums": float(np.max(np.abs(mine.sums - ref.sums)) / scale),
                         "max_rel_diff_sq_norms": float(np.max(np.abs(mine.sq_norms - ref.sq_norms))
                                                        / (float(np.max(np.abs(ref.sq_norms))) or 1.0)),
                         "same_counts": bool(np.array_equal(mine.token_counts, ref.token_counts)
                                             and np.array_equal(mine.sample_counts, ref.sample_counts))}
                if check["max_rel_diff_sums"] > 1e-4 or not check["same_counts"]:
                    raise RuntimeError(f"shared-forward sketch differs from Extractor.extract: {check}")
                log(f"  shared-forward check vs Extractor.extract: {check}")
            mat = align_matrix(states)
            timings["sketch_s"] += time.perf_counter() - t
            log(f"  sketched {len(verbs)} verbalizers: {time.perf_counter() - t:.1f}s")
            t = time.perf_counter()
            train = shared_caches(extractor, [prompts[i] for i in tr_idx], verbs)
            evals = shared_caches(extractor, [prompts[i] for i in ev_idx], verbs)
            tr = transfer_matrix(oracle, train, evals, seed, log)
            timings["oracle_s"] += time.perf_counter() - t
            scores = {"fisher": np.asarray(mat.fisher), "fisher_eb": np.asarray(mat.fisher_eb),
                      "error": np.asarray(mat.error), "activation": np.asarray(mat.activation)}
            metrics = {}
            for label, key in METHODS:
                sc = random_scores(len(names)) if key is None else scores[key]
                metrics[label] = selection_metrics(tr.U, sc, names, tol=1e-6).to_dict()
            off = ~np.eye(len(names), dtype=bool)
            log(f"  S_cov(M_a) off-diagonal mean {scores['activation'][off].mean():.4f}; "
                + "; ".join(f"{k}: top1 {v['top1']:.2f} %oracle {v['pct_oracle']:.2f}" for k, v in metrics.items()))
            runs.append({"seed": seed, "dataset": ds, "sizes": [len(sk_idx), len(tr_idx), len(ev_idx)],
                         "matrices": {k: v for k, v in scores.items()},
                         "rho_eb": np.asarray(mat.rho_eb), "alpha_eb": float_or_none(mat.alpha_eb),
                         "reliability_r": float_or_none(mat.reliability_r),
                         "transfer": tr.to_dict(), "metrics": metrics, "extractor_check": check,
                         "n_tokens": [int(st.n_tokens) for st in states]})
    return {"verbalizers": [{"name": v.name, "true": v.true, "false": v.false, "true_id": t, "false_id": f}
                            for v, t, f in verbs],
            "names": names, "runs": runs, "timings": timings, "lm": lm}


def _load(args: argparse.Namespace) -> Any:
    from bench.quality.common import load_model

    return load_model(args)


def render(res: dict[str, Any], facts: str) -> str:
    """Markdown for ``quality.md``."""
    runs = res["runs"]
    names = res["names"]
    short = {n: "".join(w[0].upper() for w in n.split("_")) for n in names}
    rows = []
    for label, _ in METHODS:
        top1 = [r["metrics"][label]["top1"] for r in runs]
        po = [r["metrics"][label]["pct_oracle"] for r in runs]
        mr = [r["metrics"][label]["max_regret"] for r in runs]
        p = PAPER.get(label, {})
        rows.append([label, mean_std(top1, 1, True), mean_std(po, 1, True), mean_std(mr, 3),
                     pct(p.get("top1")), pct(p.get("pct")), fmt(p.get("max_regret"))])
    main_table = report.table(["Method", "Top-1", "% Oracle", "Max regret", "paper Top-1", "paper % Oracle",
                               "paper Max regret"], rows)
    per_run = report.table(
        ["Seed", "Dataset", "Top-1 FS", "Top-1 err", "Top-1 act", "% oracle FS", "% oracle err", "Max regret FS",
         "Max regret err", "S_cov(M_a) mean", "self gain (nats)"],
        [[r["seed"], r["dataset"], pct(r["metrics"]["FisherSketch"]["top1"]),
          pct(r["metrics"]["S_cov(Γe) alone (error-only)"]["top1"]),
          pct(r["metrics"]["S_cov(M_a) alone (activation-only)"]["top1"]),
          pct(r["metrics"]["FisherSketch"]["pct_oracle"]),
          pct(r["metrics"]["S_cov(Γe) alone (error-only)"]["pct_oracle"]),
          fmt(r["metrics"]["FisherSketch"]["max_regret"]),
          fmt(r["metrics"]["S_cov(Γe) alone (error-only)"]["max_regret"]),
          fmt(float(np.asarray(r["matrices"]["activation"])[~np.eye(len(names), dtype=bool)].mean()), 4),
          fmt(float(np.mean(np.asarray(r["transfer"]["base"]) - np.diag(np.asarray(r["transfer"]["after"])))))]
         for r in runs])
    first = runs[0]
    labels = [short[n] for n in names]
    mats = "\n\n".join(
        f"{title} ({first['dataset']}, seed {first['seed']}):\n\n"
        + report.matrix_table(labels, np.asarray(m), digits=3 if key == "activation" else 2, corner=corner)
        for title, key, m, corner in (
            ("S_cov(M_a)", "activation", first["matrices"]["activation"], ""),
            ("S_cov(Γe)", "error", first["matrices"]["error"], ""),
            ("FisherSketch A_F", "fisher", first["matrices"]["fisher"], ""),
            ("Oracle U[source → target] (rows: source)", "U", first["transfer"]["U"], "s \\ t"),
        ))
    verbs = ", ".join(f"{short[v['name']]} = {v['name']} ({v['true']!r} id {v['true_id']} / {v['false']!r} id "
                      f"{v['false_id']})" for v in res["verbalizers"])
    return (
        "Paper: Table `tab:verbalizer-shift` (Llama-3.1-8B, LoRA oracle, 3 datasets × 3 seeds) and the aggregate row "
        "of `tab:verbalizer-per-run` (mean over runs of max regret). Ours: head-only oracle (see "
        "`bench/quality/transfer.py`); entries are mean ± std over the runs (seeds × datasets); 5 candidate sources "
        "per target; ties broken at random in expectation.\n\n"
        f"Verbalizers: {verbs}.\n\n" + main_table + "\n\nPer run:\n\n" + per_run + "\n\n" + mats + "\n\n" + facts
    )


def main() -> None:
    """Command-line entry point."""
    parser = make_parser(__doc__.split("\n")[0], m=4096, max_tokens=256, seeds=[42, 43, 44])
    parser.add_argument("--passage-tokens", type=int, default=64, help="passage truncation (tokens)")
    parser.add_argument("--no-shared-forward", action="store_true",
                        help="sketch every verbalizer with its own Extractor.extract pass (6x the forward cost)")
    add_oracle_args(parser, steps=100, batch=256)
    args = parser.parse_args()
    if args.quick:
        args.seeds = args.seeds[:1]
        args.m = min(args.m, 1024)
        args.oracle_steps = min(args.oracle_steps, 30)

    def settings(res: dict[str, Any]) -> dict[str, Any]:
        splits = sorted({f"{r['dataset']} {'/'.join(map(str, r['sizes']))}" for r in res["runs"]})
        return {"m": args.m, "max_tokens": args.max_tokens, "splits sketch/train/eval": "; ".join(splits),
                "passage_tokens": args.passage_tokens, "oracle": oracle_setting(args),
                **timing_settings(res["timings"])}

    run_and_report("verbalizer", "2. Verbalizer shift (paper: Identifiability Stress Test)", args, run, render,
                   settings)


if __name__ == "__main__":
    main()
