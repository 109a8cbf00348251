"""The route path's per-batch read of its candidates' routing rows: digests (the product) vs whole rows.

Usage::

    python -m bench.store.bench_route_rows --candidates 36 --completion 0 4 16 --repeats 200 \
        --pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres

Every route batch reads the routing rows of its candidates — the FAISS hits plus every completion-mode task of
the space, re-ranked on its prompt-side state (~200 KiB at m = 4096). Before migration 0006 the batch read whole
rows, blobs included; the product now reads the rows without the blob (``task_routing.prompt_digest`` finds the
cached view). Both reads are timed in one process, alternating, on a fresh migrated SQLite file and, with
``--pg``, a fresh PostgreSQL database on that server; medians in ms per batch, printed as one Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import migrations
from atlas import db, repository, routing_repo
from atlas.models import TaskRouting
from atlas.route_calibration import calibrate
from atlas.routing import typical_score
from atlas.samples import Sample
from bench.store.common import create_pg_database, drop_pg_database
from fishersketch import SketchSpec, SketchState

M = 4096


def _populate(factory: sessionmaker[Session], n: int, n_completion: int) -> list[int]:
    spec = SketchSpec(d=8, K=16, m=M, seed=0)
    rng = np.random.default_rng(0)
    with factory.begin() as s:
        space = repository.get_or_create_space(s, model_fingerprint=f"bench-{uuid.uuid4().hex[:8]}",
                                               spec_fingerprint=spec.fingerprint(), model_name="bench", d=8, K=16, m=M,
                                               seed=0, spec=spec.to_dict())
        s.flush()
        ids = []
        for i in range(n):
            state = SketchState(spec, rng.standard_normal((2, 3, M)), rng.random((2, 3)) + 1, np.array([3, 4]),
                                np.array([1, 2]))
            mode = "completion" if i < n_completion else "text"
            sample = Sample(prompt="p", completion="c") if mode == "completion" else Sample(text="t")
            task, _ = repository.create_task_with_job(s, space.id, f"t{i}", mode, {}, [sample])
            repository.store_task_result(s, task, state=state.to_bytes(), signature=state.signature(), baselines=None,
                                         n_samples=7, n_tokens=21)
            routing_repo.store_routing(s, task.id, prompt_state=state.to_bytes() if mode == "completion" else None,
                                       calibration=calibrate(rng.random(32).tolist()))
            ids.append(int(task.id))
    return ids


def _whole_rows(session: Session, ids: list[int]) -> object:
    """The read before migration 0006: whole ``task_routing`` rows, prompt-side blobs included, resolved as
    :func:`atlas.routing.resolve` does (the blob in place of the digest)."""
    rows = session.execute(select(TaskRouting).where(TaskRouting.task_id.in_(ids))).scalars()
    return [(r.threshold_override if r.threshold_override is not None else r.threshold_auto, r.score_scale,
             r.prompt_state, typical_score(r.cal_scores) if r.cal_scores else None) for r in rows]


def _time(factory: sessionmaker[Session], fn: Callable[[Session, list[int]], object], ids: list[int]) -> float:
    with factory() as s:
        t0 = time.perf_counter()
        fn(s, ids)
        return time.perf_counter() - t0


def measure(url: str, n: int, n_completion: int, repeats: int) -> tuple[float, float]:
    """Median ms per batch: (whole rows, digests)."""
    migrations.upgrade(url)
    engine = db.make_engine(url)
    factory = db.session_factory(engine)
    ids = _populate(factory, n, n_completion)
    whole, digest = [], []
    for _ in range(repeats):
        whole.append(_time(factory, _whole_rows, ids))
        digest.append(_time(factory, routing_repo.get_task_routes, ids))
    engine.dispose()
    return statistics.median(whole) * 1e3, statistics.median(digest) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--candidates", type=int, default=36)
    p.add_argument("--completion", type=int, nargs="+", default=[0, 4, 16])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--pg", default=None, help="PostgreSQL server URL (a database is created and dropped)")
    args = p.parse_args()
    print("| store | candidates | of them completion tasks | whole rows ms | digests (product) ms | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for c in args.completion:
        with tempfile.TemporaryDirectory() as tmp:
            w, d = measure(f"sqlite:///{Path(tmp) / 'bench.sqlite'}", args.candidates, c, args.repeats)
        print(f"| SQLite | {args.candidates} | {c} | {w:.2f} | {d:.2f} | {w / d:.1f}x |")
        if args.pg:
            url = create_pg_database(args.pg)
            try:
                w, d = measure(url, args.candidates, c, args.repeats)
                print(f"| PostgreSQL | {args.candidates} | {c} | {w:.2f} | {d:.2f} | {w / d:.1f}x |")
            finally:
                drop_pg_database(args.pg, url)

if __name__ == "__main__":
    main()
