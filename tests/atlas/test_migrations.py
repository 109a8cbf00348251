"""Migrations upgrade and downgrade on SQLite and PostgreSQL, and match the models."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

import migrations
from atlas import db
from atlas.models import Base
from tests.store_helpers import create_pg_database, drop_pg_database

TABLES = {
    "spaces", "tasks", "sketch_states", "signatures", "baselines", "uploads", "jobs", "job_checkpoints",
    "changes", "atlas_state", "api_keys",
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.sqlite'}"
        return
    server = request.getfixturevalue("pg_server")
    url = create_pg_database(server)
    yield url
    drop_pg_database(server, url)


def _tables(url: str) -> set[str]:
    engine = db.make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_roundtrip(empty_url: str) -> None:
    assert migrations.current_revision(empty_url) is None
    migrations.upgrade(empty_url)
    assert migrations.current_revision(empty_url) == migrations.head_revision()
    assert _tables(empty_url) >= TABLES

    engine = db.make_engine(empty_url, pool_size=1)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"

    migrations.downgrade(empty_url, "base")
    assert migrations.current_revision(empty_url) is None
    assert _tables(empty_url) & TABLES == set()

    migrations.upgrade(empty_url)  # and up again on the same database
    assert _tables(empty_url) >= TABLES


def test_upgrade_is_idempotent(empty_url: str) -> None:
    migrations.upgrade(empty_url)
    migrations.upgrade(empty_url)
    assert migrations.current_revision(empty_url) == migrations.head_revision()
