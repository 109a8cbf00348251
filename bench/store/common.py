"""Helpers of the store benchmarks: synthetic signatures and bulk loading into a real store.

The store plumbing (bulk inserts, throw-away PostgreSQL databases) is shared with the tests:
:mod:`tests.store_helpers`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from atlas import repository
from tests import store_helpers
from tests.store_helpers import drop_pg_database, insert_ready_tasks

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["add_run_options", "bulk_load", "clustered_unit_vectors", "create_pg_database", "drop_pg_database",
           "finish_run", "make_space"]


def clustered_unit_vectors(n: int, m: int, *, clusters: int, spread: float, seed: int,
                           chunk: int = 5000) -> Iterator[np.ndarray]:
    """Yield ``n`` unit float32 vectors in chunks: a mixture of ``clusters`` directions plus noise.

    Real task signatures come in families (domains, formats); a mixture with within-family cosine
    about ``1 / (1 + spread**2)`` is a fair stand-in for ANN recall. ``spread=inf`` would be uniform.
    """
    centers = np.random.default_rng(seed).standard_normal((clusters, m)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    for start in range(0, n, chunk):
        rng = np.random.default_rng([seed, start])
        size = min(chunk, n - start)
        x = centers[rng.integers(0, clusters, size)]
        x = x + spread * rng.standard_normal((size, m)).astype(np.float32) / np.sqrt(m)
        yield (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_space(factory: sessionmaker[Session], m: int, key: str = "bench-model") -> int:
    with factory.begin() as s:
        return repository.get_or_create_space(
            s, model_fingerprint=key, spec_fingerprint=f"bench-spec-m{m}", model_name="bench", d=257, K=8192,
            m=m, seed=0, spec={"m": m},
        ).id


def bulk_load(factory: sessionmaker[Session], space_id: int, chunks: Iterator[np.ndarray]) -> tuple[int, float]:
    """Insert ready tasks with signatures and their change rows, chunk by chunk; return (n, seconds)."""
    t0 = time.perf_counter()
    n = 0
    for vectors in chunks:
        with factory.begin() as s:
            insert_ready_tasks(s, space_id, [f"t{n + i}" for i in range(len(vectors))], vectors)
        n += len(vectors)
    return n, time.perf_counter() - t0


def create_pg_database(server_url: str) -> str:
    """Create an empty PostgreSQL database ``fa_bench_<random>`` and return its URL."""
    return store_helpers.create_pg_database(server_url, prefix="fa_bench")


def add_run_options(parser: argparse.ArgumentParser, name: str) -> None:
    """``--json`` (raw results, ``bench/out/store/<name>.json``) and ``--out`` (the markdown section)."""
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "out" / "store" / f"{name}.json")
    parser.add_argument("--out", type=Path, default=None, help=f"markdown section to write (bench/results/{name}.md)")


def nonzero_counts(result: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """``"key: value"`` for each of ``keys`` whose count in ``result`` is not zero (a failed check)."""
    return [f"{key}: {result[key]}" for key in keys if result[key]]


def finish_run(result: dict[str, Any], args: argparse.Namespace, failures: list[str], table: str,
               write: Callable[[Path, argparse.Namespace, dict[str, Any]], None], verdict: str) -> None:
    """The shared tail of a run: record ``failures``, write the raw JSON, print ``table``, write the
    markdown section when ``--out`` is given; exit non-zero with ``verdict`` when a check failed."""
    result["failures"] = failures
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(table)
    print(f"wrote {args.json}")
    if args.out:
        write(args.out, args, result)
    if failures:
        raise SystemExit(f"{verdict}: " + "; ".join(failures))
