"""Fixtures of the store tests (defined in :mod:`tests.atlas.fixtures`, shared with the job tests)."""

from tests.atlas.fixtures import (  # noqa: F401 - pytest discovers fixtures by name
    db_url,
    engine,
    factory,
    pg_database,
    pg_server,
    ro_factory,
    sqlite_template,
)
