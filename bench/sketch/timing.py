"""The paper's timing table: exact versus sketched Fisher alignment of 5 synthetic tasks.

Setup as in the paper (Appendix "Linear-Time Head Fisher Alignment", Table "Wall-clock timing"):
5 tasks, d = 256, K = 100, m = 4096, n = 50 … 2000 tokens per task. All pairwise alignments
(15 task blocks including the diagonal) by three methods, in one run:

* **naive**: the paper's per-pair loop (``exact_matrix_naive``, Python loop over token pairs, float64);
  it stops at the first n whose run exceeds ``--naive-limit`` seconds and larger n are extrapolated
  from the log-log slope of the measured points (marked "extrap.");
* **exact GEMM**: ``exact_matrix`` — tiled Gram-matrix products, float64;
* **sketch**: ``Sketcher.update`` of the 5 tasks + ``align_matrix`` (projections drawn once, outside
  the timing; their one-off cost is reported separately).

Sizes beyond the paper's 2000 (default 4000, 8000) are there to locate the crossover with the GEMM
exact.

Usage::

    nice -n 5 python -m bench.sketch.timing [--repeats 3] [--naive-limit 60]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench.sketch._common import table, timeit, write_section
from fishersketch import Sketcher, SketchSpec, SketchState, align_matrix, exact_matrix, exact_matrix_naive
from fishersketch.synthetic import make_tasks

D, K, M, T = 256, 100, 4096, 5
PAPER = {50: (0.16, 0.11), 100: (0.62, 0.17), 200: (2.50, 0.30), 500: (15.6, 0.68), 1000: (62.3, 1.31),
         2000: (247.4, 2.78)}


def _slope(ns: list[int], ts: list[float]) -> float:
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0])


def _crossover(ns: list[int], t_a: list[float], t_b: list[float]) -> str:
    """Smallest n (log-interpolated) from which method b is faster than method a."""
    diff = np.log(np.array(t_a)) - np.log(np.array(t_b))  # > 0 where b is faster
    for k in range(len(ns)):
        if diff[k] > 0 and np.all(diff[k:] > 0):
            if k == 0:
                return f"≤ {ns[0]}"
            x0, x1 = np.log(ns[k - 1]), np.log(ns[k])
            x = x0 + (x1 - x0) * (-diff[k - 1]) / (diff[k] - diff[k - 1])
            return f"≈ {np.exp(x):.0f}"
    return f"> {ns[-1]} (not reached)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50,100,200,500,1000,2000,4000,8000",
                        help="n per task; sizes beyond 2000 locate the crossover (not in the paper's table)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-limit", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time (robust on a shared machine with --threads 1)")
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    sizes = [int(x) for x in args.sizes.split(",")]
    spec = SketchSpec(d=D, K=K, m=M, seed=0)
    t0 = time.perf_counter()
    sk = Sketcher(spec)
    t_proj = time.perf_counter() - t0

    res: dict[str, list[float]] = {"naive": [], "gemm": [], "sketch": []}
    naive_ns: list[int] = []
    naive_done = False
    fidelity = []
    for n in sizes:
        tasks = make_tasks(T, n, D, K, seed=n, kind="mixture")
        pairs = [(t.a, t.e) for t in tasks]

        def sketch(tasks=tasks):
            states = []
            for t in tasks:
                st = SketchState.empty(spec)
                sk.update(st, t.a, t.e, t.sample_ids)
                states.append(st)
            return align_matrix(states)

        res["sketch"].append(timeit(sketch, repeats=args.repeats, clock=args.clock))
        res["gemm"].append(timeit(lambda pairs=pairs: exact_matrix(pairs), repeats=args.repeats, clock=args.clock))
        mr, ex = sketch(), exact_matrix(pairs, statistic="u")
        iu = np.triu_indices(T, 1)
        fidelity.append(float(np.max(np.abs(mr.fisher[iu] - ex.fisher[iu]))))
        if not naive_done:
            t1 = clock()
            exact_matrix_naive(pairs)
            tn = clock() - t1
            res["naive"].append(tn)
            naive_ns.append(n)
            naive_done = tn > args.naive_limit
        print(n, {k: v[-1] for k, v in res.items() if v}, flush=True)

    # Extrapolate the naive loop (quadratic in n) from its last measured points.
    naive_slope = _slope(naive_ns[-3:], res["naive"][-3:]) if len(naive_ns) >= 2 else 2.0
    naive_full = list(res["naive"])
    for n in sizes[len(naive_ns):]:
        naive_full.append(res["naive"][-1] * (n / naive_ns[-1]) ** naive_slope)

    rows = []
    for k, n in enumerate(sizes):
        extrap = k >= len(naive_ns)
        paper = PAPER.get(n)
        rows.append([
            n,
            f"{naive_full[k]:.3g}" + (" (extrap.)" if extrap else ""),
            res["gemm"][k],
            res["sketch"][k],
            f"{naive_full[k] / res['sketch'][k]:.1f}x",
            f"{res['gemm'][k] / res['sketch'][k]:.2f}x",
            f"{paper[0]} / {paper[1]} / {paper[0] / paper[1]:.0f}x" if paper else "",
            f"{fidelity[k]:.3f}",
        ])
    big = [k for k, n in enumerate(sizes) if n >= 200] or list(range(len(sizes)))
    s_naive = _slope([naive_ns[k] for k in range(len(naive_ns))], res["naive"]) if len(naive_ns) >= 2 else 2.0
    s_gemm = _slope([sizes[k] for k in big], [res["gemm"][k] for k in big])
    s_sketch = _slope([sizes[k] for k in big], [res["sketch"][k] for k in big])
    body = "\n".join([
        f"5 tasks, d = {D}, K = {K} (dense error projection), m = {M}; all 15 task blocks. Seconds of "
        f"{'process CPU time' if args.clock == 'cpu' else 'wall time'}, median of "
        f"{args.repeats} runs (naive: one run); {args.threads} thread(s). Projections drawn once in "
        f"{t_proj:.2f} s (not in the timings). Last column: max |Â_F(sketch) − A_F(exact, U)| over the 10 "
        "pairs.",
        "",
        table(["n / task", "naive loop (s)", "exact GEMM (s)", "sketch (s)", "naive / sketch",
               "GEMM / sketch", "paper: exact / sketch / speedup", "max |ΔÂ_F|"], rows),
        "",
        f"* Log-log slopes (n ≥ 200): naive {s_naive:.2f} (measured points), exact GEMM {s_gemm:.2f}, "
        f"sketch {s_sketch:.2f}.",
        f"* Crossover: the sketch beats the GEMM exact from n {_crossover(sizes, res['gemm'], res['sketch'])}; "
        f"it beats the naive loop from n {_crossover(sizes, naive_full, res['sketch'])}.",
        f"* The naive loop was measured up to n = {naive_ns[-1]} (limit {args.naive_limit:.0f} s) and "
        f"extrapolated with slope {naive_slope:.2f} beyond.",
    ])
    write_section("timing", "Timing table: exact vs sketched (paper Table 'Wall-clock timing')", body)


if __name__ == "__main__":
    main()
