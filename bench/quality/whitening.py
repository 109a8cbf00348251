"""Experiment 4c — the space whitening of the route ranking: when it helps, and what it costs.

Same 105 multitask_instructions tasks, splits, index cache and held-out prompts as experiment 4
(:mod:`bench.quality.routing`). For random sub-spaces of T tasks (``--draws`` per size), each with its own
whitening fitted on its tasks' unit means (as the service fits it on a space's routing means), the top-1
of the tasks' held-out prompts under the route score alone and under the product's ranking
(:func:`bench.quality.route_matrices.rank_matrix`, the matrix form of :func:`atlas.routing.rank_scores`), at
every size, below the service's minimum too. This is what sets ``atlas.whitening.WHITEN_MIN_TASKS``.

Cost, on synthetic unit signatures at m = 4096: fitting the transform on ``WHITEN_MAX_TASKS`` signatures,
and ranking one prompt against 128 candidates with memoised task terms (the route path).

Run: ``python -m bench.quality.whitening`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from atlas import routing
from atlas.whitening import WHITEN_MAX_TASKS, WHITEN_MIN_TASKS, fit_space_whitening
from bench.quality import report
from bench.quality.common import run_and_report
from bench.quality.route_matrices import rank_matrix, score_matrix
from bench.quality.routing_setup import (
    calibration_states,
    load_experiment,
    parse_routing_args,
    routing_settings,
    typicals,
)

SIZES = (3, 5, 8, 12, 16, 24, 32, 48, 64, 105)


def subsets(S: np.ndarray, states: list[Any], prompts: list[Any], truth: np.ndarray, typical: np.ndarray,
            sizes: tuple[int, ...], draws: int, seed: int, lexical: tuple[Any, ...] | None = None
            ) -> list[dict[str, Any]]:
    """Mean top-1 (route score, whitened ranking at every size, and — given ``lexical`` = (signature
    cosines (P, T), prompt terms, task terms, task sample counts) — the product: its ranking, whitened from
    ``WHITEN_MIN_TASKS`` tasks, fused with the lexical score) over random sub-spaces of each size."""
    from bench.quality.route_matrices import hybrid_best

    rng = np.random.default_rng(seed)
    rows = []
    for size in sizes:
        plain, ranked, fused = [], [], []
        for _ in range(draws if size < len(states) else 1):
            cols = np.sort(rng.choice(len(states), size, replace=False))
            mask = np.isin(truth, cols)
            y = np.searchsorted(cols, truth[mask])
            plain.append(float(np.mean(S[np.ix_(mask, cols)].argmax(1) == y)))
            R = rank_matrix([p for p, keep in zip(prompts, mask, strict=True) if keep], [states[c] for c in cols],
                            np.arange(size), typical[cols], min_tasks=2)
            ranked.append(float(np.mean(R.argmax(1) == y)))
            if lexical is not None:
                sig, p_terms, t_terms, n_samples = lexical
                sub = [p for p, keep in zip(prompts, mask, strict=True) if keep]
                R = rank_matrix(sub, [states[c] for c in cols], np.arange(size), typical[cols])  # the product's
                best = hybrid_best(R, sig[np.ix_(mask, cols)], [t for t, keep in zip(p_terms, mask, strict=True)
                                                                if keep], [t_terms[c] for c in cols],
                                   n_samples[cols], np.arange(size))
                fused.append(float(np.mean(best == y)))
        rows.append({"tasks": size, "draws": len(plain), "route": float(np.mean(plain)),
                     "ranked": float(np.mean(ranked)), "gain": float(np.mean(ranked) - np.mean(plain)),
                     "fused": float(np.mean(fused)) if fused else float("nan")})
    return rows


def costs(m: int, seed: int, repeats: int = 5) -> dict[str, float]:
    """Seconds to fit a space's transforms (``ae`` and error) on ``WHITEN_MAX_TASKS`` tasks; milliseconds to
    rank one prompt vs 128 candidates."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, WHITEN_MAX_TASKS, m))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    fits = []
    for _ in range(repeats):
        t = time.perf_counter()
        w = fit_space_whitening(x[0], x[1])
        fits.append(time.perf_counter() - t)
    assert w is not None

    class _State:
        n_samples = 200

    views = [(np.stack([a, a, e]), np.ones(3), 1.0) for a, e in zip(x[0, :128], x[1, :128], strict=True)]
    cands = [routing.Candidate(i, f"t{i}", _State(), 0.0, views[i]) for i in range(128)]
    p = np.stack([x[0, -1], x[0, -1], x[1, -1]])
    routing.rank_scores(p, cands, views, w)  # memoise the task terms, as a warm route path does
    t = time.perf_counter()
    for _ in range(100):
        routing.rank_scores(p, cands, views, w)
    return {"fit_s": float(np.median(fits)), "rank_ms": (time.perf_counter() - t) / 100 * 1e3,
            "fit_tasks": WHITEN_MAX_TASKS, "candidates": 128, "m": m}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load experiment 4's index and prompts, then the sub-space sweep and the costs."""
    from bench.quality.common import load_model

    lm = load_model(args)
    ex = load_experiment(args, lm, None, quick_stride=3)
    splits, names, index, feats, truth = ex.splits, ex.names, ex.index, ex.feats, ex.truth
    prompts = [f.state for f in feats]
    S = score_matrix(prompts, index.states)
    cal = calibration_states(args, lm, names, splits)
    typical = typicals(index.states, [cal[n] for n in names])
    sizes = (*(s for s in SIZES if s < len(names)), len(names))
    lexical = (np.stack([f.signature for f in feats]) @ index.signatures().T, [f.terms for f in feats], index.terms,
               np.array([int(st.n_samples) for st in index.states]))
    return {"rows": subsets(S, index.states, prompts, truth, typical, sizes, args.draws, args.seeds[0], lexical),
            "costs": costs(args.m, args.seeds[0]), "n_prompts": len(feats), "lm": lm}


def render(res: dict[str, Any], facts: str) -> str:
    """Markdown for ``quality.md``."""
    table = report.table(["Tasks in the space", "draws", "top-1, route score", "top-1, whitened ranking", "gain",
                          "top-1, product (ranking fused with lexical)"],
                         [[r["tasks"], r["draws"], f"{r['route']:.1%}", f"{r['ranked']:.1%}",
                           f"{100 * r['gain']:+.1f} pts", f"{r.get('fused', float('nan')):.1%}"] for r in res["rows"]])
    c = res["costs"]
    return (
        f"Random sub-spaces of the 105 tasks, each whitened on its own tasks' means (`ae` and error; the ranking "
        f"computed at every size, below the service's minimum too); their held-out prompts ({res['n_prompts']} "
        f"in all). The service whitens from {WHITEN_MIN_TASKS} tasks on.\n\n" + table + "\n\n"
        f"Cost at m = {c['m']}: fitting both transforms on {c['fit_tasks']} tasks {c['fit_s']:.3f} s (median); "
        f"ranking one prompt against {c['candidates']} candidates with memoised task terms {c['rank_ms']:.2f} ms."
        "\n\n" + facts
    )


def main() -> None:
    """Command-line entry point."""
    import sys

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--draws", type=int, default=30)
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_routing_args(__doc__.split("\n")[0])
    args.draws = known.draws
    run_and_report("whitening", "4c. Space whitening of the route ranking: when it helps, what it costs", args,
                   run, render, lambda res: {**routing_settings(args), "draws per size": args.draws})


if __name__ == "__main__":
    main()
