"""Engine configuration: SQLite pragmas and transaction modes, URL normalisation."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import text

from atlas import db


def test_url_normalisation() -> None:
    assert db.normalize_url("postgresql://u@h/x").drivername == "postgresql+psycopg"
    assert db.normalize_url("postgres://u@h/x").drivername == "postgresql+psycopg"
    assert db.normalize_url("sqlite:///a.db").drivername == "sqlite"


def test_sqlite_pragmas_and_transactions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sub' / 'x.sqlite'}"  # parent directory is created
    engine = db.make_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar_one() == 1
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
        conn.commit()
    rw, ro = db.session_factory(engine), db.session_factory(engine, readonly=True)

    # A read-only session reads a snapshot while a writer holds the write lock, without waiting.
    with rw.begin() as writer:
        writer.execute(text("INSERT INTO t VALUES (1)"))
        t0 = time.perf_counter()
        with ro() as reader:
            assert reader.execute(text("SELECT count(*) FROM t")).scalar_one() == 0
        assert time.perf_counter() - t0 < 1.0

    # Writers are serialised from their first statement (BEGIN IMMEDIATE): no lost update.
    def bump() -> None:
        for _ in range(20):
            with rw.begin() as s:
                x = s.execute(text("SELECT max(x) FROM t")).scalar_one()
                s.execute(text("INSERT INTO t VALUES (:x)"), {"x": x + 1})

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with ro() as s:
        assert s.execute(text("SELECT count(DISTINCT x), max(x) FROM t")).one() == (81, 81)
    engine.dispose()
