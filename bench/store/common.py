"""Helpers of the store benchmarks: synthetic signatures and bulk loading into a real store."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import numpy as np
from sqlalchemy import create_engine, insert, make_url, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from atlas import repository
from atlas.models import AtlasState, Change, Signature, Task, utcnow


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
        now = utcnow()
        k = len(vectors)
        with factory.begin() as s:
            names = [f"t{n + i}" for i in range(k)]
            s.execute(insert(Task), [
                {"space_id": space_id, "name": name, "meta": {}, "mode": "text", "status": "ready", "n_samples": 1,
                 "n_tokens": 1, "version": 1, "created_at": now, "updated_at": now} for name in names
            ])
            ids = dict(s.execute(select(Task.name, Task.id).where(Task.space_id == space_id,
                                                                   Task.name.in_(names))).all())
            s.execute(insert(Signature), [
                {"task_id": ids[name], "space_id": space_id, "version": 1,
                 "vector": vectors[i].astype("<f4").tobytes(), "updated_at": now} for i, name in enumerate(names)
            ])
            last = s.execute(update(AtlasState).where(AtlasState.id == 1).values(last_seq=AtlasState.last_seq + k)
                             .returning(AtlasState.last_seq)).scalar_one()
            s.execute(insert(Change), [
                {"seq": last - k + 1 + i, "space_id": space_id, "task_id": ids[name], "op": "upsert", "at": now}
                for i, name in enumerate(names)
            ])
        n += k
    return n, time.perf_counter() - t0


def create_pg_database(server_url: str) -> str:
    """Create an empty PostgreSQL database ``fa_bench_<random>`` and return its URL."""
    name = f"fa_bench_{uuid.uuid4().hex[:10]}"
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(server_url: str, url: str) -> None:
    """Drop a database made by :func:`create_pg_database`."""
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    engine.dispose()
