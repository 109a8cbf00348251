"""Store helpers shared by the tests and the store benchmarks (plain functions, no pytest).

* :func:`create_pg_database` / :func:`drop_pg_database`: throw-away PostgreSQL databases.
* :func:`pg_outage`: one database of the server refuses connections and loses its sessions for a while.
* :func:`insert_ready_tasks`: ready tasks with signatures in bulk (core inserts, one change row per
  task), for tests and benchmarks that need many signatures quickly. The product path is
  ``repository.create_task_with_job`` + ``repository.store_task_result``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import numpy as np
from sqlalchemy import create_engine, insert, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from atlas.models import AtlasState, Change, Signature, Task, utcnow


def pg_outage(db_url: str, seconds: float) -> None:
    """The database of ``db_url`` (on 127.0.0.1:5432) refuses connections and its sessions are terminated, as in a
    restart, for ``seconds``; the server and its other databases stay up (tests share it)."""
    import psycopg

    name = make_url(db_url).database
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                          "AND pid <> pg_backend_pid()", (name,))
            time.sleep(seconds)
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def create_pg_database(server_url: str, prefix: str = "fa_test") -> str:
    """Create an empty database ``<prefix>_<random>`` on the server and return its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(server_url: str, url: str) -> None:
    """Drop a database created by :func:`create_pg_database` (terminating its connections)."""
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    engine.dispose()


def insert_ready_tasks(session: Session, space_id: int, names: Sequence[str], vectors: np.ndarray) -> list[int]:
    """Insert ready tasks ``names`` with signatures ``vectors`` (one row each) and their change rows.

    Returns the task ids in the order of ``names``.
    """
    now = utcnow()
    n = len(names)
    session.execute(insert(Task), [
        {"space_id": space_id, "name": name, "meta": {}, "mode": "text", "status": "ready", "n_samples": 1,
         "n_tokens": 1, "version": 1, "created_at": now, "updated_at": now} for name in names
    ])
    by_name = dict(session.execute(
        select(Task.name, Task.id).where(Task.space_id == space_id, Task.name.in_(names))
    ).all())
    ids = [int(by_name[name]) for name in names]
    session.execute(insert(Signature), [
        {"task_id": tid, "space_id": space_id, "version": 1, "vector": vectors[i].astype("<f4").tobytes(),
         "updated_at": now} for i, tid in enumerate(ids)
    ])
    last = session.execute(
        update(AtlasState).where(AtlasState.id == 1).values(last_seq=AtlasState.last_seq + n)
        .returning(AtlasState.last_seq)
    ).scalar_one()
    session.execute(insert(Change), [
        {"seq": last - n + 1 + i, "space_id": space_id, "task_id": tid, "op": "upsert", "at": now}
        for i, tid in enumerate(ids)
    ])
    return ids
