"""Alembic migrations of the FisherAtlas schema, and the functions that run them.

The schema is upgraded by the composition root (:class:`service.container.Container`, embedded mode) or by
``fisher-atlas migrate`` (scale-out prestart); ``alembic upgrade head`` with ``alembic.ini`` works too.
This package sits above ``atlas`` (it reads :mod:`atlas.models`); ``atlas`` never imports it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from atlas.db import make_engine, normalize_url, redact_url
from atlas.errors import DatabaseUnavailable

__all__ = ["alembic_config", "current_revision", "downgrade", "head_revision", "migrations_dir", "upgrade"]

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
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    where = redact_url(url)
    try:
        with _migrate_lock:
            command.upgrade(alembic_config(url), revision)
    except CommandError as exc:
        raise DatabaseUnavailable(
            f"the database at {where} has a schema this FisherAtlas does not know ({_line(exc)}); it was written "
            f"by a newer version: upgrade FisherAtlas (its latest schema revision is {head_revision()})") from None
    except (DBAPIError, ArgumentError, NoSuchModuleError, ValueError) as exc:  # ValueError: a URL's bad port
        # The one line below is what users read; the traceback (an error in a migration's own SQL, say) is kept
        # for whoever turns debug logging on.
        log.debug("schema upgrade of %s failed", where, exc_info=True)
        reason = _line(exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc)
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
