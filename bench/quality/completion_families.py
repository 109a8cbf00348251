"""Experiment 4g — completion-mode tasks in a space of distinct data families, end to end (issue 13).

Experiment 4b routes SuperGLUE completion tasks beside the 105 instruction tasks (mostly MMLU subjects and LAMA
relations); the CI test (tests/service/test_routing_quality.py) beside six text tasks. This experiment puts them in
the space a user is likelier to have: one text task per data family of experiment 4d (:func:`family_tasks`, 100
samples each), without the three families made of these very SuperGLUE passages and premises (a text task of
BoolQ's passages is a twin of BoolQ's prompts, another question), plus BoolQ, RTE and CB added as prompt → " yes"/
" no" pairs (``--pairs``, then ``--more-pairs`` in the same store: the tasks deleted and added again). It runs the
**product itself** through the library (:class:`fisher_atlas.Atlas`: in-process worker, SQLite, FAISS, the bundled
model at the service's 512 tokens, every default) and routes 50 held-out prompts of each completion task and the text
families' 20 held-out prompts each.

Reported per completion task (medians over ``--draws``; each draw its own samples): the share of its prompts whose
top match it is, answered right (top and not "none") and "none"; where the others went; and the text tasks' top-1,
for the product, the product without lexical evidence (``route_lexical=False``, same store), and an
all-MiniLM-L6-v2 centroid router (the completion tasks' prompts, the text tasks' samples).

Run: ``python -m bench.quality.completion_families --threads 2`` (about 12 min on 2 cores) or ``--quick``.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from typing import Any

import numpy as np

from bench.quality.common import load_model, log, pct, run_and_report
from bench.quality.data_superglue import load_superglue_binary
from bench.quality.openset_families import family_parser, family_tasks, split_texts

COMPLETION_SETS = ("boolq", "rte", "cb")
TWIN_FAMILIES = ("boolq_passages", "cb_premises", "rte_premises")
"""Text families made of the completion tasks' own passages and premises: left out of the space."""
HELD_PROMPTS = 50
"""Held-out prompts per completion task (CB has 250 rows: the pairs and these must fit)."""


def completion_pairs(dataset: str, seed: int, n_pairs: int) -> tuple[list[dict[str, str]], list[str]]:
    """``n_pairs`` prompt/completion pairs of a SuperGLUE task (4b's format) and :data:`HELD_PROMPTS` held-out
    prompts; the held-out prompts do not depend on ``n_pairs``."""
    rows = load_superglue_binary(dataset)
    perm = np.random.default_rng(seed).permutation(len(rows))
    if HELD_PROMPTS + n_pairs > len(rows):
        raise SystemExit(f"{dataset} has {len(rows)} rows: at most {len(rows) - HELD_PROMPTS} pairs")
    pairs = [{"prompt": f"{rows[i][0]}\nQuestion: {rows[i][1]}\nAnswer:",
              "completion": " yes" if rows[i][2] else " no"} for i in perm]
    return pairs[HELD_PROMPTS:HELD_PROMPTS + n_pairs], [p["prompt"] for p in pairs[:HELD_PROMPTS]]


def tally(truth: list[str], top: list[str | None], none: list[bool]) -> dict[str, Any]:
    """Per completion task: top-1 share, answered right, "none", the other tops; and the text prompts' top-1."""
    out: dict[str, Any] = {}
    t, n = np.array(truth, dtype=object), np.array(none, dtype=bool)
    tops = np.array(top, dtype=object)
    for ds in COMPLETION_SETS:
        mine = t == ds
        hit = tops[mine] == ds
        out[ds] = {"top1": float(hit.mean()), "right": float((hit & ~n[mine]).mean()), "none": float(n[mine].mean()),
                   "elsewhere": Counter(str(x) for x in tops[mine][~hit]).most_common(3)}
    text = ~np.isin(t, COMPLETION_SETS)
    out["text_top1"] = float((tops[text] == t[text]).mean())
    return out


def _route(atlas: Any, prompts: list[tuple[str, str]]) -> dict[str, Any]:
    answers = atlas.route([p for _, p in prompts], k=3)
    return tally([t for t, _ in prompts], [a.matches[0].name if a.matches else None for a in answers],
                 [bool(a.none) for a in answers])


def _minilm(encoder: Any, centroids: dict[str, np.ndarray], prompts: list[tuple[str, str]]) -> dict[str, Any]:
    """The MiniLM centroid router's answers, tallied; ``centroids``: each task's mean embedding (its samples')."""
    names = sorted(centroids)
    cents = np.stack([centroids[n] for n in names])
    cents /= np.linalg.norm(cents, axis=1, keepdims=True)
    best = (encoder.encode([p for _, p in prompts]) @ cents.T).argmax(1)
    return tally([t for t, _ in prompts], [names[j] for j in best], [False] * len(prompts))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.quality.embed import MiniLMEncoder
    from fisher_atlas import Atlas

    families = {k: v for k, v in family_tasks().items()
                if k not in TWIN_FAMILIES and len(v) >= args.signature + args.heldout}
    encoder = MiniLMEncoder()
    product = {"model": args.model, "device": args.device, "torch_threads": args.threads,
               "sketch_dim": args.m, "max_tokens_per_sample": args.max_tokens}
    draws: list[dict[str, Any]] = []
    for d in range(args.draws):
        rng = np.random.default_rng(4000 + 1000 * args.seeds[0] + d)
        sig, held = {}, {}
        for t in sorted(families):
            sig[t], held[t] = split_texts(families[t], args.signature, args.heldout, rng)
        draw: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            with Atlas(tmp, **product) as atlas:
                for t in sorted(families):
                    atlas.add(t, sig[t], progress=False)
            text_centroids = {t: encoder.encode(sig[t]).mean(0) for t in sorted(families)}  # once per draw
            for n_pairs in dict.fromkeys((args.pairs, args.more_pairs)):
                centroids = dict(text_centroids)
                prompts = [(t, p) for t in sorted(families) for p in held[t]]
                with Atlas(tmp, **product) as atlas:
                    for k, ds in enumerate(COMPLETION_SETS):
                        pairs, held_prompts = completion_pairs(ds, 7000 + 100 * d + k, n_pairs)
                        if ds in {t.name for t in atlas.tasks()}:
                            atlas.delete(ds)
                        atlas.add(ds, pairs, mode="completion", progress=False)
                        centroids[ds] = encoder.encode([p["prompt"] for p in pairs]).mean(0)
                        prompts += [(ds, p) for p in held_prompts]
                    rows = {"product": _route(atlas, prompts)}
                with Atlas(tmp, route_lexical=False, **product) as plain:
                    rows["without_lexical"] = _route(plain, prompts)
                rows["minilm"] = _minilm(encoder, centroids, prompts)
                draw[str(n_pairs)] = rows
                log(f"draw {d}, {n_pairs} pairs: " + "; ".join(
                    f"{name} " + " / ".join(f"{r[ds]['top1']:.2f}" for ds in COMPLETION_SETS) +
                    f" (text {r['text_top1']:.2f})" for name, r in rows.items()))
        draws.append(draw)
    return {"draws": draws, "families": sorted(families), "pairs": list(dict.fromkeys((args.pairs, args.more_pairs))),
            "lm": load_model(args)}


ROWS = {"product": "FisherAtlas (product, library defaults)",
        "without_lexical": "FisherAtlas without lexical evidence (`route_lexical=False`, same store)",
        "minilm": "all-MiniLM-L6-v2 centroid (no open set)"}


def render(res: dict[str, Any], facts: str) -> str:
    draws = res["draws"]
    head = ("| pairs per task | Router | " + " | ".join(f"{ds}: top-1 / answered right / none" for ds in
                                                      COMPLETION_SETS) + " | text tasks' top-1 |\n"
            "|---:|:---|" + "---:|" * (len(COMPLETION_SETS) + 1) + "\n")
    body = ""
    for n_pairs in res["pairs"]:
        for key, label in ROWS.items():
            rows = [d[str(n_pairs)][key] for d in draws]

            def med(ds: str, m: str, rows: list[dict[str, Any]] = rows) -> float:
                return float(np.median([r[ds][m] for r in rows]))
            cells = " | ".join(f"{pct(med(ds, 'top1'))} / {pct(med(ds, 'right'))} / {med(ds, 'none'):.2f}"
                               for ds in COMPLETION_SETS)
            body += (f"| {n_pairs} | {label} | {cells} | "
                     f"{pct(float(np.median([r['text_top1'] for r in rows])))} |\n")
    where = "\n".join(f"- draw {i}, {n} pairs, product: " + "; ".join(
        f"{ds} → {', '.join(f'{t} ({c})' for t, c in d[str(n)]['product'][ds]['elsewhere']) or '-'}"
        for ds in COMPLETION_SETS) for i, d in enumerate(draws) for n in res["pairs"])
    return (f"{len(res['families'])} text tasks, one per data family ({', '.join(res['families'])}), beside BoolQ, RTE "
            f"and CB as completion tasks; {HELD_PROMPTS} held-out prompts per completion task, {len(draws)} draws "
            f"(medians).\n\n{head}{body}\n{where}\n\n{facts}")


def main() -> None:
    """Command-line entry point."""
    p = family_parser(__doc__.split("\n")[0], draws=2)
    p.add_argument("--pairs", type=int, default=64, help="prompt/completion pairs per completion task")
    p.add_argument("--more-pairs", type=int, default=150, help="a second size, in the same store")
    args = p.parse_args()
    if args.quick:
        args.draws, args.signature, args.heldout, args.pairs, args.more_pairs = 1, 24, 4, 16, 16
    run_and_report("completion_families", "4g. Completion-mode tasks in a space of data families (issue 13)", args,
                   run, render, lambda res: {"text samples": args.signature, "pairs": res["pairs"],
                                             "max_tokens": args.max_tokens})


if __name__ == "__main__":
    main()
