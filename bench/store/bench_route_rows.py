"""The route path's per-batch read of its candidates' routing rows: digests (the product) vs whole rows.

Usage::

    python -m bench.store.bench_route_rows --candidates 36 --completion 0 4 16 --repeats 200 \
        --pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres

Every route batch reads the routing rows of its candidates — the FAISS hits plus every completion-mode task of
the space, re-ranked on its prompt-side state (~200 KiB at m = 4096). Before migration 0006 the batch read whole
rows, blobs included; the product now reads the rows without the blob (``task_routing.prompt_digest`` finds the
cached view), and since 2026-11-25 not the held-out scores either (32 per task here, a job's calibration: up to
256 after appends), whose typical score is cached by row version. The three reads (whole rows; digests with the
scores read each batch; the product) are timed in one process, alternating, on a fresh migrated SQLite file and,
with ``--pg``, a fresh PostgreSQL database on that server; medians in ms per batch, printed as one Markdown table.
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
from atlas.routing import resolve, typical_score
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


def _scores_each_batch(session: Session, ids: list[int]) -> object:
    """The read before the typical-score cache: every column but the blob, the held-out scores included (JSON),
    their typical score computed per batch."""
    cols = [c for c in TaskRouting.__table__.columns if c.name != "prompt_state"]
    rows = session.execute(select(*cols, TaskRouting.prompt_state.is_not(None).label("prompt_side"))
                           .where(TaskRouting.task_id.in_(ids)))
    return {r.task_id: (resolve(r, typical_score(r.cal_scores) if r.cal_scores else None)) for r in rows}


def _time(factory: sessionmaker[Session], fn: Callable[[Session, list[int]], object], ids: list[int]) -> float:
    with factory() as s:
        t0 = time.perf_counter()
        fn(s, ids)
        return time.perf_counter() - t0


def measure(url: str, n: int, n_completion: int, repeats: int) -> tuple[float, float, float]:
    """Median ms per batch: (whole rows, digests with the scores read, digests with cached typical scores)."""
    migrations.upgrade(url)
    engine = db.make_engine(url)
    factory = db.session_factory(engine)
    ids = _populate(factory, n, n_completion)
    whole, scores, digest = [], [], []
    for _ in range(repeats):
        whole.append(_time(factory, _whole_rows, ids))
        scores.append(_time(factory, _scores_each_batch, ids))
        digest.append(_time(factory, routing_repo.get_task_routes, ids))
    engine.dispose()
    return tuple(statistics.median(x) * 1e3 for x in (whole, scores, digest))  # type: ignore[return-value]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--candidates", type=int, default=36)
    p.add_argument("--completion", type=int, nargs="+", default=[0, 4, 16])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--pg", default=None, help="PostgreSQL server URL (a database is created and dropped)")
    args = p.parse_args()
    print("| store | candidates | of them completion tasks | whole rows ms | digests, scores read ms "
          "| digests, typical cached (product) ms | product vs whole rows | product vs scores read |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")

    def row(store: str, c: int, w: float, sc: float, d: float) -> None:
        print(f"| {store} | {args.candidates} | {c} | {w:.2f} | {sc:.2f} | {d:.2f} | {w / d:.1f}x | {sc / d:.1f}x |")

    for c in args.completion:
        with tempfile.TemporaryDirectory() as tmp:
            row("SQLite", c, *measure(f"sqlite:///{Path(tmp) / 'bench.sqlite'}", args.candidates, c, args.repeats))
        if args.pg:
            url = create_pg_database(args.pg)
            try:
                row("PostgreSQL", c, *measure(url, args.candidates, c, args.repeats))
            finally:
                drop_pg_database(args.pg, url)

if __name__ == "__main__":
    main()
