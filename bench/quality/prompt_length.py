"""Experiment 4f: routing and the open set when prompts are shorter than the tasks' samples.

A task's threshold is calibrated on its own held-out *samples* (docs/SCORES.md, "Calibration"), so the
documented false-reject rate is a promise about prompts like them. Users often route shorter text. This
runs experiment 4d's protocol (22 data families, 18 indexed and 4 unseen per draw, the product through the
library with every default, no labels) and routes every held-out prompt cut to its first half and first
quarter of words (at least 4 words) as well as whole, for the product, the product with every task
re-calibrated at a 1 % false-reject rate, the product after ``fit`` on labelled prompts of that length
(experiment 4d's cross-fitted halves) and after ``fit`` on the same prompts whole (the labels a user has, the
prompts answered cut), and MiniLM kNN with per-route thresholds calibrated like ours.

    python -m bench.quality.prompt_length --threads 2
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from typing import Any

import numpy as np

from bench.quality.common import load_model, log, pct, run_and_report
from bench.quality.openset_families import (
    _at_rate,
    _tally,
    _with_fit,
    calibrated_knn_rates,
    family_args,
    family_parser,
    family_tasks,
    split_texts,
)

FRACTIONS = (1.0, 0.5, 0.25)
MIN_WORDS = 4
LOW_RATE = 0.01
KEYS = ("none_unseen", "none_indexed", "right", "top1")
SPLIT_KEYS = ("none_own_top", "none_wrong_top")
"""An indexed prompt's "none" by its top match: its own task (a false reject) or a wrong one (a wrong answer held)."""


def cut(text: str, fraction: float) -> str:
    """``text`` up to the end of its first ``fraction`` of words (at least :data:`MIN_WORDS`; whole below that),
    its own whitespace kept: collapsing a prompt's newlines alone moved BBH-style prompts off their tasks (in a
    first run of this experiment, "none" on whole indexed prompts 0.15 against 4d's 0.03)."""
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    n = max(MIN_WORDS, round(len(ends) * fraction))
    return text if n >= len(ends) else text[:ends[n - 1]]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.quality.embed import MiniLMEncoder
    from fisher_atlas import Atlas

    tasks = {k: v for k, v in family_tasks().items() if len(v) >= args.signature + args.heldout}
    names = sorted(tasks)
    n_unseen = max(1, round(0.2 * len(names)))
    encoder = MiniLMEncoder()
    draws: list[dict[str, Any]] = []
    for d in range(args.draws):
        seed = 1000 * (1 + args.seeds[0]) + d
        rng = np.random.default_rng(seed)  # experiment 4d's draws
        sig, held = {}, {}
        for t in names:
            sig[t], held[t] = split_texts(tasks[t], args.signature, args.heldout, rng)
        unseen = sorted(rng.choice(names, size=n_unseen, replace=False).tolist())
        indexed = [t for t in names if t not in unseen]
        utterances = [encoder.encode(sig[t]) for t in indexed]
        product = {"model": args.model, "device": args.device, "torch_threads": args.threads, "sketch_dim": args.m,
                   "max_tokens_per_sample": args.max_tokens}
        draw: dict[str, Any] = {"unseen_tasks": unseen, "by_fraction": {}}
        cuts = {f: [(t, cut(p, f)) for t in indexed + unseen for p in held[t]] for f in FRACTIONS}
        with tempfile.TemporaryDirectory() as tmp:
            with Atlas(tmp, **product) as atlas:
                for t in indexed:
                    atlas.add(t, sig[t], progress=False)
                for f, prompts in cuts.items():
                    res = _tally(prompts, atlas.route([p for _, p in prompts], k=3), unseen)
                    truth = [indexed.index(t) if t in indexed else None for t, _ in prompts]
                    words = [len(p.split()) for _, p in prompts]
                    draw["by_fraction"][str(f)] = {
                        "product": {k: res[k] for k in (*KEYS, *SPLIT_KEYS)},
                        "low_rate": _at_rate(atlas, prompts, indexed, unseen, LOW_RATE),
                        "minilm": calibrated_knn_rates(utterances, encoder.encode([p for _, p in prompts]), truth),
                        "fit": _with_fit(atlas, prompts, indexed, unseen, rng),
                        "median_words": float(np.median(words)),
                    }
                    by_f = draw["by_fraction"][str(f)]
                    by_f["fit_whole"] = by_f["fit"] if f == 1.0 else _with_fit(  # labelled whole, answered cut
                        atlas, prompts, indexed, unseen, np.random.default_rng((seed, round(100 * f))), cuts[1.0])
                    for t in indexed:  # back to the calibrated thresholds and tests for the next length
                        atlas.set_threshold(t, None)
                        atlas.set_template_test(t, True)
                        atlas.set_novelty_test(t, True)
            with Atlas(tmp, route_length_match=False, **product) as whole:  # the same store, judged as whole samples
                for f, prompts in cuts.items():
                    res = _tally(prompts, whole.route([p for _, p in prompts], k=3), unseen)
                    draw["by_fraction"][str(f)]["as_whole"] = {k: res[k] for k in (*KEYS, *SPLIT_KEYS)}
        for f in FRACTIONS:
            r = draw["by_fraction"][str(f)]
            log(f"draw {d} fraction {f}: product none {r['product']['none_unseen']:.3f} / "
                f"{r['product']['none_indexed']:.3f}, judged whole {r['as_whole']['none_unseen']:.3f} / "
                f"{r['as_whole']['none_indexed']:.3f}, at {LOW_RATE:.0%} {r['low_rate']['none_unseen']:.3f} / "
                f"{r['low_rate']['none_indexed']:.3f}, MiniLM {r['minilm']['none_unseen']:.3f} / "
                f"{r['minilm']['none_indexed']:.3f}")
        draws.append(draw)
    return {"n_tasks": len(names), "n_unseen": n_unseen, "draws": draws, "lm": load_model(args)}


def render(res: dict[str, Any], facts: str) -> str:
    draws = res["draws"]
    labels = {"product": "FisherAtlas (product, calibrated at 5 %, no labels)",
              "as_whole": "FisherAtlas (product) judging every prompt as a whole sample (`route_length_match=False`, "
                          "same store; before 2026-11-28)",
              "low_rate": f"FisherAtlas (product), every task calibrated at {LOW_RATE:.0%} (`false_reject_rate`)",
              "fit": "FisherAtlas (product) + `fit` on labelled prompts of the same length (cross-fitted halves)",
              "fit_whole": "FisherAtlas (product) + `fit` on labelled *whole* prompts (cross-fitted halves; since "
                           "2026-12-01 an override moves a short prompt's threshold by as much as the task's)",
              "minilm": "MiniLM kNN, per-route thresholds calibrated like ours (5 %)"}
    rows = []
    for router, label in labels.items():
        if any(router not in d["by_fraction"][str(f)] for d in draws for f in FRACTIONS):
            continue  # a row absent from older result files
        for f in FRACTIONS:
            col = [float(np.median([d["by_fraction"][str(f)][router][k] for d in draws])) for k in KEYS]
            words = float(np.median([d["by_fraction"][str(f)]["median_words"] for d in draws]))
            rows.append(f"| {label} | {'whole' if f == 1.0 else f'first {f:.0%} of words'} ({words:.0f}) | "
                        f"{col[1]:.3f} | {col[0]:.3f} | {pct(col[2])} | {pct(col[3])} |")
    table = ("| Router | prompt (median words) | none on indexed (goal ≤ 0.05) | none on unseen | answered right, "
             "indexed | top-1, indexed |\n|:---|:---|---:|---:|---:|---:|\n" + "\n".join(rows))
    split_rows = []
    for router in ("product", "as_whole"):
        if any(SPLIT_KEYS[0] not in d["by_fraction"][str(f)][router] for d in draws for f in FRACTIONS):
            continue  # older result files
        for f in FRACTIONS:
            own, wrong = (float(np.median([d["by_fraction"][str(f)][router][k] for d in draws])) for k in SPLIT_KEYS)
            split_rows.append(f"| {labels[router]} | {'whole' if f == 1.0 else f'first {f:.0%} of words'} | "
                              f"{own:.3f} | {wrong:.3f} |")
    if split_rows:
        table += ("\n\nThe indexed tasks' prompts answered \"none\", by their top match before the open set: their own "
                  "task (its threshold or tests refused the right answer: a false reject) or another (a wrong answer "
                  "withheld)\n\n| Router | prompt | none when the top match is the prompt's task | none when it is "
                  "another task |\n|:---|:---|---:|---:|\n" + "\n".join(split_rows))
    return (f"{res['n_tasks']} data families (experiment 4d), {res['n_tasks'] - res['n_unseen']} indexed and "
            f"{res['n_unseen']} unseen per draw, {len(draws)} draws (medians); every held-out prompt routed whole "
            f"and cut to its first half and quarter of words (at least {MIN_WORDS}); thresholds calibrated on held-out "
            f"samples and (since 2026-11-28) their prefixes.\n\n{table}\n\n{facts}")


def main() -> None:
    """Command-line entry point."""
    args = family_args(family_parser(__doc__.split("\n")[0], draws=3))
    t0 = time.perf_counter()
    run_and_report("prompt_length", "4f. Prompts shorter than the samples: false rejects and the open set "
                   "(issue 13)", args, run, render,
                   lambda res: {"signature samples": args.signature, "held-out prompts": args.heldout,
                                "fractions": "/".join(str(f) for f in FRACTIONS),
                                "product": "library defaults (bundled model, m=4096)"})
    log(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
