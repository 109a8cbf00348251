"""Alembic migrations of the FisherAtlas schema, and the functions that run them.

The schema is upgraded by the composition root (:class:`service.container.Container`, embedded mode) or by
``fisher-atlas migrate`` (scale-out prestart); ``alembic upgrade head`` with ``alembic.ini`` works too.
This package sits above ``atlas`` (it reads :mod:`atlas.models`); ``atlas`` never imports it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from atlas.db import make_engine, normalize_url, redact_url
from atlas.errors import DatabaseUnavailable

__all__ = ["alembic_config", "current_revision", "downgrade", "head_revision", "migrations_dir", "require_current",
           "upgrade"]

_migrate_lock = threading.Lock()
log = logging.getLogger(__name__)


def migrations_dir() -> Path:
    """Directory of the Alembic scripts (this package)."""
    return Path(__file__).resolve().parent


def alembic_config(url: str | URL) -> Any:
    """Build an Alembic :class:`~alembic.config.Config` for ``url`` without an ini file."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    rendered = normalize_url(url).render_as_string(hide_password=False)
    cfg.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return cfg


def upgrade(url: str | URL, revision: str = "head") -> None:
    """Upgrade the schema of the database at ``url`` to ``revision`` (default: latest).

    Several processes may upgrade one PostgreSQL database at once (a service and a worker started together):
    the migration takes an advisory lock, so the later ones wait and find the schema current.

    Raises
    ------
    DatabaseUnavailable
        The database cannot be reached or used (one line naming it, its password masked), or its schema is
        at a revision this version does not know (written by a newer FisherAtlas).
    """
    from alembic import command
    from alembic.util import CommandError

    where = redact_url(url)
    try:
        with _migrate_lock, _unusable(where):
            command.upgrade(alembic_config(url), revision)
    except CommandError as exc:
        raise DatabaseUnavailable(
            f"the database at {where} has a schema this FisherAtlas does not know ({_line(exc)}); it was written "
            f"by a newer version: upgrade FisherAtlas (its latest schema revision is {head_revision()})") from None


def require_current(url: str | URL) -> None:
    """Raise unless the database at ``url`` is at this version's latest schema, changing nothing: for commands that
    only read it (``keys list --local`` upgraded a store under the old replicas of a rolling upgrade).

    Raises
    ------
    DatabaseUnavailable
        The database cannot be reached or used, or its schema is at another revision (named, with what to run).
    """
    where = redact_url(url)
    with _unusable(where):
        current = current_revision(url)
    head = head_revision()
    if current != head:
        raise DatabaseUnavailable(f"the database at {where} has schema revision {current or '(none)'}, not this "
                                  f"FisherAtlas's {head}: run `fisher-atlas migrate` first (a command that only reads "
                                  "does not upgrade it)")


@contextlib.contextmanager
def _unusable(where: str) -> Iterator[None]:
    """A database or URL error inside the block as one :class:`DatabaseUnavailable` line naming the database."""
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    try:
        yield
    except (DBAPIError, ArgumentError, NoSuchModuleError, ValueError) as exc:  # ValueError: a URL's bad port
        # The one line below is what users read; the traceback (an error in a migration's own SQL, say) is kept
        # for whoever turns debug logging on.
        log.debug("schema upgrade of %s failed", where, exc_info=True)
        reason = _line(exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc)
        if "readonly database" in reason:  # SQLite: the file may be writable and its directory not (-wal, -shm)
            reason += " (the file and its directory must both be writable: SQLite writes -wal and -shm files beside it)"
        raise DatabaseUnavailable(f"the database at {where} cannot be used: {reason}") from None


def _line(exc: BaseException) -> str:
    """An exception's first line, secrets masked, at most 300 characters."""
    from atlas.redaction import redact_secrets, truncate

    text = str(exc).strip().splitlines()
    return truncate(redact_secrets(text[0] if text else type(exc).__name__))


def downgrade(url: str | URL, revision: str = "base") -> None:
    """Downgrade the schema of the database at ``url`` to ``revision`` (default: empty)."""
    from alembic import command

    with _migrate_lock:
        command.downgrade(alembic_config(url), revision)


def current_revision(url: str | URL) -> str | None:
    """Current Alembic revision of the database at ``url`` (``None`` when unversioned)."""
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    """Latest revision shipped in the ``migrations`` package."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(migrations_dir())).get_current_head()
