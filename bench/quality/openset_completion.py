"""Experiment 4b's completion-mode study (:mod:`bench.quality.openset`): SuperGLUE tasks beside the text tasks.

BoolQ, RTE and CB (:data:`COMPLETION_SETS`) added as prompt/completion pairs (passage + question → " yes"/" no")
beside the 105 text tasks; their held-out prompts routed on the prompt-side state (the product) and on the
completion state (before), with MiniLM on the prompts for reference (:func:`completion_tasks`).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from atlas import lexicon_repo
from atlas.lexical import TermCounts
from atlas.samples import Sample
from bench.quality.common import make_extractor, make_sketcher
from bench.quality.data_superglue import load_superglue_binary
from bench.quality.route_matrices import _unit, hybrid_best, rank_matrix, score_matrix
from bench.quality.routing_setup import typicals
from workers.calibration import prompt_side

COMPLETION_SETS = ("boolq", "rte", "cb")


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
        # what the job stores and the router reads (counts and, for a completion task, per-term sample counts)
        delta = lexicon_repo.LexicalDelta.of_samples(sig, "completion")
        comp_terms.append(lexicon_repo.LexicalRecord.empty().add(delta).terms())
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
    terms = [*index.terms, *comp_terms]
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
