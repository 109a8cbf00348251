"""Shared plumbing of the quality experiments: command line, model, sketching, timing, logging.

Every experiment module builds its parser with :func:`make_parser` (so all of them accept
``--quick``, ``--model``, ``--device``, ``--dtype``, ``--threads``, ``--no-write`` …), hands its ``run`` and
``render`` to :func:`run_and_report` (setup, timing, raw JSON, run facts, ``quality.md`` section), and
loads the model with :func:`load_model`. Signatures are always produced by the
product's own code path: :class:`workers.extraction.Extractor` feeding a :class:`fishersketch.Sketcher`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bench.quality.paths import REPO_ROOT

if TYPE_CHECKING:
    from atlas.samples import Sample
    from fishersketch import Sketcher
    from workers.extraction import ExtractionResult, Extractor
    from workers.model_loading import LoadedModel

MACHINE = "2-core CPU (python-svc dev box)"
"""Name of the development machine as reported in the results."""


def shared_data_dir() -> Path:
    """Directory of the staged datasets (``shared/data``).

    Resolution order: the environment variable ``FISHER_ATLAS_BENCH_DATA``; ``<repo>/shared/data``;
    ``<repo>/../shared/data``.

    Returns
    -------
    Path

    Raises
    ------
    FileNotFoundError
        None of the candidates exists.
    """
    env = os.environ.get("FISHER_ATLAS_BENCH_DATA")
    candidates = [Path(env)] if env else []
    candidates += [REPO_ROOT / "shared" / "data", REPO_ROOT.parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    raise FileNotFoundError(
        "shared/data not found; set FISHER_ATLAS_BENCH_DATA to the directory holding "
        "superglue/, multidomain_text/, multitask_instructions/ and molecules_smiles/"
    )


# ----------------------------------------------------------------------------------------------------
# Command line


def make_parser(description: str, *, m: int, max_tokens: int, seeds: Sequence[int]) -> argparse.ArgumentParser:
    """Argument parser with the options every experiment shares.

    Parameters
    ----------
    description : str
        Shown by ``--help``.
    m : int
        Default sketch dimension.
    max_tokens : int
        Default ``max_tokens_per_sample``.
    seeds : sequence of int
        Default seeds.

    Returns
    -------
    argparse.ArgumentParser
    """
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test (< 1 min); never writes results")
    p.add_argument("--model", default="bundled", help="'bundled', a local directory or a Hugging Face hub id")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default="float32", help="model weight dtype (errors are always float32)")
    p.add_argument("--m", type=int, default=m, help="sketch dimension")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="max_tokens_per_sample of the Extractor")
    p.add_argument("--seeds", type=int, nargs="+", default=list(seeds), help="seeds (data split and sketch)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest on the shared 2-core box: 2 threads oversubscribe it)")
    p.add_argument("--token-budget", type=int, default=4096, help="padded tokens per forward batch")
    p.add_argument("--no-write", action="store_true", help="do not update bench/results/quality.md")
    p.add_argument("--out", type=Path, default=None, help="JSON file for the raw results (default bench/out/quality/)")
    return p


def setup(args: argparse.Namespace) -> None:
    """Process-wide settings: thread count, offline hub, deterministic seeds.

    Parameters
    ----------
    args : argparse.Namespace
        From a parser built by :func:`make_parser`.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(max(1, int(args.threads)))
    torch.manual_seed(0)
    np.random.seed(0)


def run_study(args: argparse.Namespace, run: Callable[[argparse.Namespace], dict[str, Any]],
              render: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """The tail of an offline study's ``main`` (a study prints its table and never writes ``quality.md``):
    :func:`setup`, ``run(args)``, print ``render(results)``, write the results to ``--out`` when given."""
    setup(args)
    res = run(args)
    print(render(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return res


def writes_results(args: argparse.Namespace) -> bool:
    """Whether this run should update ``bench/results/quality.md`` (full runs only)."""
    return not args.quick and not args.no_write


def command_line() -> str:
    """The command that started this process, as a user would type it."""
    module = sys.modules["__main__"].__spec__
    head = f"python -m {module.name}" if module is not None else f"python {sys.argv[0]}"
    return " ".join([head, *sys.argv[1:]])


def run_and_report(name: str, title: str, args: argparse.Namespace,
                   run: Callable[[argparse.Namespace], dict[str, Any]],
                   render: Callable[[dict[str, Any], str], str],
                   settings: Callable[[dict[str, Any]], dict[str, Any]],
                   seeds: Sequence[Any] | Callable[[dict[str, Any]], Sequence[Any]] | None = None,
                   with_args: bool = True) -> None:
    """The shared tail of every experiment's ``main``: run, write raw JSON, render, update ``quality.md``.

    Calls :func:`setup`, times ``run(args)``, takes the model out of the results (key ``"lm"``, when
    present) for :func:`machine_info`, writes ``bench/out/quality/<name>[_quick].json`` (or ``--out``),
    renders the markdown with the run facts, prints it and, on full runs (:func:`writes_results`),
    replaces the generated block ``name`` of ``bench/results/quality.md``.

    Parameters
    ----------
    name : str
        Experiment key: JSON file name and results-section marker.
    title : str
        Subsection title in ``quality.md`` (used when the section does not exist yet).
    args : argparse.Namespace
        Parsed (and ``--quick``-adjusted) arguments.
    run : callable
        ``run(args) -> results``; may include the loaded model under ``"lm"``.
    render : callable
        ``render(results, facts) -> markdown``.
    settings : callable
        ``settings(results) -> {setting: value}`` for the run facts.
    seeds : sequence or callable, optional
        Seeds for the run facts, or ``seeds(results) -> seeds`` (default ``args.seeds``).
    with_args : bool
        Whether the raw JSON records ``vars(args)`` under ``"args"``.
    """
    from bench.quality import report

    setup(args)
    t0 = time.perf_counter()
    res = run(args)
    runtime = time.perf_counter() - t0
    lm = res.pop("lm", None)
    info = machine_info(args, lm)
    payload: dict[str, Any] = {"experiment": name, "command": command_line(), "machine": info, "runtime_s": runtime}
    if with_args:
        payload["args"] = vars(args)
    path = report.write_json(name + ("_quick" if args.quick else ""), {**payload, **res}, args.out)
    log(f"raw results: {path}")
    if seeds is None:
        seeds = args.seeds
    elif callable(seeds):
        seeds = seeds(res)
    facts = report.run_facts(info, command_line(), seeds, runtime, settings(res))
    md = render(res, facts)
    print(md)
    if writes_results(args):
        report.update_section(name, title, md)


def timing_settings(timings: dict[str, float]) -> dict[str, str]:
    """Run-fact settings of the sketch and oracle times (``timings["sketch_s"]``, ``timings["oracle_s"]``)."""
    return {"sketch time": f"{timings['sketch_s']:.0f}s", "oracle time": f"{timings['oracle_s']:.0f}s"}


def float_or_none(x: Any) -> float | None:
    """``float(x)``, or None when ``x`` is not a number."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------------
# Logging and timing

_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Print a progress line with the seconds since the process started (flushed)."""
    print(f"[{time.perf_counter() - _T0:8.1f}s] {msg}", flush=True)


@contextmanager
def timed(label: str, into: dict[str, float] | None = None) -> Iterator[None]:
    """Time a block, log it, and optionally add the seconds to ``into[label]``."""
    t = time.perf_counter()
    yield
    dt = time.perf_counter() - t
    if into is not None:
        into[label] = into.get(label, 0.0) + dt
    log(f"{label}: {dt:.1f}s")


def machine_info(args: argparse.Namespace, lm: LoadedModel | None = None) -> dict[str, Any]:
    """Facts about this run's machine and software, for the results."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        if names:
            cpu = f"{names[0]} x{len(names)}"
    except OSError:
        pass
    info: dict[str, Any] = {
        "machine": MACHINE if str(args.device).startswith("cpu") else f"{args.device} machine",
        "cpu": cpu,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": git_commit(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    if torch.cuda.is_available() and not str(args.device).startswith("cpu"):
        info["gpu"] = torch.cuda.get_device_name(0)
    if lm is not None:
        info["model"] = {"name": lm.name, "key": lm.fingerprint.key(), "d": lm.d, "K": lm.K,
                         "hidden_size": lm.hidden_size, "max_positions": lm.max_positions}
    return info


def git_commit() -> str | None:
    """Short commit hash of the checkout (``+dirty`` when the tree has changes), or None."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


# ----------------------------------------------------------------------------------------------------
# Model and sketching (the product's own code path)


def load_model(args: argparse.Namespace) -> LoadedModel:
    """Load the model named by ``--model`` with the product's loader.

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    workers.model_loading.LoadedModel
    """
    from workers.model_loading import load_causal_lm

    with timed(f"load model {args.model!r}"):
        lm = load_causal_lm(args.model, device=args.device, dtype=args.dtype)
    log(f"model {lm.name}: d={lm.d} K={lm.K} H={lm.hidden_size} max_positions={lm.max_positions} "
        f"device={lm.device}")
    return lm


def make_sketcher(lm: LoadedModel, m: int, seed: int) -> Sketcher:
    """A :class:`fishersketch.Sketcher` for ``lm``'s (d, K) with sketch dimension ``m`` and ``seed``."""
    from fishersketch import Sketcher

    return Sketcher(lm.make_spec(m=m, seed=seed), device=str(lm.device))


def make_extractor(lm: LoadedModel, sketcher: Sketcher | None, args: argparse.Namespace) -> Extractor:
    """A :class:`workers.extraction.Extractor` with the run's truncation and batching settings."""
    from workers.extraction import Extractor

    max_tokens = int(args.max_tokens)
    if lm.max_positions is not None:
        max_tokens = min(max_tokens, lm.max_positions)
    return Extractor(lm, sketcher, max_tokens_per_sample=max_tokens, token_budget=int(args.token_budget))


@dataclass
class TaskSignature:
    """A task's sketch state and baseline sums, as the product stores them.

    Attributes
    ----------
    name : str
    state : fishersketch.SketchState
    baselines : atlas.baselines.BaselineSums
    n_samples : int
        Samples used.
    tokens : int
        Counted tokens.
    seconds : float
        Wall time of the extraction.
    """

    name: str
    state: Any
    baselines: Any
    n_samples: int
    tokens: int
    seconds: float


def extract_task(extractor: Extractor, name: str, samples: Sequence[Sample], mode: str) -> TaskSignature:
    """Sketch one task with the product's :meth:`Extractor.extract` and log its throughput.

    Parameters
    ----------
    extractor : workers.extraction.Extractor
    name : str
    samples : sequence of atlas.samples.Sample
    mode : {"text", "completion"}

    Returns
    -------
    TaskSignature
    """
    res: ExtractionResult = extractor.extract(list(samples), mode=mode)  # type: ignore[arg-type]
    if res.samples_skipped:
        log(f"  {name}: skipped {res.samples_skipped} samples {res.skipped_reasons}")
    log(f"  sketched {name}: {res.samples_used} samples, {res.tokens} tokens, {res.elapsed_s:.1f}s "
        f"({res.tokens_per_s:.0f} tok/s)")
    return TaskSignature(name=name, state=res.state, baselines=res.baselines, n_samples=res.samples_used,
                         tokens=res.tokens, seconds=res.elapsed_s)


def fmt(x: float | None, digits: int = 3) -> str:
    """Format a number for a table (``–`` for None/NaN)."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}"


def pct(x: float | None, digits: int = 1) -> str:
    """Format a fraction as a percentage (``–`` for None/NaN)."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "–"
    return f"{100 * x:.{digits}f}%"


def mean_std(values: Sequence[float], digits: int = 3, percent: bool = False) -> str:
    """``mean ± std`` over seeds (population std), or the single value when there is one."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return "–"
    scale = 100.0 if percent else 1.0
    unit = "%" if percent else ""
    if arr.size == 1:
        return f"{scale * arr[0]:.{digits}f}{unit}"
    return f"{scale * arr.mean():.{digits}f}{unit} ± {scale * arr.std():.{digits}f}"
