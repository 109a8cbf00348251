"""Alembic environment: one schema for SQLite and PostgreSQL.

The URL comes from the Alembic config (``atlas.db.alembic_config`` sets it), else from
``FISHER_ATLAS_DATABASE_URL`` / the settings default (the embedded SQLite file). SQLite alterations
run in batch mode (copy-and-move), so the same scripts work on both databases.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from atlas.db import make_engine, normalize_url
from atlas.models import Base

MIGRATION_LOCK_KEY = 0x46495348_41544C53  # "FISHATLS": the advisory lock the migrations hold on PostgreSQL
"""Held for the migration's transaction: a second process migrating at once waits, then finds the schema current
(it failed with a duplicate ``alembic_version`` table)."""

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from atlas.settings import get_settings

        url = get_settings().resolved_database_url()
    return normalize_url(url).render_as_string(hide_password=False)


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade head --sql``)."""
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations against a live database."""
    engine = make_engine(_url(), pool_size=1)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=connection.dialect.name == "sqlite",
                compare_type=True,
            )
            with context.begin_transaction():
                if connection.dialect.name == "postgresql":  # one migrating process at a time (SQLite: its lock)
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
