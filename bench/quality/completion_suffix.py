"""Offline study: a completion task compared on its prompts' last positions (experiment 4g's space; issue 13).

A completion task routes on its prompt-side state, the sum over every position of its prompts
(docs/SCORES.md, "Completion-mode tasks"). BoolQ's prompts are long Wikipedia passages with a two-line
"Question: … / Answer:" frame at the end, so the passage's positions outweigh the frame, and in a space of data
families BoolQ keeps only ~60 % of its prompts (bench 4g). This study asks whether comparing a completion task on
the prompt's **last K positions** — where the model turns from the passage to the answer — would route them.

States are sums over positions and the model is causal, so the state of a prompt's last ``K`` counted positions is
exactly its whole state minus the state of the prompt cut ``K`` tokens short (:func:`suffix_state`). Per ``K``, a
completion task's column scores the prompt's suffix state against the sum of its pairs' prompts' suffix states; the
text tasks' columns stay whole. Reported: the route score's top-1 (no whitening, no lexical evidence: the raw
signal) for each completion task's 50 held-out prompts and for the text families' prompts, one draw of 4g's space
with 64 pairs.

Run: ``python -m bench.quality.completion_suffix --threads 2`` (about 3 min on 2 cores; prints its table, writes
only ``--out``). Measured 2026-11-28 (bench/results/quality.md, 4g reading): the top-1 swings with ``K`` (BoolQ 62,
92, 88, 82, 56, 52, 70, 88, 80 % at K = 2, 4, 6, 8, 12, 16, 20, 24, 32; whole prompts 72 %) — a few positions'
score is on another scale than a whole prompt's, so it is not a rule to ship. Each row also comes "standardised":
every task's scores over the mean and spread of its own leave-one-out scores (the calibration pick), one scale for
all — far worse everywhere (text prompts 66.6 %), whole prompts included.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import numpy as np

from bench.quality.common import load_model, log, make_extractor, make_parser, make_sketcher, run_study
from bench.quality.completion_families import COMPLETION_SETS, TWIN_FAMILIES, completion_pairs
from bench.quality.openset_families import family_tasks, split_texts

DEFAULT_KS = (2, 4, 6, 8, 12, 16, 20, 24, 32)


def suffix_state(whole: Any, cut: Any) -> Any:
    """The state of the positions ``whole`` has and ``cut`` (the same prompt cut short) lacks: their difference,
    exact because states are sums over positions and a causal model gives the shared positions the same states."""
    from fishersketch.state import SketchState

    return SketchState(whole.spec, whole.sums - cut.sums, whole.sq_norms - cut.sq_norms,
                       whole.token_counts - cut.token_counts, whole.sample_counts)


def prompt_states(extractor: Any, texts: list[str], ks: tuple[int, ...]) -> dict[Any, list[Any]]:
    """Each text's whole prompt-mode state (key ``"whole"``) and, per ``K``, the state of its last ``K`` counted
    positions (at least 2 positions are cut off; a text of fewer is its whole state less its first positions)."""
    from atlas.samples import Sample
    from workers.prompt_batcher import PromptBatcher

    batcher = PromptBatcher(extractor, token_budget=8192)
    prepared, skipped = extractor.sample_tokenizer.prepare([Sample(text=t) for t in texts], "text")
    if skipped:
        raise ValueError(f"{len(skipped)} texts could not be sketched")
    whole = list(batcher.sketch_prepared(prepared))
    out: dict[Any, list[Any]] = {"whole": whole}
    for k in ks:
        cut = [replace(p, input_ids=p.input_ids[:max(p.first_target + 2, len(p.input_ids) - k)]) for p in prepared]
        out[k] = [suffix_state(w, c) for w, c in zip(whole, batcher.sketch_prepared(cut), strict=True)]
    return out


def _spread(scores: list[float]) -> tuple[float, float]:
    """Mean and standard deviation (at least 1e-3) of a task's held-out route scores."""
    x = np.asarray(scores, dtype=np.float64)
    return float(x.mean()), max(float(x.std(ddof=1)), 1e-3)


def _sum(states: list[Any]) -> Any:
    total = states[0].copy()
    for st in states[1:]:
        total.merge_(st)
    return total


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Top-1 by route score per completion task and on the text prompts, for whole prompts and each ``K``."""
    from atlas import routing
    from atlas.samples import Sample
    from bench.quality.route_matrices import score_matrix

    lm = load_model(args)
    extractor = make_extractor(lm, make_sketcher(lm, args.m, args.seeds[0]), args)
    rng = np.random.default_rng(4000 + 1000 * args.seeds[0])  # 4g's first draw
    families = {k: v for k, v in family_tasks().items() if k not in TWIN_FAMILIES and len(v) >= 120}
    names = sorted(families)
    text_states, text_typical, prompts, truth = [], [], [], []
    for t in names:
        sig, held = split_texts(families[t], 100, 20, rng)
        text_states.append(extractor.extract([Sample(text=x) for x in sig], mode="text").state)
        cal = prompt_states(extractor, [sig[i] for i in routing.calibration_pick(len(sig))], ())["whole"]
        text_typical.append(_spread(routing.leave_one_out_scores(text_states[-1], cal)))
        prompts += held
        truth += [t] * len(held)
    ks = tuple(args.ks)
    task_states: dict[str, dict[Any, Any]] = {}
    typical: dict[str, dict[Any, tuple[float, float]]] = {}
    for k, ds in enumerate(COMPLETION_SETS):
        pairs, held = completion_pairs(ds, 7000 + k, args.pairs)
        own = prompt_states(extractor, [p["prompt"] for p in pairs], ks)
        task_states[ds] = {key: _sum(v) for key, v in own.items()}
        pick = routing.calibration_pick(len(pairs))
        typical[ds] = {key: _spread(routing.leave_one_out_scores(task_states[ds][key], [v[i] for i in pick]))
                       for key, v in own.items()}
        prompts += held
        truth += [ds] * len(held)
    log(f"{len(names)} text tasks and {len(COMPLETION_SETS)} completion tasks sketched")
    states = prompt_states(extractor, prompts, ks)
    answers = np.array(truth)
    labels = np.array(names + list(COMPLETION_SETS))
    text_cols = score_matrix(states["whole"], text_states)
    is_completion = np.isin(answers, COMPLETION_SETS)
    rows: dict[str, dict[str, float]] = {}
    for key in ["whole", *ks]:
        cols = score_matrix(states[key], [task_states[ds][key] for ds in COMPLETION_SETS])
        raw = np.concatenate([text_cols, cols], axis=1)
        spread = np.array(text_typical + [typical[ds][key] for ds in COMPLETION_SETS])  # (T, 2): mean, sd
        for name, score in (("", raw), (" standardised", (raw - spread[:, 0]) / spread[:, 1])):
            top = labels[score.argmax(1)]
            row = {ds: float(np.mean(top[answers == ds] == ds)) for ds in COMPLETION_SETS}
            row["text"] = float(np.mean(top[~is_completion] == answers[~is_completion]))
            rows[f"{key}{name}"] = row
            log(f"{key}{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
    return {"rows": rows, "pairs": args.pairs}


def render(res: dict[str, Any]) -> str:
    """The study's table (markdown)."""
    out = "| completion tasks compared on | BoolQ | RTE | CB | text prompts |\n|:---|---:|---:|---:|---:|\n"
    for key, r in res["rows"].items():
        label = key.replace("whole", "whole prompts (the product's prompt side)", 1)
        label = label if label.startswith("whole") else f"last {label} positions".replace(" standardised positions",
                                                                                            " positions, standardised")
        out += f"| {label} | {r['boolq']:.0%} | {r['rte']:.0%} | {r['cb']:.0%} | {r['text']:.1%} |\n"
    return out


def main() -> None:
    """Command-line entry point."""
    p = make_parser(__doc__.split("\n")[0], m=4096, max_tokens=512, seeds=[0])
    p.add_argument("--pairs", type=int, default=64, help="prompt/completion pairs per completion task")
    p.add_argument("--ks", type=int, nargs="+", default=list(DEFAULT_KS), help="trailing positions compared")
    args = p.parse_args()
    run_study(args, run, render)


if __name__ == "__main__":
    main()
