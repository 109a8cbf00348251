"""Bytes stored per task, on SQLite and PostgreSQL, through the product path.

Usage::

    nice python -m bench.store.bench_bytes --tasks 300 --pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres

Each task is created with ``create_task_with_job`` (its upload of ``--samples`` texts, a job) and
finished with ``store_task_result`` carrying a real FisherSketch state (m = 4096, d and K of the
bundled model), its float32 signature and the baseline sums. Prints the logical blob sizes and the
on-disk growth per task of each database.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
from pathlib import Path

import numpy as np
import torch
from sqlalchemy import text

import migrations
from atlas import db, repository
from atlas.baselines import BaselineSums
from atlas.samples import Sample
from bench.store.common import create_pg_database, drop_pg_database, make_space


def real_state(d: int, K: int, m: int):
    from fishersketch import Sketcher, SketchSpec, SketchState

    spec = SketchSpec(d=d, K=K, m=m, seed=0)
    sketcher = Sketcher(spec)
    state = SketchState.empty(spec)
    g = torch.Generator().manual_seed(0)
    n = 64
    a = torch.randn(n, d, generator=g)
    e = torch.softmax(torch.randn(n, K, generator=g), dim=1)
    e[torch.arange(n), torch.randint(0, K, (n,), generator=g)] -= 1.0
    sketcher.update(state, a, e, torch.arange(n, dtype=torch.int64) // 8)
    return state


def texts(n: int, chars: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    words = ["the", "fisher", "geometry", "of", "tasks", "aligns", "vector", "database", "signature", "model"]
    out = []
    for _ in range(n):
        t = ""
        while len(t) < chars:
            t += str(rng.choice(words)) + " "
        out.append(Sample(text=t.strip()))
    return out


def fill(url: str, n_tasks: int, n_samples: int, chars: int, state_blob: bytes, sig: np.ndarray,
         base_blob: bytes) -> None:
    engine = db.make_engine(url)
    factory = db.session_factory(engine)
    space_id = make_space(factory, len(sig))
    for i in range(n_tasks):
        with factory.begin() as s:
            task, _ = repository.create_task_with_job(s, space_id, f"task-{i}", "text", {"i": i},
                                                      texts(n_samples, chars, seed=i))
            repository.store_task_result(s, task, state=state_blob, signature=sig, baselines=base_blob,
                                         n_samples=n_samples, n_tokens=n_samples * 60)
    engine.dispose()


def sqlite_bytes(path: Path) -> int:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    return int((pages - free) * size)


def pg_bytes(url: str) -> int:
    engine = db.make_engine(url)
    with engine.connect() as conn:
        size = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    engine.dispose()
    return int(size)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=300)
    p.add_argument("--samples", type=int, default=64, help="samples per task upload")
    p.add_argument("--chars", type=int, default=400, help="characters per sample")
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--pg", default=None)
    p.add_argument("--out", type=Path, default=Path("bench/out/store/bytes.json"))
    args = p.parse_args()
    torch.set_num_threads(1)

    state = real_state(args.d, args.K, args.m)
    state_blob = state.to_bytes()
    sig = state.signature()
    base_blob = BaselineSums(d=args.d).to_bytes()
    upload_blob, _ = repository.encode_samples(texts(args.samples, args.chars, seed=0))
    result: dict[str, object] = {
        "m": args.m, "d": args.d, "K": args.K, "tasks": args.tasks,
        "logical": {"state": len(state_blob), "signature": sig.nbytes, "baselines": len(base_blob),
                    "upload_gzip": len(upload_blob),
                    "upload_raw": sum(len(s.canonical_json()) + 1 for s in texts(args.samples, args.chars, 0))},
    }
    with tempfile.TemporaryDirectory(prefix="fa-bench-bytes-") as tmp:
        path = Path(tmp) / "atlas.sqlite"
        migrations.upgrade(f"sqlite:///{path}")
        empty = sqlite_bytes(path)
        fill(f"sqlite:///{path}", args.tasks, args.samples, args.chars, state_blob, sig, base_blob)
        result["sqlite_bytes_per_task"] = (sqlite_bytes(path) - empty) / args.tasks
    if args.pg:
        url = create_pg_database(args.pg)
        try:
            migrations.upgrade(url)
            empty = pg_bytes(url)
            fill(url, args.tasks, args.samples, args.chars, state_blob, sig, base_blob)
            result["postgresql_bytes_per_task"] = (pg_bytes(url) - empty) / args.tasks
        finally:
            drop_pg_database(args.pg, url)
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
