"""Offline study: what a task's lexical profile should weigh (experiment 4b's data; issue 13).

The product ranks a prompt's candidates by the Fisher ranking fused with a lexical score
(:func:`atlas.lexical.fuse`); a task's side of that score is the unit vector of ``1 + ln tf`` over all its samples'
terms summed (:meth:`atlas.lexical.TaskTerms.of`: the task read as one long document). On completion tasks whose
prompts are passages on unrelated topics (BoolQ) the fusion costs points (bench/results/quality.md, 4b): every
passage's topic words enter the profile, and a BoolQ prompt about law shares more words with an MMLU law task.

This study replays the product's answer (:func:`bench.quality.route_matrices.hybrid_best`: the FAISS candidates plus the
completion tasks, ordered by the fused score) with the task side weighted instead by how many of the task's samples
use a term — ``df / n``, the centroid of its samples' term sets, so that a word of one passage in 64 weighs little —
and two mixes of it with the log term frequency, on the 105 instruction tasks' held-out prompts and the three
SuperGLUE completion tasks' (the same splits, index and pairs as 4b; every text prompt sees the 108 tasks).

Run: ``python -m bench.quality.lexical_profiles --threads 2`` (about 6 min on 2 cores; prints its table, writes
only ``--out``). Measured 2026-11-28 (bench/results/quality.md, 4b reading): none of the profiles beats the shipped
one — the document-frequency profiles gain BoolQ/RTE (up to 82 / 67 % against 71 / 61 %) and lose CB and the text
tasks (top-1 82–85 % against 87.0 %); ``1 + ln df`` is within a point of the shipped profile everywhere. The rows
"text tasks 1 + ln tf, completion tasks …" weigh only the completion tasks' profiles otherwise: ``df / n`` there
reaches 92 / 80 / 88 % on BoolQ / RTE / CB and costs the text tasks six points of top-1 (81.0 %): the completion
tasks' format words take instruction prompts. The softer ``COMPLETION_ONLY`` rows keep the text tasks within half
a point; ``(1 + ln tf) · min(1, s / 2)`` (85 / 77 / 96 %, text 86.8 %) is what the product ships since 2026-11-28
(``atlas.lexical.TaskTerms.of`` with a completion task's sample counts).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas.lexical import TaskTerms, TermCounts, term_hashes
from atlas.samples import Sample
from bench.quality.common import log, make_extractor, make_sketcher, run_study

PROFILES: dict[str, Callable[[np.ndarray, np.ndarray, int], np.ndarray]] = {
    "1 + ln tf (product)": lambda tf, df, n: 1.0 + np.log(tf),
    "df / n": lambda tf, df, n: df / n,
    "(1 + ln tf) · df / n": lambda tf, df, n: (1.0 + np.log(tf)) * df / n,
    "(1 + ln tf) · √(df / n)": lambda tf, df, n: (1.0 + np.log(tf)) * np.sqrt(df / n),
    "1 + ln df": lambda tf, df, n: 1.0 + np.log(df),
}
"""Task-side term weights ``weigh(tf, df, n)`` from each term's count ``tf`` (T,) and the number of the task's
``n`` samples that contain it ``df`` (T,), both at least 1; each profile is unit-normalised."""

COMPLETION_ONLY: dict[str, Callable[[np.ndarray, np.ndarray, int], np.ndarray]] = {
    "1 + ln tf, terms of one sample dropped": lambda tf, df, n: (1.0 + np.log(tf)) * (df >= 2),
    "1 + ln tf, terms of fewer than three samples dropped": lambda tf, df, n: (1.0 + np.log(tf)) * (df >= 3),
    "(1 + ln tf) · min(1, df / 3)": lambda tf, df, n: (1.0 + np.log(tf)) * np.minimum(1.0, df / 3.0),
    "(1 + ln tf) · min(1, df / 2)": lambda tf, df, n: (1.0 + np.log(tf)) * np.minimum(1.0, df / 2.0),
}
"""Softer profiles, tried on the completion tasks only (their rows only)."""


@dataclass(frozen=True)
class TermStats:
    """A task's term counts: sorted ``keys`` (T,), each term's count ``tf`` (T,) and the number of its samples that
    hold it ``df`` (T,), over ``n`` samples with text."""

    keys: np.ndarray
    tf: np.ndarray
    df: np.ndarray
    n: int

    @staticmethod
    def of(texts: list[str]) -> TermStats:
        """The stats of the samples' ``texts`` (each hashed once)."""
        hashes = [term_hashes(t) for t in texts if t]
        tf = TermCounts.from_hashes(hashes)
        df = TermCounts.from_hashes(np.unique(h) for h in hashes)
        if not np.array_equal(tf.keys, df.keys):  # both capped at MAX_TERMS: only equal below the cap
            raise ValueError("term and document counts disagree (a task past the term cap)")
        return TermStats(tf.keys, np.maximum(tf.counts.astype(np.float64), 1.0),
                         np.maximum(df.counts.astype(np.float64), 1.0), max(len(hashes), 1))


def profile(stats: TermStats, weigh: Callable[[np.ndarray, np.ndarray, int], np.ndarray]) -> TaskTerms:
    """A task's lexical profile with term weights ``weigh(tf, df, n)``, unit-normalised."""
    w = weigh(stats.tf, stats.df, stats.n)
    norm = float(np.linalg.norm(w))
    return TaskTerms(stats.keys, ((w / norm) if norm > 0 else w).astype(np.float32))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Top-1 on the text tasks' prompts and each completion task's share of its own prompts, per profile."""
    from bench.quality.common import load_model
    from bench.quality.data_superglue import load_superglue_binary
    from bench.quality.openset_completion import COMPLETION_SETS
    from bench.quality.route_matrices import hybrid_best, rank_matrix
    from bench.quality.routing_setup import calibration_states, load_experiment, typicals
    from workers.calibration import prompt_side

    lm = load_model(args)
    ex = load_experiment(args, lm, None, quick_stride=5)
    names, index, splits = ex.names, ex.index, ex.splits
    cal = calibration_states(args, lm, names, splits)
    typical = typicals(index.states, [cal[n] for n in names])
    extractor = make_extractor(lm, make_sketcher(lm, args.m, args.seeds[0]), args)
    side, side_cal, held, comp_texts = [], [], [], []
    for k, ds in enumerate(COMPLETION_SETS):  # as 4b builds them (same permutation, pairs and held-out prompts)
        rows = load_superglue_binary(ds)
        perm = np.random.default_rng(1000 + k).permutation(len(rows))
        pairs = [Sample(prompt=f"{rows[i][0]}\nQuestion: {rows[i][1]}\nAnswer:",
                        completion=" yes" if rows[i][2] else " no")
                 for i in perm[: args.completion_signature + args.completion_heldout]]
        ps = prompt_side(extractor, pairs[: args.completion_signature], "completion")
        if ps is None:
            raise RuntimeError(f"{ds}: no prompt could be sketched")
        side.append(ps.prompt_sum)
        side_cal.append(ps.cal_states)
        comp_texts.append([s.prompt or "" for s in pairs[: args.completion_signature]])
        held.append([s.prompt or "" for s in pairs[args.completion_signature:]])
    log("completion tasks built")
    n_text = len(names)
    tasks = [*index.states, *side]
    states = [f.state for f in ex.feats] + [extractor.prompt(t).state for h in held for t in h]
    truth = np.concatenate([ex.truth, np.repeat(np.arange(len(side)) + n_text, [len(h) for h in held])])
    rank = rank_matrix(states, tasks, np.arange(len(tasks)), np.concatenate([typical, typicals(side, side_cal)]))
    # the FAISS stage proposes text tasks by signature; completion tasks are always candidates (their index entry is
    # the completion signature, which a prompt does not resemble)
    faiss_scores = np.zeros((len(states), len(tasks)))
    faiss_scores[:, :n_text] = np.stack([s.signature() for s in states]) @ index.signatures().T
    prompt_terms = [f.terms for f in ex.feats] + [TermCounts.from_texts([t]) for h in held for t in h]
    n_samples = np.array([int(s.n_samples) for s in tasks])
    stats = [TermStats.of(t) for t in [[x.input for x in splits[n][0]] for n in names] + comp_texts]
    out: dict[str, Any] = {"n_text_prompts": len(ex.feats), "completion_pairs": args.completion_signature, "rows": {}}
    product = PROFILES["1 + ln tf (product)"]
    variants = [(label, weigh, weigh) for label, weigh in PROFILES.items()]
    variants += [(f"text tasks 1 + ln tf, completion tasks {label}", product, weigh)
                 for label, weigh in {**PROFILES, **COMPLETION_ONLY}.items() if weigh is not product]
    for label, text_weigh, completion_weigh in variants:
        terms = [profile(st, text_weigh if i < n_text else completion_weigh) for i, st in enumerate(stats)]
        top = hybrid_best(rank, faiss_scores, prompt_terms, terms, n_samples, np.arange(len(tasks)),
                          always=np.arange(n_text, len(tasks)))
        is_text = truth < n_text
        row = {"text_top1": float(np.mean(top[is_text] == truth[is_text]))}
        row.update({ds: float(np.mean(top[truth == n_text + k] == n_text + k)) for k, ds in enumerate(COMPLETION_SETS)})
        out["rows"][label] = row
        log(f"{label}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    out["route_score_top1"] = float(np.mean(np.argmax(rank[:len(ex.feats), :n_text], 1) == ex.truth))
    return out


def render(res: dict[str, Any]) -> str:
    """The study's table (markdown)."""
    head = ("| task-side lexical profile | top-1, 105 text tasks (108 candidates) | BoolQ | RTE | CB |\n"
            "|:---|---:|---:|---:|---:|\n")
    return head + "".join(f"| {label} | {r['text_top1']:.1%} | {r['boolq']:.0%} | {r['rte']:.0%} | {r['cb']:.0%} |\n"
                          for label, r in res["rows"].items())


def main() -> None:
    """Command-line entry point."""
    from bench.quality.routing_setup import parse_routing_args

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--completion-signature", type=int, default=64, help="pairs per completion task")
    extra.add_argument("--completion-heldout", type=int, default=100, help="held-out prompts per completion task")
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_routing_args(__doc__.split("\n")[0])
    args.completion_signature, args.completion_heldout = known.completion_signature, known.completion_heldout
    run_study(args, run, render)


if __name__ == "__main__":
    main()
