"""Routing when tasks differ in size: experiment 4's 105 tasks, each with 5, 10, 20 or 200 signature samples.

An offline study (issue 13; not a product run, nothing written to ``quality.md``). A team moving from
semantic-router defines routes of 5–15 utterances beside larger ones, and a review (2026-12-08) found the product
behind a MiniLM centroid router there (0.690 against 0.760 on its 20 routes): a small task's prompts went to large
tasks. This replays the product's re-rank (:func:`atlas.analysis.rerank_route`, FAISS candidates, the space's
whitening, the lexical fusion) on experiment 4's held-out prompts with each task's state, terms and calibration
taken from experiment 4's caches at the size its construction draws, against the MiniLM centroid of the same
samples, and with the ranking's size priors varied:

* ``product`` — as shipped: the typical score shrunk towards ``TYPICAL_PRIOR`` = 1 by κ pseudo-scores, the evidence
  prior taken in the route score's denominator and once more in the ranking, the lexical score at ``n / (n + κ)``;
* ``typical towards the space median`` — the typical score shrunk towards the median of the tasks' raw mean held-out
  scores instead of 1 (a task of one sample, with none held out, is still held to 1);
* ``typical κ = 1`` — shrunk by one pseudo-score;
* ``no second evidence prior`` — the ranking without its own ``√(n / (n + κ))``;
* ``lexical at √ prior`` — the lexical score at ``√(n / (n + κ))`` (before 2026-12-07);
* ``median typical, no second prior`` — both.

Usage::

    python -m bench.quality.mixed_sizes --threads 2 [--draws 2]

Builds (or reads) experiment 4's caches at 5, 10, 20 and 200 samples (about 15 min on the 2-core box from cold).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import faiss
import numpy as np

from bench.quality.common import load_model, log
from bench.quality.paths import OUT_DIR
from bench.quality.routing_setup import (
    N_HELDOUT,
    build_index,
    calibration_states,
    load_encoder,
    parse_routing_args,
    prompt_features,
    task_splits,
)

SIZES = (5, 10, 20, 200)
VARIANTS: dict[str, dict[str, Any]] = {
    "product": {},
    "typical towards the space median": {"typical_prior": "median"},
    "typical κ = 1": {"typical_k": 1.0},
    "no second evidence prior": {"rank_k": 0.0},
    "lexical at √ prior": {"lexical": "sqrt"},
    "median typical, no second prior": {"typical_prior": "median", "rank_k": 0.0},
}


def typical(loo: Sequence[float], variant: dict[str, Any], space_median: float) -> float:
    """A task's typical score from its leave-one-out scores under ``variant`` (the product's rule by default)."""
    from atlas import routing
    from atlas.route_calibration import MAX_CAL_SCORES

    xs = [float(x) for x in loo if -1.0 <= float(x) <= 1.0][-MAX_CAL_SCORES:]
    if not xs:
        return routing.TYPICAL_PRIOR
    k = float(variant.get("typical_k", routing.PRIOR_SAMPLES))
    prior = space_median if variant.get("typical_prior") == "median" else routing.TYPICAL_PRIOR
    return (sum(xs) + k * prior) / (len(xs) + k)


def patched_priors(variant: dict[str, Any]) -> Callable[[], None]:
    """Set the ranking's size priors of ``variant`` on :mod:`atlas.routing`; returns the function that restores them."""
    from atlas import routing

    saved = (routing.size_shrink, routing.lexical_prior)
    rank_k = float(variant.get("rank_k", routing.PRIOR_SAMPLES))

    def size_shrink(norms: np.ndarray, dens: np.ndarray, ns: np.ndarray) -> np.ndarray:
        ok = (norms > 0) & (dens > 0)
        n = np.maximum(np.asarray(ns, dtype=np.float64), 1.0)
        return np.where(ok, np.minimum(norms / np.where(ok, dens, 1.0), 1.0) * np.sqrt(n / (n + rank_k)), 0.0)

    routing.size_shrink = size_shrink  # type: ignore[assignment]
    if variant.get("lexical") == "sqrt":
        routing.lexical_prior = routing.evidence_prior  # type: ignore[assignment]

    def restore() -> None:
        routing.size_shrink, routing.lexical_prior = saved  # type: ignore[assignment]

    return restore


def evaluate(data: dict[int, tuple[Any, list[list[float]]]], feats: list[Any], truth: np.ndarray,
             sizes: list[int], variant: dict[str, Any]) -> dict[str, Any]:
    """Top-1 of the product's re-rank and of the MiniLM centroid for one construction (each task's size)."""
    from atlas.analysis import Candidate, default_candidates, rerank_route, state_view
    from atlas.routing import unit_means
    from atlas.whitening import fit_space_whitening

    names = data[SIZES[0]][0].names
    states = [data[s][0].states[i] for i, s in enumerate(sizes)]
    terms = [data[s][0].terms[i] for i, s in enumerate(sizes)]
    loos = [data[s][1][i] for i, s in enumerate(sizes)]
    median = float(np.nanmedian([np.mean(x) if x else np.nan for x in loos]))
    typicals = [typical(x, variant, median) for x in loos]
    means = np.stack([unit_means(s) for s in states])
    views = [state_view(s) for s in states]
    sigs = np.stack([s.signature() for s in states]).astype(np.float32)
    flat = faiss.IndexFlatIP(sigs.shape[1])
    flat.add(sigs)
    _, top = flat.search(np.stack([f.signature for f in feats]).astype(np.float32), default_candidates(3))
    whitening = fit_space_whitening(means[:, 0], means[:, 1])
    restore = patched_priors(variant)
    try:
        pred = np.array([rerank_route(f.state, [
            Candidate(task_id=int(j), name=names[j], state=states[j], faiss_score=0.0, view=views[j],
                      typical=float(typicals[j]), terms=terms[j]) for j in top[i]],
            k=1, threshold=-1.0, whitening=whitening, prompt_terms=f.terms).matches[0].task_id
            for i, f in enumerate(feats)])
    finally:
        restore()
    cents = np.stack([data[s][0].minilm[i].mean(0) for i, s in enumerate(sizes)])
    cents /= np.linalg.norm(cents, axis=1, keepdims=True)
    minilm = (np.stack([f.minilm for f in feats]) @ cents.T).argmax(1)
    own = np.asarray(sizes)[truth]
    got = np.asarray(sizes)[pred]
    return {"top1": float((pred == truth).mean()), "minilm": float((minilm == truth).mean()),
            "by_size": {int(s): [float((pred[own == s] == truth[own == s]).mean()),
                                 float((minilm[own == s] == truth[own == s]).mean())] for s in sorted(set(sizes))},
            "small_to_large": int(((own <= 10) & (got >= 20) & (pred != truth)).sum()),
            "large_to_small": int(((own >= 20) & (got <= 10) & (pred != truth)).sum())}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every construction × variant."""
    from atlas import routing

    lm = load_model(args)
    encoder = load_encoder(args)
    data: dict[int, tuple[Any, list[list[float]]]] = {}
    for n in SIZES:
        args.n_signature = n
        splits = task_splits(args.seeds[0], n, N_HELDOUT)
        names = list(splits)
        index = build_index(args, lm, names, splits, encoder)
        cal = calibration_states(args, lm, names, splits)
        data[n] = (index, [routing.leave_one_out_scores(st, cal[x]) for st, x in zip(index.states, names, strict=True)])
    feats, _ = prompt_features(args, lm, data[SIZES[0]][0].heldout, encoder)  # the same prompts at every size
    pos = {x: i for i, x in enumerate(data[SIZES[0]][0].names)}
    truth = np.array([pos[f.task] for f in feats])
    rng = np.random.default_rng(args.seeds[0])
    constructions: dict[str, list[int]] = {}
    for d in range(args.draws):
        for label, choices in (("5–200", SIZES), ("5–20", (5, 10, 20)), ("5 or 200", (5, 200))):
            constructions[f"{label}, draw {d}"] = rng.choice(choices, len(truth) // N_HELDOUT).tolist()
    out: dict[str, Any] = {}
    for cname, sizes in constructions.items():
        for vname, variant in VARIANTS.items():
            out[f"{cname} | {vname}"] = r = evaluate(data, feats, truth, sizes, variant)
            log(f"{cname} | {vname}: {json.dumps(r)}")
    return out


def render(res: dict[str, Any]) -> str:
    """A markdown table: top-1 (MiniLM centroid), a small task's prompts taken by large tasks."""
    lines = ["| construction | ranking | top-1 (MiniLM centroid) | small tasks' prompts to large tasks | "
             "large tasks' prompts to small tasks |", "|:---|:---|---:|---:|---:|"]
    for key, r in res.items():
        cname, vname = key.split(" | ")
        lines.append(f"| {cname} | {vname} | {100 * r['top1']:.1f} % ({100 * r['minilm']:.1f} %) | "
                     f"{r['small_to_large']} | {r['large_to_small']} |")
    return "\n".join(lines)


def main() -> None:
    import sys

    draws = 2
    if "--draws" in sys.argv:
        i = sys.argv.index("--draws")
        draws = int(sys.argv[i + 1])
        del sys.argv[i:i + 2]
    args = parse_routing_args(__doc__ or "")
    args.draws = draws
    t0 = time.perf_counter()
    res = run(args)
    path = OUT_DIR / "mixed_sizes.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(render(res))
    log(f"raw results: {path}; {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
