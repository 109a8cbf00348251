"""Memory at d = m = 4096, K = 128,256: fixed projections, state, signature (paper: ≈33 MiB, 192 KiB, 16 KiB).

Also the peak resident memory of one ``update`` of ``--tokens`` tokens, measured in a fresh subprocess
(``ru_maxrss`` before and after), and on CUDA the peak allocated device memory.

Usage::

    nice -n 5 python -m bench.sketch.memory [--tokens 256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

from bench.sketch._common import table, write_section
from fishersketch import Sketcher, SketchSpec, SketchState

D, K, M = 4096, 128256, 4096

_PEAK = """
import json, os, resource, sys, torch
from fishersketch import Sketcher, SketchSpec, SketchState
def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
n, cache = int(sys.argv[1]), sys.argv[2] == "1"
spec = SketchSpec(d=4096, K=128256, m=4096)
base = rss_kib()
sk = Sketcher(spec, cache_weights=cache)
built = rss_kib()
a = torch.randn(n, 4096)
e = torch.randn(n, 128256).mul_(1e-3)
before = max(rss_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sk.update(SketchState.empty(spec), a, e, torch.arange(n))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"sketcher_kib": built - base, "update_kib": peak - before}))
"""


def _peak(tokens: int, cache: bool) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", _PEAK, str(tokens), "1" if cache else "0"], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    spec = SketchSpec(d=D, K=K, m=M)
    sk = Sketcher(spec, cache_weights=False)
    p = sk.projections
    mib = 2**20
    state = SketchState.empty(spec)
    blob = state.to_bytes()
    rows = [
        ["activation signs r_a, r'_a (int8, 2m x d)", p.act_signs.numel() * p.act_signs.element_size() / mib],
        ["SRHT signs D, D' (int8, 2 x N)", p.srht_signs.numel() * p.srht_signs.element_size() / mib],
        ["SRHT indices I, I' (int64, 2 x m)", p.srht_index.numel() * p.srht_index.element_size() / mib],
        ["**fixed projections, total**", p.nbytes() / mib],
        ["SRHT signs as float32 on the device (2 x K)", sk._srht_signs.numel() * 4 / mib],
        ["optional float32 copy of the activation signs (cache_weights)", p.act_signs.numel() * 4 / mib],
        ["FWHT + chunk workspace of one update (transient)", sk.memory_bytes()["workspace_per_chunk"] / mib],
    ]
    peaks = {cache: _peak(args.tokens, cache) for cache in (False, True)}
    lines = [
        table(["item", "MiB"], rows),
        "",
        table(["per task", "bytes", "KiB"], [
            ["state sums (2 splits x 3 features x m float64)", state.sums.nbytes, state.sums.nbytes / 1024],
            ["state blob (to_bytes: header, sums, Σ‖ψ‖², counts, checksum)", len(blob), len(blob) / 1024],
            ["signature (float32, m)", state.signature().nbytes, state.signature().nbytes / 1024],
        ]),
        "",
        f"* Paper: fixed projections ≈ 33 MiB (int8 activation signs + ~1 MiB SRHT), state 192 KiB, "
        f"signature 16 KiB. Here: {p.nbytes() / mib:.1f} MiB, {state.sums.nbytes // 1024} KiB, "
        f"{state.signature().nbytes // 1024} KiB.",
        f"* Fresh process: resident memory added by building the sketcher "
        f"{peaks[False]['sketcher_kib'] / 1024:.0f} MiB (int8 only) / {peaks[True]['sketcher_kib'] / 1024:.0f} MiB "
        f"(with the float32 cache); peak RSS growth during one update of {args.tokens} tokens (inputs "
        f"excluded): "
        f"{peaks[False]['update_kib'] / 1024:.0f} MiB / {peaks[True]['update_kib'] / 1024:.0f} MiB "
        "(int8 signs are cast to float32 once per update call when not cached).",
    ]
    if torch.cuda.is_available():
        gsk = Sketcher(spec, device="cuda", cache_weights=False)
        torch.cuda.reset_peak_memory_stats()
        a = torch.randn(args.tokens, D, device="cuda")
        e = torch.randn(args.tokens, K, device="cuda") * 1e-3
        base = torch.cuda.memory_allocated()
        gsk.update(SketchState.empty(spec), a, e, torch.arange(args.tokens))
        lines.append(f"* CUDA: peak allocated during update {(torch.cuda.max_memory_allocated() - base) / mib:.0f} "
                     f"MiB above the inputs and projections.")
    write_section("memory", "Memory at d = m = 4096, K = 128,256", "\n".join(lines))


if __name__ == "__main__":
    main()
