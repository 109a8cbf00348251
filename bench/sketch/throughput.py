"""Update throughput at the Llama-3.1-8B head shape (d = 4096, K = 128,256, m = 4096), float32.

Measured in one run, on the same token batch:

* ``update``: full ``Sketcher.update`` (activation GEMM + SRHT error path + float64 accumulation);
* activation path (``project_activations``) with the cached float32 signs and with int8 signs cast per
  call (``cache_weights=False``);
* error path (``project_errors``) with the chosen FWHT plan and with the paper's plain butterfly;
* the plain butterfly FWHT alone (two sign-flipped copies per token, no gather);
* the head matmul ``a Wᵀ`` (W: K x d) that produced the logits in the first place.

With a CUDA device it also times a bf16 forward of an 8B-shaped stack (32 decoder layers of
Llama-3.1-8B GEMM shapes + the head) and reports the sketch overhead relative to it.

Usage::

    nice -n 5 python -m bench.sketch.throughput [--tokens 256] [--repeats 3]
"""

from __future__ import annotations

import argparse

import torch

from bench.sketch._common import table, timeit, write_section
from fishersketch import Sketcher, SketchSpec, SketchState
from fishersketch.fwht import fwht_butterfly

D, K, M = 4096, 128256, 4096


def _errors(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Realistic head errors: softmax of random logits minus a one-hot target, float32."""
    z = torch.randn(n, K, generator=gen) * 2.0
    e = torch.softmax(z, dim=1)
    y = torch.randint(0, K, (n,), generator=gen)
    e[torch.arange(n), y] -= 1.0
    return e.to(device)


def _forward_8b(tokens: int, device: torch.device, repeats: int) -> float:
    """Seconds of a bf16 forward of an 8B-shaped stack on ``tokens`` tokens (GEMMs only, one layer x 32)."""
    dt = torch.bfloat16
    h, kv, ff = 4096, 1024, 14336
    w = {k: torch.randn(*s, device=device, dtype=dt) * 0.01 for k, s in {
        "q": (h, h), "k": (kv, h), "v": (kv, h), "o": (h, h), "gate": (ff, h), "up": (ff, h), "down": (h, ff),
        "head": (K, h)}.items()}
    x = torch.randn(tokens, h, device=device, dtype=dt)

    def run() -> None:
        y = x
        for _ in range(32):
            q, k, v = y @ w["q"].T, y @ w["k"].T, y @ w["v"].T
            y = y + (q + k.repeat(1, 4) + v.repeat(1, 4)) @ w["o"].T
            y = y + (torch.nn.functional.silu(y @ w["gate"].T) * (y @ w["up"].T)) @ w["down"].T
        _ = y @ w["head"].T

    return timeit(run, repeats=repeats, sync=True)


def _measure(args: argparse.Namespace, dev: torch.device, clock: str) -> dict[str, float]:
    """Seconds per token of every path (median of ``args.repeats``), with the given clock."""
    gen = torch.Generator().manual_seed(0)
    n, nb, nh, r = args.tokens, args.butterfly_tokens, args.head_tokens, args.repeats
    spec = SketchSpec(d=D, K=K, m=M, seed=0)
    sk = Sketcher(spec, device=dev)
    a = torch.randn(n, D, generator=gen).to(dev)
    e = _errors(n, gen, dev)
    ids = torch.arange(n) // 32
    sync = dev.type == "cuda"
    out: dict[str, float] = {}

    def t(fn, tokens: int) -> float:
        return timeit(fn, repeats=r, sync=sync, clock=clock) / tokens

    out["update"] = t(lambda: sk.update(SketchState.empty(spec), a, e, ids), n)
    out["act"] = t(lambda: sk.project_activations(a), n)
    out["err"] = t(lambda: sk.project_errors(e), n)
    sk_bf16 = Sketcher(spec, device=dev, dtype=torch.bfloat16)
    out["update_bf16"] = t(lambda: sk_bf16.update(SketchState.empty(spec), a, e, ids), n)
    out["act_bf16"] = t(lambda: sk_bf16.project_activations(a), n)
    sk_int8 = Sketcher(spec, device=dev, cache_weights=False)
    out["act_int8"] = t(lambda: sk_int8.project_activations(a), n)
    sk_bf = Sketcher(spec, device=dev, fwht_method="butterfly", chunk_rows=nb)  # no padding
    out["err_butterfly_path"] = t(lambda: sk_bf.project_errors(e[:nb]), nb)
    N = spec.error_length
    signs = sk.projections.srht_signs.to(torch.float32)[:, :K]

    def plain_butterfly() -> None:
        x = torch.zeros(2, nb, N, device=dev)
        x[:, :, :K] = e[:nb].unsqueeze(0) * signs.unsqueeze(1)
        fwht_butterfly(x.view(2 * nb, N))

    out["butterfly"] = t(plain_butterfly, nb)
    head = torch.empty(K, D, device=dev).uniform_(-0.02, 0.02)
    out["head"] = t(lambda: a[:nh] @ head.T, nh)
    out["plan"] = sk.plan.describe()  # type: ignore[assignment]
    out["mem"] = sk.memory_bytes()  # type: ignore[assignment]
    out["chunk"] = sk.chunk_rows
    out["block"] = sk.err_block
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--head-tokens", type=int, default=128)
    parser.add_argument("--butterfly-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    dev = torch.device(args.device)
    threads = torch.get_num_threads()
    wall = _measure(args, dev, "wall")
    single = None
    if dev.type == "cpu":
        torch.set_num_threads(1)
        single = _measure(args, dev, "cpu")
        torch.set_num_threads(threads)
    n, nb, nh = args.tokens, args.butterfly_tokens, args.head_tokens
    paths = [
        ("update (full, float32)", "update", n),
        ("activation path (cached float32 signs)", "act", n),
        ("activation path (int8 signs cast per call)", "act_int8", n),
        (f"error path ({wall['plan']})", "err", n),
        ("error path with the paper's butterfly (same blocks of tokens, + gather)", "err_butterfly_path", nb),
        (f"paper's butterfly alone, one call on {nb} tokens x 2 copies", "butterfly", nb),
        ("head matmul a Wᵀ (K x d, float32)", "head", nh),
        ("update with dtype=bfloat16 activations (option)", "update_bf16", n),
        ("activation path, bfloat16 (option)", "act_bf16", n),
    ]
    header = ["path", "tokens", f"tokens/s wall ({threads} threads)"]
    if single is not None:
        header += ["tokens/s single core (CPU time, 1 thread)", "ms/token single core"]
    rows = []
    for label, key, tokens in paths:
        row: list[object] = [label, tokens, f"{1 / wall[key]:,.0f}"]
        if single is not None:
            row += [f"{1 / single[key]:,.0f}", f"{1e3 * single[key]:.2f}"]
        rows.append(row)

    def summary(res: dict[str, float], what: str) -> list[str]:
        return [
            f"* {what}: full update **{1 / res['update']:,.0f} tokens/s** (goal ≥ 1,000); activation path "
            f"{1 / res['act']:,.0f}, error path {1 / res['err']:,.0f} tokens/s; error path vs the butterfly: "
            f"**{res['butterfly'] / res['err']:.1f}x** the paper's batch butterfly, "
            f"**{res['err_butterfly_path'] / res['err']:.1f}x** the butterfly run in the sketcher's cache-sized "
            f"blocks (goal ≥ 5x); update / head matmul per token {res['update'] / res['head']:.2f}x.",
        ]

    mem = wall["mem"]
    lines = [table(header, rows), ""]
    lines += summary(wall, f"Wall clock, {threads} threads on the shared box")
    if single is not None:
        lines += summary(single, "Single core (CPU time, 1 thread)")
        lines.append(f"* A dedicated 2-core run is bounded by ~2x the single-core figures (GEMM and FWHT stages "
                     f"split over rows); single-core full update x 2 = {2 / single['update']:,.0f} tokens/s.")
    lines.append(
        f"* chunk_rows = {wall['chunk']}, FWHT block = {wall['block']} tokens, plan `{wall['plan']}`; projections "
        f"{mem['projections'] / 2**20:.1f} MiB (int8 + SRHT), float32 caches {mem['weight_cache'] / 2**20:.0f} MiB, "
        f"transient workspace per chunk {mem['workspace_per_chunk'] / 2**20:.0f} MiB.")
    if dev.type == "cuda":
        t_fwd = _forward_8b(n, dev, args.repeats)
        lines.append(f"* GPU: bf16 8B-shaped forward {n / t_fwd:,.0f} tokens/s; sketch update overhead "
                     f"{100 * wall['update'] * n / t_fwd:.1f} % of the forward (goal ≤ 10 %).")
    else:
        lines.append("* No CUDA device in this run: the GPU overhead goal (≤ 10 % of a bf16 8B forward) is not "
                     "measured here (`python -m bench.sketch.throughput --device cuda` on a GPU box).")
    write_section(f"throughput-{dev.type}", f"Throughput at Llama-3.1-8B shape ({dev.type})", "\n".join(lines))


if __name__ == "__main__":
    main()
