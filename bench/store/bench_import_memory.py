"""Peak memory of a space import, as a function of the export's size — this tree against another (``--trees``).

The script builds one real export with the library (:class:`fisher_atlas.Atlas`, the bundled model at the service's
m = 4096): one task, then its line repeated under ``--tasks`` names with the header's count and the trailer's
checksum rewritten, so the import checks and stores that many full tasks. Each tree then imports it in a fresh
process (``Atlas.import_``, SQLite) that reads its own peak RSS (``VmHWM``, reset after the model is loaded) —
the trees alternate, ``--repeats`` times, and the table gives medians. ::

    git worktree add /tmp/fa-before <commit>
    python -m bench.store.bench_import_memory --tasks 2000 --trees . /tmp/fa-before
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.store.bench_upload_memory import machine

CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import fisher_atlas
assert fisher_atlas.__file__.startswith(sys.argv[1]), fisher_atlas.__file__
from fisher_atlas import Atlas

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

import threading
peak_anon, done = [0], threading.Event()

def sample():  # anonymous memory (the heap): VmHWM also counts the file pages a memory map reads
    while not done.wait(0.005):
        peak_anon[0] = max(peak_anon[0], status("RssAnon"))

with Atlas(sys.argv[2]) as atlas:
    Path("/proc/self/clear_refs").write_text("5")
    before, anon_before = status("VmRSS"), status("RssAnon")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    n = atlas.import_(sys.argv[3])
    secs = time.perf_counter() - t0
    done.set()
    sampler.join()
    print(json.dumps({"imported": n, "peak": status("VmHWM") - before, "anon": peak_anon[0] - anon_before,
                      "seconds": secs}))
"""


def build_export(path: Path, n_tasks: int) -> int:
    """Write an export of ``n_tasks`` copies of one real task to ``path``; its size in bytes."""
    from fisher_atlas import Atlas

    with tempfile.TemporaryDirectory(prefix="fa-impmem-") as tmp:
        with Atlas(Path(tmp) / "data") as atlas:
            texts = [f"sample {i}: a short text about the export of a space, number {i}" for i in range(16)]
            atlas.add("seed", texts)
            atlas.export(Path(tmp) / "one.jsonl")
        header, line, _trailer = (Path(tmp) / "one.jsonl").read_bytes().splitlines()
    head = json.loads(header)
    head["n_tasks"] = n_tasks
    task = json.loads(line)
    digest = hashlib.sha256()
    with path.open("wb") as f:
        def write(data: bytes) -> None:
            f.write(data)
            digest.update(data)

        write(json.dumps(head).encode() + b"\n")
        for i in range(n_tasks):
            task["name"] = f"t{i:06d}"
            write(json.dumps(task).encode() + b"\n")
        f.write(json.dumps({"trailer": True, "n_tasks": n_tasks, "sha256": digest.hexdigest()}).encode() + b"\n")
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--trees", nargs="+", default=["."], help="source trees to compare (the first is 'this')")
    ap.add_argument("--labels", nargs="*", default=None, help="a label per tree (default: the paths)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/import_memory.md")
    args = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in args.trees]
    labels = args.labels or args.trees
    with tempfile.TemporaryDirectory(prefix="fa-impmem-") as tmp:
        export = Path(tmp) / "space.jsonl"
        size = build_export(export, args.tasks)
        print(f"export: {args.tasks} tasks, {size / 1e6:.1f} MB", flush=True)
        runs: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
        for rep in range(args.repeats):
            for tree in trees:
                data_dir = Path(tmp) / f"d-{rep}-{trees.index(tree)}"
                out = subprocess.run([sys.executable, "-c", CHILD, tree, str(data_dir), str(export)], check=True,
                                     capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
                res = json.loads(out.stdout.strip().splitlines()[-1])
                assert res["imported"] == args.tasks, res
                runs[tree].append(res)
                print(f"repeat {rep} {tree}: peak +{res['peak'] / 1e6:.1f} MB, anonymous +{res['anon'] / 1e6:.1f} MB, "
                      f"{res['seconds']:.1f} s", flush=True)
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Space import memory",
        "",
        f"Machine: {machine()}; date {when}; the 2-core dev box, other jobs running.",
        "",
        "```bash",
        f"python -m bench.store.bench_import_memory --tasks {args.tasks} --trees {' '.join(args.trees)} "
        f"--repeats {args.repeats}",
        "```",
        "",
        f"An export of {args.tasks} tasks ({size / 1e6:.1f} MB; one real task of the bundled model at m = 4096, its "
        "line repeated under other names, the trailer's count and checksum rewritten) imported with the library "
        "(`Atlas.import_`, SQLite) in a fresh process per run; peak RSS growth over the import (`VmHWM` after it "
        "minus `VmRSS` before, the model already loaded; it counts the file pages a memory map has read, which the "
        "kernel can drop) and of anonymous memory (`RssAnon`, sampled every 5 ms: the heap, which it cannot); "
        "medians of the repeats, the trees alternating.",
        "",
        "| tree | peak RSS growth | per export byte | peak anonymous growth | per export byte | import time s |",
        "|:---|---:|---:|---:|---:|---:|",
    ]
    for tree, label in zip(trees, labels, strict=True):
        peak = statistics.median(r["peak"] for r in runs[tree])
        anon = statistics.median(r["anon"] for r in runs[tree])
        secs = statistics.median(r["seconds"] for r in runs[tree])
        lines.append(f"| {label} | {peak / 1e6:.1f} MB | {peak / size:.2f} | {anon / 1e6:.1f} MB | {anon / size:.2f} "
                     f"| {secs:.1f} |")
    lines.append("")
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
