"""Candidate search: flat vs the two-stage index (projected IVF + exact re-rank), m = 4096.

Usage::

    nice python -m bench.store.bench_index --sizes 10000 100000 --out bench/out/store/index.json

For each N: a fresh embedded store (SQLite, migrated) is bulk-loaded with N unit signatures
(``--shape task_like``: :class:`TaskLike`, families and sub-families with a decaying spectrum;
``isotropic``: cluster centres plus isotropic noise); ``IndexManager.open()`` builds each index
from SQL (timed: the build); single-query latency (k = 10, one query per call) over ``--queries``
fresh queries; recall@10 of the two-stage index against the exact flat one for several ``nprobe``;
bytes per task of the persisted files. With ``--pg URL`` the largest size is also loaded into
PostgreSQL and the flat index rebuilt from there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
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


class TaskLike:
    """Synthetic signatures shaped like real ones: families of tasks, sub-families, low-rank spread.

    A latent space of ``rank`` directions with a decaying spectrum (``j ** -0.6``), ``families``
    family centres, ``subs`` sub-family centres per family (spread 0.7), tasks around those (spread
    ``within``), mapped into ``m`` dimensions by a random orthonormal basis, normalised, plus
    isotropic noise ``iso`` (then normalised again). Mean top-10 cosine of a query ~0.5; median
    cosine ~0 (``--shape isotropic`` is the older, harder mixture of ``bench.store.common``).
    """

    def __init__(self, m: int, *, seed: int = 1, families: int = 40, subs: int = 25, rank: int = 256,
                 within: float = 1.0, iso: float = 0.8) -> None:
        rng = np.random.default_rng(seed)
        self.m, self.rank, self.within, self.iso = m, rank, within, iso
        self.basis = np.linalg.qr(rng.standard_normal((m, rank)).astype(np.float32))[0].T
        self.s = (np.arange(1, rank + 1) ** -0.6).astype(np.float32)
        fam = rng.standard_normal((families, rank)).astype(np.float32) * self.s
        sub = fam[:, None, :] + 0.7 * rng.standard_normal((families, subs, rank)).astype(np.float32) * self.s
        self.sub = sub.reshape(-1, self.rank)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        z = self.sub[rng.integers(0, len(self.sub), n)]
        z = z + self.within * rng.standard_normal((n, self.rank)).astype(np.float32) * self.s
        x = z @ self.basis
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        x += self.iso * rng.standard_normal((n, self.m)).astype(np.float32) / np.sqrt(self.m)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def chunks(self, n: int, seed: int, chunk: int = 5000) -> Iterator[np.ndarray]:
        for start in range(0, n, chunk):
            yield self.draw(min(chunk, n - start), np.random.default_rng([seed, start]))


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.faiss"))


def run_size(n: int, m: int, n_queries: int, root: Path, args: argparse.Namespace) -> dict[str, object]:
    work = root / f"n{n}"
    work.mkdir(parents=True)
    url = f"sqlite:///{work / 'atlas.sqlite'}"
    migrations.upgrade(url)
    engine = db.make_engine(url)
    factory, ro = db.session_factory(engine), db.session_factory(engine, readonly=True)
    space_id = make_space(factory, m)
    if args.shape == "task_like":
        gen = TaskLike(m)
        _, load_s = bulk_load(factory, space_id, gen.chunks(n, seed=1))
        queries = gen.draw(n_queries, np.random.default_rng(12345))  # fresh draws from the same families
    else:
        chunks = clustered_unit_vectors(n, m, clusters=args.clusters, spread=args.spread, seed=1)
        _, load_s = bulk_load(factory, space_id, chunks)
        queries = _fresh_queries(n_queries, m, args.clusters, args.spread)
    out: dict[str, object] = {"n": n, "m": m, "shape": args.shape, "load_s": load_s}

    flat = IndexManager(ro, work / "flat", kind="flat")
    t0 = time.perf_counter()
    flat.open()
    out["flat_build_s"] = time.perf_counter() - t0
    out["flat"] = latency(flat, space_id, queries)
    flat.persist()
    out["flat_bytes_per_task"] = _dir_bytes(work / "flat") / n
    exact = flat.search(space_id, queries, K)[1]
    del flat

    ivf = IndexManager(ro, work / "ivf", kind="auto", ivf_min_size=min(n, 4096), coarse_dim=args.dim)
    t0 = time.perf_counter()
    ivf.open()
    out["ivf_build_s"] = time.perf_counter() - t0
    out["ivf_nlist"] = ivf.stats(space_id)["nlist"]
    t0 = time.perf_counter()
    ivf.persist()
    out["ivf_persist_s"] = time.perf_counter() - t0
    out["ivf_bytes_per_task"] = _dir_bytes(work / "ivf") / n
    reopened = IndexManager(ro, work / "ivf", kind="auto", ivf_min_size=min(n, 4096), coarse_dim=args.dim)
    t0 = time.perf_counter()
    assert reopened.open()[0].action == "loaded"
    out["ivf_load_s"] = time.perf_counter() - t0
    del reopened
    out["ivf"] = {}
    for nprobe in args.nprobe:
        ivf._spaces[space_id].index.nprobe = nprobe
        approx = ivf.search(space_id, queries, K)[1]
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
    p.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--clusters", type=int, default=200)
    p.add_argument("--spread", type=float, default=1.0)
    p.add_argument("--nprobe", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--shape", choices=["task_like", "isotropic"], default="task_like")
    p.add_argument("--dim", type=int, default=256, help="coarse code length of the two-stage index")
    p.add_argument("--threads", type=int, default=1, help="FAISS OpenMP threads")
    p.add_argument("--pg", default=None, help="PostgreSQL server URL: also time the rebuild at the largest N")
    p.add_argument("--out", type=Path, default=Path("bench/out/store/index.json"))
    args = p.parse_args()
    faiss.omp_set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="fa-bench-index-"))
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "sizes": []}
    try:
        for n in args.sizes:
            r = run_size(n, args.m, args.queries, root, args)
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
