"""The route path's novelty model: its re-fit cost as a space grows (the product vs the whole-space fit before).

Usage::

    python -m bench.store.bench_novelty_fit --tasks 100 400 1000 4000 --before-max 1000

After any add, append or delete in a space, the next route batch re-fits the space's novelty model
(:class:`atlas.novelty.NoveltyCache`; at most every 30 s from 512 tasks up). Until 2026-11-28 the fit read every
task's 128 vectors and kept each task's per-fold second moments (folds × r × r float64: 2.6 MiB a task at
r = 256), so its memory and time grew with the space (``before``, re-implemented here exactly as it was). The
product fits the covariance on at most :data:`atlas.novelty.NOVELTY_FIT_TASKS` tasks, evenly spaced, with
O(T·folds·r) memory, and calibrates any other task on its first use (one read of its vectors, kept). Synthetic
vectors (128 per task, r = 256, float32 as stored); peak Python memory by ``tracemalloc``; medians of
``--repeats``. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from atlas.novelty import (
    FOLDS,
    MAX_NOVELTY_SAMPLES,
    NOVELTY_DIM,
    NOVELTY_FIT_TASKS,
    RIDGE,
    NoveltyCache,
    _inverse_root,
)

R = NOVELTY_DIM


def before_fit(vectors: Mapping[int, np.ndarray], folds: int = FOLDS, ridge: float = RIDGE) -> dict[int, float]:
    """The fit as it was until 2026-11-28 (per-task fold moments kept; every task of the space): each task's 95 %
    threshold."""
    groups = {t: np.asarray(x, dtype=np.float64) for t, x in vectors.items()}
    r = next(iter(groups.values())).shape[1]
    fold_of = {t: np.arange(len(x)) % folds for t, x in groups.items()}
    sums = {t: np.stack([x[fold_of[t] == f].sum(0) for f in range(folds)]) for t, x in groups.items()}
    moments = {t: np.stack([x[fold_of[t] == f].T @ x[fold_of[t] == f] for f in range(folds)])
               for t, x in groups.items()}
    counts = {t: np.bincount(fold_of[t], minlength=folds) for t in groups}

    def fit_without(skip: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        scatter, mus, dof = np.zeros((r, r)), {}, 0
        keep = np.arange(folds) != skip
        for t in groups:
            n = int(counts[t][keep].sum())
            mu = sums[t][keep].sum(0) / n
            scatter += moments[t][keep].sum(0) - n * np.outer(mu, mu)
            mus[t], dof = mu, dof + n - 1
        return _inverse_root(scatter, dof, ridge), mus

    fit_without(-1)
    own: dict[int, list[float]] = {t: [] for t in groups}
    for f in range(folds):
        w_f, mus_f = fit_without(f)
        for t, x in groups.items():
            held = x[fold_of[t] == f]
            own[t].extend((((held - mus_f[t]) @ w_f) ** 2).sum(1) / r)
    return {t: float(np.quantile(v, 0.95)) for t, v in own.items()}


def _measure(run: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(median seconds, peak MiB of the last run)."""
    times = []
    for _ in range(repeats):
        tracemalloc.start()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return statistics.median(times), peak


def _row(n_tasks: int, before_max: int, repeats: int) -> str:
    """One table row: a space of ``n_tasks`` tasks."""
    rng = np.random.default_rng(n_tasks)
    centres = rng.standard_normal((n_tasks, R)).astype(np.float32)
    vectors = {t: centres[t] + rng.standard_normal((MAX_NOVELTY_SAMPLES, R)).astype(np.float32)
               for t in range(n_tasks)}

    def load(ids: list[int]) -> dict[int, np.ndarray]:
        return {t: vectors[t] for t in ids}

    def product() -> Any:
        return NoveltyCache().get(1, 0, lambda: list(range(n_tasks)), load)

    fit_s, fit_mib = _measure(product, repeats)
    model = product()
    assert model is not None
    sample = set(np.linspace(0, n_tasks - 1, NOVELTY_FIT_TASKS).round().astype(int).tolist())
    lazy = [t for t in range(n_tasks) if t not in sample][:20]
    first = []
    for t in lazy:
        t0 = time.perf_counter()
        model.threshold(t)
        first.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for t in lazy:
        model.threshold(t)
    warm_us = (time.perf_counter() - t0) / max(1, len(lazy)) * 1e6
    if n_tasks <= before_max:
        b_s, b_mib = _measure(lambda: before_fit(vectors), repeats)
        before = f"{b_s:.2f} s, {b_mib:,.0f} MiB"
    else:
        before = f"not run (≥ {2.6 * n_tasks:,.0f} MiB of moments)"
    first_ms = f"{statistics.median(first) * 1e3:.1f} ms" if first else "– (all in the sample)"
    return f"| {n_tasks:,} | {before} | {fit_s:.2f} s, {fit_mib:,.0f} MiB | {first_ms} | {warm_us:.0f} µs |"


def run(tasks: list[int], before_max: int, repeats: int) -> str:
    """The Markdown table."""
    head = ("| tasks in the space | re-fit before (every task) | re-fit now (≤ 256-task sample) | "
            "a task's first use (read + calibrate) | a calibrated task's threshold |\n|---:|---:|---:|---:|---:|")
    return head + "\n" + "\n".join(_row(n, before_max, repeats) for n in tasks)


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, nargs="+", default=[100, 400, 1000, 4000])
    p.add_argument("--before-max", type=int, default=1000, help="largest space the old fit is run on")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(run(args.tasks, args.before_max, args.repeats))


if __name__ == "__main__":
    main()
