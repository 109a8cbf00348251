"""Search latency / QPS, IVF recall@10 and rebuild-from-SQL time of the FAISS index (m = 4096).

Usage::

    nice python -m bench.store.bench_index --sizes 1000 10000 100000 --out bench/out/store/index.json

For each N: a fresh embedded store (SQLite, migrated) is bulk-loaded with N clustered unit signatures;
``IndexManager.open()`` builds the flat index from SQL (the timed "rebuild"); single-query latency
(k = 10) is measured over ``--queries`` queries; then the IVF index (nlist = sqrt(N)) is built and its
recall@10 against flat measured for several ``nprobe``. With ``--pg URL`` the largest size is also
loaded into PostgreSQL and rebuilt from there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

import migrations
from atlas import db
from atlas.index import IndexManager
from bench.store.common import bulk_load, clustered_unit_vectors, create_pg_database, drop_pg_database, make_space

K = 10


def latency(index: IndexManager, space_id: int, queries: np.ndarray) -> dict[str, float]:
    """Single-query latencies (ms) and the sequential QPS they imply, plus batched QPS."""
    index.search(space_id, queries[:2], K)  # warm-up
    times = []
    for q in queries:
        t0 = time.perf_counter()
        index.search(space_id, q, K)
        times.append(time.perf_counter() - t0)
    t = np.array(times) * 1000
    t0 = time.perf_counter()
    index.search(space_id, queries, K)
    batch_s = time.perf_counter() - t0
    return {"p50_ms": float(np.percentile(t, 50)), "p99_ms": float(np.percentile(t, 99)),
            "qps": float(len(t) / (t.sum() / 1000)), "batch_qps": float(len(queries) / batch_s)}


def recall(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a.tolist()) & set(e.tolist())) / K for a, e in zip(approx, exact, strict=True)]))


def run_size(n: int, m: int, n_queries: int, root: Path, clusters: int, spread: float,
             nprobes: list[int]) -> dict[str, object]:
    work = root / f"n{n}"
    work.mkdir(parents=True)
    url = f"sqlite:///{work / 'atlas.sqlite'}"
    migrations.upgrade(url)
    engine = db.make_engine(url)
    factory, ro = db.session_factory(engine), db.session_factory(engine, readonly=True)
    space_id = make_space(factory, m)
    _, load_s = bulk_load(factory, space_id, clustered_unit_vectors(n, m, clusters=clusters, spread=spread,
                                                                          seed=1))
    queries = _fresh_queries(n_queries, m, clusters, spread)  # new draws from the same families
    out: dict[str, object] = {"n": n, "m": m, "load_s": load_s,
                              "sqlite_bytes": (work / "atlas.sqlite").stat().st_size}

    flat = IndexManager(ro, work / "flat", kind="flat")
    t0 = time.perf_counter()
    flat.open()
    out["flat_rebuild_s"] = time.perf_counter() - t0
    out["flat"] = latency(flat, space_id, queries)
    t0 = time.perf_counter()
    flat.persist()
    out["flat_persist_s"] = time.perf_counter() - t0
    reopened = IndexManager(ro, work / "flat", kind="flat")
    t0 = time.perf_counter()
    report = reopened.open()[0]
    out["flat_load_s"] = time.perf_counter() - t0
    assert report.action == "loaded", report
    del reopened
    _, exact = flat.search(space_id, queries, K)
    del flat

    ivf = IndexManager(ro, work / "ivf", kind="ivf", ivf_min_size=1000)
    t0 = time.perf_counter()
    ivf.open()
    out["ivf_build_s"] = time.perf_counter() - t0
    out["ivf_nlist"] = ivf.stats(space_id)["nlist"]
    out["ivf"] = {}
    for nprobe in nprobes:
        si = ivf._spaces[space_id]
        faiss.extract_index_ivf(si.index).nprobe = nprobe
        _, approx = ivf.search(space_id, queries, K)
        out["ivf"][str(nprobe)] = latency(ivf, space_id, queries) | {"recall_at_10": recall(approx, exact)}
    del ivf
    engine.dispose()
    shutil.rmtree(work)
    return out


def _fresh_queries(n: int, m: int, clusters: int, spread: float) -> np.ndarray:
    centers = np.random.default_rng(1).standard_normal((clusters, m)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    rng = np.random.default_rng(12345)
    x = centers[rng.integers(0, clusters, n)] + spread * rng.standard_normal((n, m)).astype(np.float32) / np.sqrt(m)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def pg_rebuild(pg_server: str, n: int, m: int, clusters: int, spread: float) -> dict[str, float]:
    """Load N signatures into a fresh PostgreSQL database and time the index rebuild from it."""
    url = create_pg_database(pg_server)
    try:
        migrations.upgrade(url)
        engine = db.make_engine(url)
        factory = db.session_factory(engine)
        space_id = make_space(factory, m)
        _, load_s = bulk_load(factory, space_id, clustered_unit_vectors(n, m, clusters=clusters, spread=spread,
                                                                         seed=1))
        index = IndexManager(factory, None)
        t0 = time.perf_counter()
        index.open()
        rebuild_s = time.perf_counter() - t0
        assert index.stats(space_id)["count"] == n
        engine.dispose()
        return {"n": n, "load_s": load_s, "flat_rebuild_s": rebuild_s}
    finally:
        drop_pg_database(pg_server, url)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--clusters", type=int, default=200)
    p.add_argument("--spread", type=float, default=1.0)
    p.add_argument("--nprobe", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--threads", type=int, default=1, help="FAISS OpenMP threads")
    p.add_argument("--pg", default=None, help="PostgreSQL server URL: also time the rebuild at the largest N")
    p.add_argument("--out", type=Path, default=Path("bench/out/store/index.json"))
    args = p.parse_args()
    faiss.omp_set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="fa-bench-index-"))
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "sizes": []}
    try:
        for n in args.sizes:
            r = run_size(n, args.m, args.queries, root, args.clusters, args.spread, args.nprobe)
            print(json.dumps(r), flush=True)
            results["sizes"].append(r)
        if args.pg:
            r = pg_rebuild(args.pg, max(args.sizes), args.m, args.clusters, args.spread)
            print(json.dumps({"postgresql": r}), flush=True)
            results["postgresql"] = r
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
