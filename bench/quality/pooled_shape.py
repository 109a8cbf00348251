"""An offline study, not the product: route thresholds from a shape pooled over the space (benches 4d / 4e).

The product holds each task to a lower tolerance bound of its own ~32 held-out route scores (90 % confidence,
docs/SCORES.md). Bench 4d's landing table shows those thresholds far below the tasks' own prompts' 5 % quantiles
(reviews −0.006 against 0.089, wikipedia 0.004 against 0.151): a 2.5 % quantile of 32 heavy-tailed scores is their
minimum, and a normal bound widened by a tail inflates the spread. This study replays, on the product's own answers,
thresholds that keep each task's *location and scale* but take the *shape* (the standardized quantile) from every
task's held-out scores pooled — a location-scale model: thousands of standardized scores estimate a 2.5 % quantile
that 32 cannot.

Per draw (the splits of :mod:`bench.quality.openset_families`): the product is built through the library, every
held-out prompt routed (all indexed tasks' matches), and the space exported; the answers, flags and each task's
held-out scores are saved, then replayed under each rule. A task tested for novelty (every task here: 100 samples)
is held to its route rule at half the rate, as the product does.

Each rule is replayed at several false-reject rates (``--rates``): a rule that only moves along the trade-off
curve of the shipped one (more "none" on unseen prompts for more on indexed ones) is a choice of rate, not a better
test. Reading: bench/RESULTS.md, 4d ("Route thresholds on a pooled shape").

Run: ``python -m bench.quality.pooled_shape --threads 2`` (4d, ~5 min on 2 cores) or ``--indexed 6`` (4e, ~2.5
min); ``--load FILE`` replays a saved run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from atlas.route_calibration import FALSE_REJECT_RATE, calibrate, split_rates
from bench.quality.common import log
from bench.quality.openset_families import family_tasks, split_texts
from bench.quality.paths import OUT_DIR


def _standardize(x: np.ndarray, how: str) -> tuple[float, float]:
    """Location and scale of one task's held-out scores."""
    if how == "sd":
        return float(x.mean()), float(max(x.std(ddof=1), 1e-3))
    med = float(np.median(x))
    if how == "mad":
        return med, float(max(1.4826 * np.median(np.abs(x - med)), 1e-3))
    q1, q3 = np.quantile(x, [0.25, 0.75])
    return med, float(max((q3 - q1) / 1.349, 1e-3))


def thresholds(cal: dict[str, list[float]], rule: str, rate: float) -> dict[str, float]:
    """Each task's route threshold at ``rate`` under ``rule``.

    ``product`` the shipped tolerance bound; ``conformal`` the task's own split-conformal quantile (``-1`` when it
    does not exist); ``shape-<sd|mad|iqr>`` the task's location plus its scale times the ``rate`` quantile of every
    task's standardized scores pooled."""
    if rule == "product":
        out = {t: calibrate(s, rate).threshold for t, s in cal.items()}
        return {t: (-1.0 if v is None else v) for t, v in out.items()}
    if rule == "conformal":
        res = {}
        for t, s in cal.items():
            x = np.sort(np.asarray(s))
            k = int(np.floor((len(x) + 1) * rate))  # the k-th smallest: P(new < it) ≤ rate on average
            res[t] = float(x[k - 1]) if k >= 1 else -1.0
        return res
    how = rule.split("-", 1)[1]
    params = {t: _standardize(np.asarray(s), how) for t, s in cal.items() if len(s) >= 5}
    pooled = np.concatenate([(np.asarray(cal[t]) - lo) / sc for t, (lo, sc) in params.items()])
    z = float(np.quantile(pooled, rate))
    return {t: params[t][0] + params[t][1] * z if t in params else -1.0 for t in cal}


RULES = ("product", "conformal", "shape-sd", "shape-mad", "shape-iqr")
RATES = (0.02, 0.03, 0.05, 0.07, 0.10)


def replay(draw: dict[str, Any], rule: str, rate: float = FALSE_REJECT_RATE) -> dict[str, float]:
    """One draw's rates with the answered task's route threshold taken by ``rule`` (the product's template,
    novelty and nearest-task rejections kept as they were)."""
    route_rate = split_rates(rate)[0]
    thr = thresholds(draw["cal"], rule, route_rate)
    unseen = set(draw["unseen"])
    none_u, none_i, right, own_fr = [], [], [], []
    for r in draw["records"]:
        other = r["template"] or r["novelty"] or r["nearest"]
        below = r["top"] is None or r["score"] is None or r["score"] < thr.get(r["top"], -1.0)
        none = bool(other or below)
        if r["task"] in unseen:
            none_u.append(none)
        else:
            none_i.append(none)
            right.append(not none and r["top"] == r["task"])
            if r["top"] == r["task"]:
                own_fr.append(none)
    return {"none_unseen": float(np.mean(none_u)), "none_indexed": float(np.mean(none_i)),
            "right": float(np.mean(right)), "own_top_none": float(np.mean(own_fr))}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from fisher_atlas import Atlas

    tasks = {k: v for k, v in family_tasks().items() if len(v) >= args.signature + args.heldout}
    names = sorted(tasks)
    n_unseen = len(names) - args.indexed if args.indexed else max(1, round(0.2 * len(names)))
    draws = []
    for d in range(args.draws):
        rng = np.random.default_rng(1000 + d)  # bench 4d's draws (seed 0)
        sig, held = {}, {}
        for t in names:
            sig[t], held[t] = split_texts(tasks[t], args.signature, args.heldout, rng)
        unseen = sorted(rng.choice(names, size=n_unseen, replace=False).tolist())
        indexed = [t for t in names if t not in unseen]
        with tempfile.TemporaryDirectory() as tmp, Atlas(tmp, torch_threads=args.threads) as atlas:
            for t in indexed:
                atlas.add(t, sig[t], progress=False)
            prompts = [(t, p) for t in indexed + unseen for p in held[t]]
            answers = atlas.route([p for _, p in prompts], k=len(indexed))
            export = Path(tmp) / "space.jsonl"
            atlas.export(export)
            cal = {}
            for line in export.read_text(encoding="utf-8").splitlines():
                rec = json.loads(line)
                if "name" not in rec:  # the header and the trailer
                    continue
                cal[rec["name"]] = [float(x) for x in ((rec.get("routing") or {}).get("cal_scores") or [])]
        records = []
        for (t, _), a in zip(prompts, answers, strict=True):
            records.append({"task": t, "top": a.matches[0].name if a.matches else None, "none": a.none,
                            "score": a.best_score, "threshold": a.threshold, "nearest": a.nearest_rejects,
                            "template": a.template_rejects, "novelty": a.novelty_rejects,
                            "reason": None if a.rejected_by is None else a.rejected_by.reason,
                            "matches": [[m.name, m.score, m.rank_score, m.lexical, m.activation] for m in a.matches]})
        draw = {"unseen": unseen, "indexed": indexed, "records": records, "cal": cal}
        draws.append(draw)
        log(f"draw {d}: " + "; ".join(f"{rule} {replay(draw, rule)['none_unseen']:.3f}" for rule in RULES))
    return draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--signature", type=int, default=100)
    parser.add_argument("--heldout", type=int, default=20)
    parser.add_argument("--indexed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load", type=Path, help="replay a saved run instead of running the product")
    parser.add_argument("--rates", type=float, nargs="+", default=list(RATES))
    args = parser.parse_args()
    out = OUT_DIR / f"pooled_shape_{args.indexed or 'all'}.json"
    if args.load:
        draws = json.loads(args.load.read_text())
    else:
        draws = run(args)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(draws))
    print(table(draws, args.rates))
    if all("matches" in r for d in draws for r in d["records"]):
        print()
        print(separation(draws))


STATISTICS = ("route score", "rank score", "lexical score", "activation cosine", "route score margin",
              "route score minus the task's threshold")


def _statistics(record: dict[str, Any]) -> list[float]:
    """A prompt's answer read as "none" scores (higher: more like an indexed task's prompt), in ``STATISTICS``
    order: of its top match unless said otherwise; the margin is over the best route score of any other task."""
    m = record["matches"]
    route = [x[1] for x in m]
    rest = max(route[1:], default=route[0] - 1.0)
    return [m[0][1], m[0][2] if m[0][2] is not None else -2.0, m[0][3] or 0.0, m[0][4], m[0][1] - rest,
            m[0][1] - (record["threshold"] or 0.0)]


def separation(draws: list[dict[str, Any]]) -> str:
    """Markdown rows: AUROC between indexed and unseen tasks' prompts of each statistic of the answer, and of a
    logistic regression on all of them fitted on the other draws (leave one draw out); means over the draws."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    data = []
    for d in draws:
        rows = [r for r in d["records"] if r.get("matches")]
        data.append((np.array([_statistics(r) for r in rows]), np.array([r["task"] not in d["unseen"] for r in rows])))
    aucs = [[roc_auc_score(y, x[:, j]) for x, y in data] for j in range(len(STATISTICS))]
    combined = []
    for i, (x, y) in enumerate(data):
        fit_x = np.concatenate([xx for j, (xx, _) in enumerate(data) if j != i])
        fit_y = np.concatenate([yy for j, (_, yy) in enumerate(data) if j != i])
        combined.append(roc_auc_score(y, LogisticRegression(max_iter=2000).fit(fit_x, fit_y).decision_function(x)))
    lines = ["| statistic of the answer | AUROC, indexed vs unseen prompts |", "|:---|---:|"]
    lines += [f"| {name} | {float(np.mean(a)):.3f} |" for name, a in zip(STATISTICS, aucs, strict=True)]
    lines.append(f"| logistic regression on all of them (fitted on the other draws) | {float(np.mean(combined)):.3f} |")
    return "\n".join(lines)


def table(draws: list[dict[str, Any]], rates: list[float]) -> str:
    """Markdown rows: each rule at each rate, the means over the draws of "none" on unseen and on indexed prompts,
    indexed prompts answered right, and "none" on indexed prompts whose top match is their own task."""
    lines = ["| rule | rate | none on unseen | none on indexed | answered right | none, own task on top |",
             "|:---|---:|---:|---:|---:|---:|"]
    for rule in RULES:
        for rate in rates:
            rows = [replay(d, rule, rate) for d in draws]
            mean = [float(np.mean([r[k] for r in rows])) for k in ("none_unseen", "none_indexed", "right",
                                                                    "own_top_none")]
            lines.append(f"| {rule} | {rate:.0%} | {mean[0]:.3f} | {mean[1]:.3f} | {mean[2]:.1%} | {mean[3]:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
