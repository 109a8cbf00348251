"""Database fixtures shared by the store and job tests: one parametrised ``db_url`` over SQLite and PostgreSQL.

* SQLite: a fresh file per test (copied from a file migrated once per session).
* PostgreSQL (127.0.0.1:5432 unless ``FISHER_ATLAS_TEST_PG_URL`` names another server): one fresh
  database ``fa_test_<random>`` per test session, migrated once, emptied before every test and
  dropped at the end. The cases skip, saying why, only if the server cannot be reached.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

import migrations
from atlas import db, repository
from atlas.models import Base, Space
from tests.store_helpers import create_pg_database, drop_pg_database, insert_ready_tasks

PG_SERVER_URL = os.environ.get("FISHER_ATLAS_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session."""
    path = tmp_path_factory.mktemp("sqlite-template") / "atlas.sqlite"
    migrations.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """URL of the PostgreSQL maintenance database; skip if the server is unreachable."""
    engine = create_engine(PG_SERVER_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        engine.dispose()
        pytest.skip(f"PostgreSQL at {make_url(PG_SERVER_URL).render_as_string()} is unreachable: {exc}")
    engine.dispose()
    yield PG_SERVER_URL


@pytest.fixture(scope="session")
def pg_database(pg_server: str) -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated to head."""
    url = create_pg_database(pg_server)
    migrations.upgrade(url)
    yield url
    drop_pg_database(pg_server, url)


def reset_pg(url: str) -> None:
    """Empty every table and reset the change sequence (a brand-new database, schema kept)."""
    engine = db.make_engine(url, pool_size=1)
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
        conn.execute(
            text("INSERT INTO atlas_state (id, instance_id, last_seq, pruned_seq) VALUES (1, :i, 0, 0)"),
            {"i": str(uuid.uuid4())},
        )
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty, migrated database: SQLite file or PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "atlas.sqlite"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
    else:
        url = request.getfixturevalue("pg_database")
        reset_pg(url)
        yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """Engine of :func:`db_url`."""
    eng = db.make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    """Read-write session factory."""
    return db.session_factory(engine)


@pytest.fixture
def ro_factory(engine: Engine) -> sessionmaker[Session]:
    """Read-only session factory."""
    return db.session_factory(engine, readonly=True)


def make_space(factory: sessionmaker[Session], m: int = 64, key: str = "model-a") -> Space:
    """Create (or get) a test space with signature length ``m``."""
    with factory.begin() as s:
        return repository.get_or_create_space(
            s, model_fingerprint=key, spec_fingerprint=f"spec-m{m}", model_name="tiny", d=8, K=16, m=m, seed=0,
            spec={"d": 8, "K": 16, "m": m, "seed": 0},
        )


def unit_vectors(n: int, m: int, seed: int = 0):
    """``n`` random unit float32 vectors of length ``m``."""
    import numpy as np

    x = np.random.default_rng(seed).standard_normal((n, m)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def add_ready_task(factory: sessionmaker[Session], space_id: int, name: str, vector, *, state: bytes = b"S") -> int:
    """Create a task and store a result for it directly (no worker): returns the task id."""
    from atlas.samples import Sample

    with factory.begin() as s:
        task, _ = repository.create_task_with_job(s, space_id, name, "text", {}, [Sample(text=name)])
        repository.store_task_result(
            s, task, state=state, signature=vector, baselines=b"B", n_samples=1, n_tokens=3
        )
        return task.id


def bulk_ready_tasks(factory: sessionmaker[Session], space_id: int, vectors, prefix: str = "bulk") -> list[int]:
    """Ready tasks ``<prefix><i>`` with signatures, in bulk (:func:`tests.store_helpers.insert_ready_tasks`)."""
    with factory.begin() as s:
        return insert_ready_tasks(s, space_id, [f"{prefix}{i}" for i in range(len(vectors))], vectors)


def random_state(spec: Any, seed: int) -> Any:
    """A small valid :class:`fishersketch.SketchState` of ``spec`` (3 + 4 draws, 3 tokens) with random sums."""
    import numpy as np

    from fishersketch import SketchState

    rng = np.random.default_rng(seed)
    return SketchState(spec, rng.standard_normal((2, 3, spec.m)), rng.random((2, 3)) + 1, np.array([3, 4]),
                       np.array([1, 2]))
