"""Butterfly versus Kronecker-factored GEMM FWHT, with the last stage gathered (SRHT error path).

For each length N it times, per row, ``(H_N x)[I]`` for ``m = min(4096, N)`` sorted outputs on blocks
of rows as the sketcher uses them (rows x N = 2**20 floats, many blocks through the same buffers):

* ``butterfly``: the paper's view+cat radix-2 butterfly, then ``index_select``;
* ``kron F|g``: Kronecker stages with factors ≤ F computed in full, the last factor g gathered
  (``g = 1``: all stages full, then ``index_select``).

The plan chosen by :func:`fishersketch.fwht.choose_plan` is marked. Usage::

    nice -n 5 python -m bench.sketch.fwht [--threads 2] [--max-log2 18] [--clock cpu]
"""

from __future__ import annotations

import argparse

import torch

from bench.sketch._common import table, timeit, write_section
from fishersketch.fwht import GatheredHadamard, KronPlan, choose_plan, fwht_butterfly, kron_factors
from fishersketch.projector import _ERR_BLOCK_ELEMS


def _time_plan(plan: KronPlan, rows: int, N: int, m: int, repeats: int, clock: str, blocks: int) -> float:
    gen = torch.Generator().manual_seed(0)
    index = torch.sort(torch.randperm(N, generator=gen)[:m]).values.view(1, m)
    gh = GatheredHadamard(plan, index, torch.float32, torch.device("cpu"))
    work = torch.empty(gh.workspace_numel(rows))
    src = torch.randn(rows, N, generator=gen)
    out = [torch.empty(rows, m)]

    def run() -> None:
        for _ in range(blocks):  # as the sketcher: many blocks through the same buffers
            gh(src, work, out=out)

    return timeit(run, repeats=repeats, clock=clock, stat="min") / (rows * blocks)


def _time_butterfly(rows: int, N: int, m: int, repeats: int, clock: str, blocks: int) -> float:
    gen = torch.Generator().manual_seed(0)
    index = torch.sort(torch.randperm(N, generator=gen)[:m]).values
    src = torch.randn(rows, N, generator=gen)

    def run() -> None:
        for _ in range(blocks):
            fwht_butterfly(src).index_select(1, index)

    return timeit(run, repeats=repeats, clock=clock, stat="min") / (rows * blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--max-log2", type=int, default=18)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time (robust on a shared machine with --threads 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = args.clock
    rows_out = []
    best_rows = []
    for p in range(6, args.max_log2 + 1):
        N = 1 << p
        m = min(4096, N)
        rows = max(2, min(256, _ERR_BLOCK_ELEMS // N))
        blocks = max(1, (1 << 22) // (rows * N))
        t_bf = _time_butterfly(rows, N, m, args.repeats, clock, blocks)
        chosen = choose_plan(N, m, "cpu")
        candidates: dict[str, KronPlan] = {}
        for mf in (8, 16, 32, 64):
            for g in (1, 2, 4, 8, 16):
                if g > N // 2 or (g > 1 and 2 * m > N):
                    continue
                plan = KronPlan(N=N, method="kron", factors=kron_factors(N // g, mf), gathered=g)
                candidates.setdefault(plan.describe(), plan)
        results = {name: _time_plan(plan, rows, N, m, args.repeats, clock, blocks) for name, plan in candidates.items()}
        best = min(results, key=results.__getitem__)
        chosen_name = chosen.describe()
        t_chosen = results.get(chosen_name) if chosen.method == "kron" else t_bf
        if t_chosen is None:
            t_chosen = _time_plan(chosen, rows, N, m, args.repeats, clock, blocks)
        for name, t in sorted(results.items(), key=lambda kv: kv[1]):
            mark = " (rule)" if name == chosen_name else ""
            rows_out.append([f"2^{p}", m, rows, name + mark, t * 1e3, t_bf / t])
        rows_out.append([f"2^{p}", m, rows, "butterfly" + (" (rule)" if chosen.method == "butterfly" else ""),
                         t_bf * 1e3, 1.0])
        best_rows.append([f"2^{p}", t_bf * 1e3, best, results[best] * 1e3, t_bf / results[best],
                          chosen_name, t_chosen * 1e3, t_bf / t_chosen])
        print(best_rows[-1], flush=True)
    what = "process CPU time" if clock == "cpu" else "wall time"
    body = (
        f"Per-row {what} of `(H_N x)[I]` with m = min(4096, N) gathered outputs, float32, "
        f"{args.threads} thread(s), blocks of rows as in the sketcher (rows x N = 2^20); minimum of "
        f"{args.repeats} runs per configuration (robust to the other jobs on the shared box), all in one run.\n\n"
        "Summary (best plan per N, and the plan `choose_plan` picks):\n\n"
        + table(["N", "butterfly ms/row", "best plan", "best ms/row", "best speedup", "rule plan",
                 "rule ms/row", "rule speedup"], best_rows)
        + "\n\n<details><summary>All plans</summary>\n\n"
        + table(["N", "m", "rows/block", "plan", "ms/row", "speedup vs butterfly"], rows_out)
        + "\n\n</details>\n"
    )
    write_section(f"fwht-{args.threads}t-{clock}",
                  f"FWHT: butterfly vs Kronecker GEMMs ({args.threads} thread(s), {what})", body)


if __name__ == "__main__":
    main()
