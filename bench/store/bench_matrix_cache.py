"""Alignment matrices and the atlas map, computed and from the cache (``atlas.services.queries``).

Usage::

    python -m bench.store.bench_matrix_cache --tasks 64 128 256 --repeats 5 --out bench/results/store.md

The dashboard asks for a space's map and a matrix at every view; each was computed from every task's stored state on
every request. They are now kept per set of states (task ids and content digests), so a repeat costs the reads of
the states (from the state cache) and a copy. Each run: a fresh SQLite store through the library (no model), ``n``
ready tasks of random states at the bundled model's shape (d = 256, K = 8192, m = 4096), then ``QueryService.matrix``
and ``.atlas`` timed on a cold cache (cleared before each) and warm; medians in ms, printed as one Markdown table.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _timed(fn: Callable[[], Any], repeats: int, before: Callable[[], None] | None = None) -> float:
    """Median ms of ``fn`` over ``repeats`` calls (``before`` run, untimed, before each)."""
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def run(n: int, repeats: int) -> dict[str, float]:
    """Cold and warm medians (ms) of the matrix of ``n`` tasks and of the map of a space of ``n`` tasks."""
    from atlas import repository
    from fisher_atlas import Atlas
    from fishersketch import SketchSpec, SketchState

    spec = SketchSpec(d=256, K=8192, m=4096)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp, Atlas(Path(tmp) / "a", require_model=False) as atlas:
        c = atlas._c
        store = c.require_store()
        with store.session() as s:
            space = repository.get_or_create_space(
                s, model_fingerprint="bench", spec_fingerprint=spec.fingerprint(), model_name="bench",
                d=spec.d, K=spec.K, m=spec.m, seed=spec.seed, spec=spec.to_dict())
            ids = []
            for i in range(n):
                sums = rng.standard_normal((2, 3, spec.m))
                state = SketchState(spec, sums, (sums**2).sum(-1) * 2 + 1, np.array([300, 300]), np.array([30, 30]))
                task = repository.create_ready_task(s, space.id, f"t{i}", "text", {}, state=state.to_bytes(),
                                                    signature=state.signature(), baselines=None, n_samples=60,
                                                    n_tokens=600)
                ids.append(int(task.id))
            space_id = int(space.id)
        queries = c.queries
        clear = queries._analyses.clear
        queries.matrix(ids)  # the state cache warm: what is timed is the matrix, not the first read of the blobs
        return {
            "matrix cold": _timed(lambda: queries.matrix(ids), repeats, clear),
            "matrix warm": _timed(lambda: queries.matrix(ids), repeats),
            "map cold": _timed(lambda: queries.atlas(str(space_id)), repeats, clear),
            "map warm": _timed(lambda: queries.atlas(str(space_id)), repeats),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="Append the table to this Markdown file.")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rows = ["| tasks | matrix, computed | matrix, cached | map, computed | map, cached |", "|---:|---:|---:|---:|---:|"]
    for n in args.tasks:
        r = run(n, args.repeats)
        rows.append(f"| {n} | {r['matrix cold']:.0f} ms | {r['matrix warm']:.1f} ms | {r['map cold']:.0f} ms | "
                    f"{r['map warm']:.1f} ms |")
    text = "\n".join([
        "", "## Alignment matrices and the atlas map from the cache", "",
        f"- Command: `python -m bench.store.bench_matrix_cache --tasks {' '.join(map(str, args.tasks))} "
        f"--repeats {args.repeats}`",
        f"- Machine: {platform.processor() or platform.machine()}, {args.threads} torch threads; "
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "- Medians; the states are read through the state cache either way (warm before timing).", "", *rows, ""])
    print(text)
    if args.out is not None:
        with args.out.open("a", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
