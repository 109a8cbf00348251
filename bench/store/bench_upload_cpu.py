"""CPU cost of uploads that hold (almost) nothing: the reader's time per upload, in-process.

Cases found by the security review of 2026-11-25: a CSV header of many columns (its repeated-name check was
quadratic), gzipped files of blank lines (walked line by line, 20 s for 64 MB), and a zlib bomb in an imported
term-count blob (inflated in full before its length was checked). Each case is timed through the product's own
reader (:func:`atlas.sample_io.read_samples`, :meth:`atlas.lexical.TermCounts.from_bytes`); the median of
``--repeats`` runs is reported with the outcome.

Run: ``python -m bench.store.bench_upload_cpu``.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import time
import zlib
from collections.abc import Callable

from atlas.lexical import _MAGIC, TermCounts
from atlas.sample_io import read_samples


def _csv_header(columns: int) -> bytes:
    return ",".join(f"c{i}" for i in range(columns)).encode() + b",text\n" + b"," * columns + b"hi there\n"


def cases(mb: int) -> list[tuple[str, int, Callable[[], object]]]:
    """``(name, bytes sent, call)`` of each case."""
    wide = _csv_header(1_000_000)
    newlines = gzip.compress(b"\n" * (mb << 20), 9)
    rows = gzip.compress(b"text\n" + b"\n" * (mb << 20), 9)
    bomb = _MAGIC + (1).to_bytes(4, "little") + zlib.compress(b"\0" * (1 << 30), 9)
    return [
        ("CSV header of 1,000,000 columns", len(wide), lambda: read_samples(wide, "w.csv", "text")),
        (f"gzip: {mb} MB of newlines (.txt)", len(newlines), lambda: read_samples(newlines, "n.txt.gz", "text")),
        (f"gzip: {mb} MB of blank CSV rows", len(rows), lambda: read_samples(rows, "n.csv.gz", "text")),
        ("term-count blob: zlib bomb of 1 GiB", len(bomb), lambda: TermCounts.from_bytes(bomb)),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=64, help="decompressed size of the blank-line bombs")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print("| upload | bytes sent | outcome | time s (median) |\n|---|---:|---|---:|")
    for name, size, call in cases(args.mb):
        times, outcome = [], ""
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            try:
                got = call()
                outcome = f"{len(got)} sample(s)" if isinstance(got, list) else "read"  # type: ignore[arg-type]
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {str(exc)[:60]}"
            times.append(time.perf_counter() - t0)
        print(f"| {name} | {size:,} | {outcome} | {statistics.median(times):.2f} |")


if __name__ == "__main__":
    main()
