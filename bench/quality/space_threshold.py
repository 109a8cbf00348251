"""An offline replay, not the product: one open-set threshold for a whole space (benches 4b and 4d/4e).

The product holds each task to its own calibrated thresholds (docs/SCORES.md, "Open set: thresholds"). These
helpers replay the alternative measured in bench 4d's reading: one threshold for the space, the ``rate`` quantile
of its tasks' pooled held-out route scores (no labels), applied to the answered task's route score.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bench.quality.common import pct


def space_threshold(pooled: Iterable[float], rate: float) -> float:
    """The ``rate`` quantile of a space's pooled held-out route scores (−1, accepting everything, when there are
    none)."""
    scores = np.asarray(list(pooled), dtype=np.float64)
    return float(np.quantile(scores, rate)) if scores.size else -1.0


def pooled_held_out_scores(export: Any) -> list[float]:
    """Every task's held-out route scores (``cal_scores``) in a space export, pooled."""
    pooled: list[float] = []
    for line in Path(export).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        routing = record.get("routing") if isinstance(record, dict) else None
        pooled += [float(x) for x in (routing or {}).get("cal_scores") or []]
    return pooled


def space_threshold_rates(records: list[dict[str, Any]], unseen: list[str], pooled: list[float], rate: float
                          ) -> dict[str, Any]:
    """An offline replay, not the product: one threshold for the whole space, the ``rate`` quantile of its tasks'
    pooled held-out scores (no labels), on the answered task's route score — alone, and added to the product's rules
    (a prompt is "none" when either says so). The per-task thresholds promise each task its rate; this one promises
    the space's prompts theirs on average, so a loose task loses more of its own and takes fewer foreign ones."""
    g = space_threshold(pooled, rate)
    out: dict[str, Any] = {"threshold": g}
    for key, none_of in (("alone", lambda r: r["score"] is None or r["score"] < g),
                         ("with_product", lambda r: r["none"] or r["score"] is None or r["score"] < g)):
        foreign = [none_of(r) for r in records if r["task"] in unseen]
        indexed = [(none_of(r), r["top"] == r["task"]) for r in records if r["task"] not in unseen]
        out[key] = {"none_unseen": float(np.mean(foreign)), "none_indexed": float(np.mean([n for n, _ in indexed])),
                    "right": float(np.mean([not n and ok for n, ok in indexed]))}
    return out


def space_rows(draws: list[dict[str, Any]]) -> str:
    """The rows of :func:`space_threshold_rates` (absent from older result files)."""
    if any("space_threshold" not in d for d in draws):
        return ""
    keys = ("none_unseen", "none_indexed", "right")
    out = ""
    for key, label in (("alone", "one space threshold alone"), ("with_product", "the product's rules + one space "
                                                                                  "threshold")):
        cols = [float(np.median([d["space_threshold"][key][k] for d in draws])) for k in keys]
        out += (f"| replay, not the product: {label} — the 5 % quantile of the indexed tasks' pooled held-out route "
                f"scores, on the answered task's route score (no labels) | {cols[0]:.3f} | {cols[1]:.3f} | "
                f"{pct(cols[2])} | – |\n")
    return out
