"""Draw the figures of ``bench/RESULTS.md`` from the result tables in ``bench/results/*.md``.

The figures use the product's plotting code (:mod:`service.plots`, matplotlib, the ``plots`` extra), so
what a user sees from ``fisher-atlas atlas --out`` and what the benchmark pages show come from one place.
The numbers are read from the Markdown tables each benchmark writes, so a re-run benchmark followed by
this script redraws its figure::

    python -m bench.figures.draw            # writes bench/figures/*.png
    python -m bench.assemble_results        # RESULTS.md (links rewritten to bench/figures)

Figures
-------
``routing_quality.png``
    Top-1 / top-3 routing accuracy per router (quality harness, section "Routing").
``index_latency.png``
    Candidate-search latency (p50, p99) against the number of stored tasks: exact flat index and IVF.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from service.plots import save_grouped_bars, save_lines

BENCH = Path(__file__).resolve().parents[1]
RESULTS = BENCH / "results"
FIGURES = BENCH / "figures"


def _number(cell: str) -> float:
    """A table cell as a float (``73.5%`` → 73.5, ``**9.3**`` → 9.3, ``1,000`` → 1000); nan if empty."""
    text = re.sub(r"[*%,\s]", "", cell)
    try:
        return float(text)
    except ValueError:
        return math.nan


def read_tables(markdown: str) -> list[list[dict[str, str]]]:
    """Every pipe table of ``markdown`` as a list of rows (header → cell)."""
    tables: list[list[dict[str, str]]] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|\s*:?-", lines[i + 1]):
            header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                rows.append(dict(zip(header, cells, strict=False)))
                i += 1
            tables.append(rows)
        else:
            i += 1
    return tables


def _section(markdown: str, key: str) -> str:
    begin, end = f"<!-- quality:{key}:begin -->", f"<!-- quality:{key}:end -->"
    if begin not in markdown or end not in markdown:
        raise ValueError(f"no generated section {key!r} in the quality results")
    return markdown[markdown.index(begin): markdown.index(end)]


def routing_quality(out: Path) -> Path:
    """Bar chart of top-1 and top-3 routing accuracy per router (bench/results/quality.md)."""
    rows = next(t for t in read_tables(_section((RESULTS / "quality.md").read_text(), "routing"))
                if t and "Router" in t[0] and "Top-1" in t[0])
    names = [re.sub(r"\s*\(.*?\)", "", r["Router"]).replace("all-MiniLM-L6-v2, ", "MiniLM ") for r in rows]
    # keep the parenthesised variant when two rows would share a label
    labels = [n if names.count(n) == 1 else r["Router"].replace("all-MiniLM-L6-v2, ", "MiniLM ")
              for n, r in zip(names, rows, strict=True)]
    for long, short in (("FAISS candidates + ", ""), ("product route: ", "product: "), (", paper rule", ""),
                        ("all-MiniLM-L6-v2 centroid, fused with lexical", "MiniLM centroid + lexical")):
        labels = [x.replace(long, short) for x in labels]
    series = {"top-1 %": [_number(r["Top-1"]) for r in rows], "top-3 %": [_number(r["Top-3"]) for r in rows]}
    return save_grouped_bars(labels, series, out, title="Routing on the shared instruction tasks (held-out prompts)",
                             ylabel="accuracy (%)", ylim=(0, 105), value_fmt="{:.1f}")


def index_latency(out: Path) -> Path:
    """Candidate-search latency against stored tasks: flat (exact) p50/p99 and IVF p50 (bench/results/store.md)."""
    tables = read_tables((RESULTS / "store.md").read_text())
    flat = next(t for t in tables if t and "QPS, 1 query per call" in t[0])
    ivf = next(t for t in tables if t and "nprobe" in t[0])
    ns = [_number(r["N"]) for r in flat]
    series = {"flat p50": [_number(r["p50 ms"]) for r in flat], "flat p99": [_number(r["p99 ms"]) for r in flat]}
    for nprobe in sorted({int(_number(r["nprobe"])) for r in ivf}):
        by_n = {_number(r["N"]): _number(r["p50 ms"]) for r in ivf if int(_number(r["nprobe"])) == nprobe}
        if all(n in by_n for n in ns):
            series[f"IVF nprobe={nprobe} p50"] = [by_n[n] for n in ns]
    return save_lines(ns, series, out, title="FAISS candidate search, k = 10, one query per call",
                      xlabel="stored tasks N", ylabel="latency (ms)", logx=True, logy=True)


FIGURE_FUNCS = {"routing_quality.png": routing_quality, "index_latency.png": index_latency}


def main(argv: list[str] | None = None) -> None:
    """Draw every figure (or the named ones) into ``bench/figures/``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[*FIGURE_FUNCS, []], help="figures to draw (default: all)")
    parser.add_argument("--out-dir", type=Path, default=FIGURES)
    args = parser.parse_args(argv)
    for name in args.names or list(FIGURE_FUNCS):
        path = FIGURE_FUNCS[name](args.out_dir / name)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
