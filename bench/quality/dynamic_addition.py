"""Experiment 5 — dynamic addition (paper: "Dynamic addition", tab:dynamic-addition).

Start from the routing index of experiment 4 (101 tasks; loaded from its cache when the settings
match, else built), then add the four tasks it left out — the paper's themes code, medical, legal,
math (:data:`bench.quality.routing_setup.NEW_TASKS`) — one at a time: sketch its signature samples with the
product's Extractor (one streaming pass, no retraining), append the unit signature to the FAISS index
and the state to the store. Report, per new task, the held-out routing accuracy (30 held-out prompts
per new task as in the paper, when the task has enough rows) against the full 105-task index, and the
seconds to add it. The embedding router is open-set too (append utterance embeddings), so its accuracy
and add time are reported beside. Old tasks' held-out top-1 before and after the addition shows what
the new entries take from them.

Run: ``python -m bench.quality.dynamic_addition`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import faiss
import numpy as np

from atlas.samples import Sample
from bench.quality import report
from bench.quality.common import (
    extract_task,
    log,
    make_extractor,
    make_sketcher,
    pct,
    run_and_report,
)
from bench.quality.routing import PRODUCT_ROW, accuracy, route_all
from bench.quality.routing_setup import (
    N_HELDOUT,
    NEW_TASKS,
    build_index,
    calibration_states,
    load_encoder,
    parse_routing_args,
    prompt_features,
    routing_settings,
    task_splits,
    task_terms,
    typicals,
)

N_HELDOUT_NEW = 30
PAPER = {"code": ("100% (30/30)", "4.7s"), "medical": ("100% (30/30)", "4.8s"), "legal": ("100% (30/30)", "4.6s"),
         "math": ("100% (30/30)", "4.7s")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build/load the base index, add the new tasks, route; returns the raw results."""
    from bench.quality.common import load_model

    lm = load_model(args)
    encoder = load_encoder(args)
    held = {n: N_HELDOUT_NEW for n in NEW_TASKS.values()}
    splits = task_splits(args.seeds[0], args.n_signature, held)
    base_names = [n for n in splits if n not in NEW_TASKS.values()]
    if args.quick:
        base_names = base_names[::10]
    index = build_index(args, lm, base_names, splits, encoder)
    old_feats, _ = prompt_features(args, lm, {n: index.heldout[n] for n in base_names}, encoder)
    cal = calibration_states(args, lm, base_names, splits) | calibration_states(args, lm, list(NEW_TASKS.values()),
                                                                                splits)
    typical = list(typicals(index.states, [cal[n] for n in base_names]))
    before = {k: accuracy(index, old_feats, v) for k, v in route_all(index, old_feats, np.array(typical)).items()}

    sketcher = make_sketcher(lm, args.m, args.seeds[0])
    extractor = make_extractor(lm, sketcher, args)
    flat = faiss.IndexFlatIP(args.m)
    flat.add(index.signatures())
    added: dict[str, dict[str, Any]] = {}
    for theme, name in NEW_TASKS.items():
        samples = [Sample(text=x.input) for x in splits[name][0]]
        t = time.perf_counter()
        sig = extract_task(extractor, name, samples, "text")
        vec = sig.state.signature().astype(np.float32)[None, :]
        flat.add(vec)
        fs_seconds = time.perf_counter() - t
        index.names.append(name)
        index.states.append(sig.state)
        typical.extend(typicals([sig.state], [cal[name]]))  # the job's calibration, as the service stores it
        index.mean_hidden = np.vstack([index.mean_hidden, sig.baselines.mean_hidden()])
        index.last_hidden = np.vstack([index.last_hidden, sig.baselines.last_hidden()])
        index.heldout[name] = [x.input for x in splits[name][1]]
        index.terms.extend(task_terms([name], splits))
        mini_seconds = None
        if encoder is not None:
            t = time.perf_counter()
            index.minilm.append(encoder.encode([x.input for x in splits[name][0]]))
            mini_seconds = time.perf_counter() - t
        added[name] = {"theme": theme, "seconds": fs_seconds, "minilm_seconds": mini_seconds,
                       "n_signature": sig.n_samples, "tokens": sig.tokens, "n_heldout": len(splits[name][1])}
        log(f"added {theme} ({name}): {fs_seconds:.2f}s, {sig.n_samples} samples, {sig.tokens} tokens; "
            f"FAISS size {flat.ntotal}")
    new_feats, _ = prompt_features(args, lm, {n: index.heldout[n] for n in NEW_TASKS.values()}, encoder)
    new_tops = route_all(index, new_feats, np.array(typical))
    per_task: dict[str, dict[str, tuple[float, float, int]]] = {}
    pos = {n: i for i, n in enumerate(index.names)}
    for router, tops in new_tops.items():
        per_task[router] = {}
        for name in NEW_TASKS.values():
            sel = [i for i, f in enumerate(new_feats) if f.task == name]
            hits1 = sum(tops[i][0] == pos[name] for i in sel)
            hits3 = sum(pos[name] in tops[i][:3] for i in sel)
            per_task[router][name] = (hits1 / len(sel), hits3 / len(sel), len(sel))
    after = {k: accuracy(index, old_feats, v) for k, v in route_all(index, old_feats, np.array(typical)).items()}
    for k in after:
        log(f"old tasks {k}: top-1 {before[k][0]:.3f} -> {after[k][0]:.3f}")
    return {"base_tasks": len(base_names), "added": added, "per_task": per_task, "old_before": before,
            "old_after": after, "lm": lm}


def render(res: dict[str, Any], facts: str) -> str:
    """Markdown for ``quality.md``."""
    added = res["added"]
    fs = res["per_task"]["FisherSketch (signature cosine, paper rule)"]
    rr = res["per_task"][PRODUCT_ROW]
    rows = []
    for name, a in added.items():
        t1, t3, n = fs[name]
        p = PAPER[a["theme"]]
        rows.append([f"{a['theme']} ({name})", f"{pct(t1)} ({round(t1 * n)}/{n})", pct(t3),
                     f"{pct(rr[name][0])}", f"{a['seconds']:.2f}s ({a['n_signature']} samples, {a['tokens']} tokens)",
                     *p])
    t = report.table(["New task", "Held-out top-1 (FisherSketch)", "top-3", "top-1 (product re-rank)",
                      "Time to add", "paper Acc.", "paper Time"], rows)
    other = []
    for router, per in res["per_task"].items():
        accs = [per[n][0] for n in added]
        other.append([router, *[pct(per[n][0]) for n in added], pct(float(np.mean(accs))),
                      pct(res["old_before"][router][0]), pct(res["old_after"][router][0])])
    mini = [a["minilm_seconds"] for a in added.values() if a["minilm_seconds"] is not None]
    t2 = report.table(["Router", *[a["theme"] for a in added.values()], "mean (new)", "old tasks top-1 before",
                       "old tasks top-1 after"], other)
    return (
        "Paper: Table `tab:dynamic-addition` (4 domains added to a 674-domain index, Llama-3.1-8B on an A100, "
        f"200 samples each, 30 held-out prompts). Ours: 4 tasks added to the {res['base_tasks']}-task index of "
        "experiment 4; time to add = extraction of the signature samples + signature + FAISS append, on this CPU.\n\n"
        + t + "\n\nAll routers on the new tasks' held-out prompts (top-1), and the old tasks' held-out top-1 before "
        "and after the 4 additions:\n\n" + t2 + "\n\n"
        + (f"The embedding router's add time (encoding the utterances): "
           f"{', '.join(f'{s:.2f}s' for s in mini)}.\n\n" if mini else "") + facts
    )


def main() -> None:
    """Command-line entry point."""
    args = parse_routing_args(__doc__.split("\n")[0])
    run_and_report("dynamic_addition", "5. Dynamic addition (paper: Dynamic addition)", args, run, render,
                   lambda res: {**routing_settings(args),
                                "held-out prompts": f"{N_HELDOUT_NEW} per new task, {N_HELDOUT} per old task"})


if __name__ == "__main__":
    main()
