"""Shared helpers of the sketch benchmarks: timing, machine description, Markdown sections."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "results" / "sketch.md"
MACHINE = "2-core CPU (python-svc dev box)"
TITLE = "# FisherSketch engine benchmarks\n"
_LOAD_AT_IMPORT = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def timeit(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1, sync: bool = False,
           clock: str = "wall", stat: str = "median") -> float:
    """Median (or ``stat="min"``) time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs.

    ``clock="wall"`` uses ``time.perf_counter``; ``clock="cpu"`` uses the process CPU time
    (``time.process_time``), which on a shared machine measures the work done rather than the share of
    the CPU obtained (with one intra-op thread it is the single-core time).
    """
    timer = time.perf_counter if clock == "wall" else time.process_time
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = timer()
        fn()
        if sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(timer() - t0)
    return min(times) if stat == "min" else statistics.median(times)


def machine_line() -> str:
    """Machine, CPU model, threads, torch version, load average at the start of the run."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = _LOAD_AT_IMPORT
    return (f"{MACHINE}: {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} intra-op threads, load average {load:.1f} at start")


def command_line() -> str:
    """The command that produced a section (module form when run with ``-m``)."""
    argv = list(sys.argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return "python -m " + " ".join([spec.name, *map(shlex.quote, argv[1:])])
    return "python " + " ".join(map(shlex.quote, argv))


def write_section(name: str, title: str, body: str) -> None:
    """Replace (or append) the section ``name`` of ``bench/results/sketch.md``."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    text = RESULTS.read_text() if RESULTS.exists() else TITLE
    start, end = f"<!-- sketch:{name}:start -->", f"<!-- sketch:{name}:end -->"
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    block = (f"{start}\n## {title}\n\n*Command:* `{command_line()}`  \n*Machine:* {machine_line()}  \n"
             f"*Date:* {stamp}\n\n{body.rstrip()}\n{end}")
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text if text.endswith("\n") else text + "\n")
    print(block)


def table(header: list[str], rows: list[list[object]]) -> str:
    """A Markdown table."""
    def cell(x: object) -> str:
        return f"{x:.4g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)
