"""The poll of the readers that keep current: the change log's head and marks, in one statement or in two.

Usage::

    python -m bench.store.bench_head --changes 1000 --repeats 500 \
        --pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres

The state cache and the index catch-up of every replica poll the change log several times a second to see whether
anything changed (and whether the database was restored under them: the mark of the change at their watermark).
When nothing changed, the poll was two statements (``last_seq``, then the mark at the watermark); it is now one
(:func:`atlas.changes.head`). Both are timed in one process, alternating, each in its own session as a sync opens
one, on a fresh migrated SQLite file and, with ``--pg``, a fresh PostgreSQL database; medians in ms per poll,
printed as one Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy.orm import Session

import migrations
from atlas import changes, db
from bench.store.common import bulk_load, clustered_unit_vectors, create_pg_database, drop_pg_database, make_space


def _two_statements(session: Session, watermark: int) -> object:
    """The poll before: the head, then the mark of the change at the watermark."""
    return changes.last_seq(session), changes.mark(session, watermark)


def _one_statement(session: Session, watermark: int) -> object:
    """The product's poll."""
    return changes.head(session, watermark)


def measure(url: str, n_changes: int, repeats: int) -> tuple[float, float]:
    """Median ms per poll when nothing changed (the watermark is the head): (two statements, one)."""
    migrations.upgrade(url)
    engine = db.make_engine(url)
    factory = db.session_factory(engine)
    bulk_load(factory, make_space(factory, 16), clustered_unit_vectors(n_changes, 16, clusters=4, spread=0.1, seed=0))
    with factory() as s:
        watermark = changes.last_seq(s)
    timings: dict[str, list[float]] = {"two": [], "one": []}
    for _ in range(repeats):
        for key, poll in (("two", _two_statements), ("one", _one_statement)):
            with factory() as s:
                t0 = time.perf_counter()
                poll(s, watermark)
                timings[key].append(time.perf_counter() - t0)
    engine.dispose()
    return statistics.median(timings["two"]) * 1e3, statistics.median(timings["one"]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--changes", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=500)
    p.add_argument("--pg", default=None, help="PostgreSQL server URL (a database is created and dropped)")
    args = p.parse_args()
    print("| store | changes in the log | two statements ms | one (product) ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        two, one = measure(f"sqlite:///{Path(tmp) / 'bench.sqlite'}", args.changes, args.repeats)
    print(f"| SQLite | {args.changes} | {two:.3f} | {one:.3f} | {two / one:.2f}x |")
    if args.pg:
        url = create_pg_database(args.pg)
        try:
            two, one = measure(url, args.changes, args.repeats)
            print(f"| PostgreSQL | {args.changes} | {two:.3f} | {one:.3f} | {two / one:.2f}x |")
        finally:
            drop_pg_database(args.pg, url)


if __name__ == "__main__":
    main()
