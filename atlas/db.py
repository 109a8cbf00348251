"""Engines and sessions.

One schema serves SQLite (embedded) and PostgreSQL (scale-out). SQLite is made to behave like a
proper transactional database:

* WAL journal, foreign keys ON, ``busy_timeout`` so writers wait for each other instead of failing;
* the ``sqlite3`` driver's legacy transaction handling is disabled and SQLAlchemy emits ``BEGIN``
  itself — ``BEGIN IMMEDIATE`` for ordinary sessions, so a read-modify-write transaction holds the
  write lock from its first statement (serialisable, never ``SQLITE_BUSY`` half-way), and a plain
  deferred ``BEGIN`` for read-only sessions (:func:`session_factory` with ``readonly=True``), which
  read a consistent WAL snapshot without blocking writers.

PostgreSQL runs through psycopg 3 at READ COMMITTED; the repositories take row locks
(``SELECT ... FOR UPDATE``) or use conditional ``UPDATE`` statements where they read and then write.

Migrations are Alembic scripts in the top-level ``migrations`` package, which also holds the functions
that run them (``migrations.upgrade``): the composition root migrates the embedded SQLite file at start,
the compose prestart runs ``fisher-atlas migrate``. ``atlas`` never imports ``migrations``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""Default wait of a SQLite writer for the write lock before failing, for workers, migrations and tools
(they should wait); the service's store passes ``settings.db_busy_timeout_s`` (5 s) and answers 503."""

POOL_TIMEOUT_S = 5.0
"""Default wait for a pooled connection before failing (``settings.db_pool_timeout_s``)."""

_READONLY = "atlas_readonly"


def normalize_url(url: str | URL) -> URL:
    """Return a SQLAlchemy URL, mapping plain PostgreSQL URLs to the psycopg 3 driver.

    Parameters
    ----------
    url
        ``sqlite:///path``, ``postgresql://...``, ``postgres://...`` or a full SQLAlchemy URL.
    """
    u = make_url(str(url)) if not isinstance(url, URL) else url
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u


def redact_url(url: str | URL) -> str:
    """A database (or broker) URL safe to print: the password replaced by ``***``.

    Strings that do not parse as a SQLAlchemy URL have any ``user:password@`` part masked.
    """
    try:
        return make_url(str(url)).render_as_string(hide_password=True)
    except Exception:
        from atlas.redaction import redact_secrets

        return redact_secrets(str(url))


_STORAGE_FAULTS = ("readonly database", "read-only", "unable to open database file", "disk i/o error",
                   "database or disk is full", "file is not a database")
"""SQLite's (and PostgreSQL's read-only) errors that no retry cures: the data directory must be mended."""


def storage_fault(exc: BaseException) -> str | None:
    """The driver's message when a database error is a storage fault a retry cannot cure (a read-only or full
    data directory, a file that is no database), else None."""
    text = str(getattr(exc, "orig", exc)).strip()
    return text.splitlines()[0] if text and any(f in text.lower() for f in _STORAGE_FAULTS) else None


def is_busy_error(exc: BaseException) -> bool:
    """Whether a database error means "busy, retry later": a lock wait or a pool wait ran out.

    SQLite's ``database is locked`` / ``database table is locked`` (the busy timeout elapsed), the
    pool's timeout, and PostgreSQL lock or statement timeouts and unreachable servers. Not a
    :func:`storage_fault`.
    """
    from sqlalchemy.exc import DBAPIError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, PoolTimeout):
        return True
    if storage_fault(exc) is not None:
        return False
    if isinstance(exc, OperationalError):  # locked, busy, unreachable: never the request's fault
        text = str(getattr(exc, "orig", exc)).lower()
        return not any(bug in text for bug in ("no such table", "no such column", "syntax error"))
    if isinstance(exc, DBAPIError):
        text = str(getattr(exc, "orig", exc)).lower()
        return "lock timeout" in text or "statement timeout" in text or "canceling statement" in text
    return False


_UNREACHABLE = ("connection failed", "connection refused", "could not connect", "terminating connection",
                "server closed the connection", "not currently accepting connections", "the database system is",
                "connection is closed", "connection not open", "could not receive data", "could not send data")


def is_unreachable_error(exc: BaseException) -> bool:
    """Whether a :func:`is_busy_error` is the server being out of reach (down, restarting, refusing connections)
    rather than busy: a broken connection, or one that could not be made."""
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return False
    text = str(getattr(exc, "orig", exc)).lower()
    return bool(exc.connection_invalidated) or any(marker in text for marker in _UNREACHABLE)


def make_engine(
    url: str | URL, *, echo: bool = False, pool_size: int = 10, busy_timeout_s: float | None = None,
    pool_timeout_s: float | None = None,
) -> Engine:
    """Create an engine configured for FisherAtlas.

    Parameters
    ----------
    url
        Database URL (see :func:`normalize_url`).
    echo
        Log SQL statements.
    pool_size
        Connection pool size (PostgreSQL; SQLite uses the default queue pool as well).
    busy_timeout_s
        SQLite: longest wait for the write lock (default :data:`SQLITE_BUSY_TIMEOUT_MS`); then the
        statement fails with ``database is locked`` (rendered 503 by the service). PostgreSQL, only when
        given: the session's ``lock_timeout`` (the service's store; migrations and workers keep waiting).
    pool_timeout_s
        Longest wait for a free pooled connection (default :data:`POOL_TIMEOUT_S`).

    Returns
    -------
    Engine
        For SQLite: WAL, foreign keys, busy timeout, ``BEGIN IMMEDIATE`` per transaction (deferred
        ``BEGIN`` when the connection carries the read-only execution option).
    """
    u = normalize_url(url)
    busy_ms = int(1000 * busy_timeout_s) if busy_timeout_s is not None else SQLITE_BUSY_TIMEOUT_MS
    pool_timeout = pool_timeout_s if pool_timeout_s is not None else POOL_TIMEOUT_S
    if u.get_backend_name() == "sqlite":
        database = u.database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            u,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": busy_ms / 1000},
            pool_size=pool_size,
            max_overflow=2 * pool_size,
            pool_timeout=pool_timeout,
            pool_pre_ping=False,
        )
        _install_sqlite_hooks(engine, busy_ms)
        return engine
    connect_args: dict[str, Any] = {}
    if busy_timeout_s is not None and u.get_backend_name() == "postgresql":
        # the same bound on waiting for a row or table lock held by another transaction
        connect_args["options"] = f"-c lock_timeout={busy_ms}"
    return create_engine(
        u, echo=echo, pool_size=pool_size, max_overflow=2 * pool_size, pool_pre_ping=True, pool_timeout=pool_timeout,
        connect_args=connect_args,
    )


def _install_sqlite_hooks(engine: Engine, busy_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the driver (see module docstring).
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get(_READONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def session_factory(engine: Engine, *, readonly: bool = False) -> sessionmaker[Session]:
    """Return a session factory bound to ``engine``.

    Parameters
    ----------
    engine
        From :func:`make_engine`.
    readonly
        On SQLite, sessions start a deferred transaction (a snapshot read that never takes the write
        lock). Use only for sessions that do not write. No effect on PostgreSQL.

    Notes
    -----
    Repository functions never commit; use ``with factory.begin() as session:`` to run one unit of
    work in one transaction.
    """
    bind = engine.execution_options(**{_READONLY: True}) if readonly else engine
    return sessionmaker(bind=bind, expire_on_commit=False)


# --------------------------------------------------------------------------------------------------
# Alembic
# --------------------------------------------------------------------------------------------------



def probe_write_lock(url: str | URL, timeout_s: float = 0.25) -> str | None:
    """Whether a writer could start now: ``None`` if so, else a short reason (no path, no secret).

    SQLite: a fresh connection (not from a pool) tries ``BEGIN IMMEDIATE`` for at most ``timeout_s``
    and rolls back. Other databases have no database-wide write lock: always ``None``.
    """
    import sqlite3

    u = normalize_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    try:
        con = sqlite3.connect(u.database, timeout=timeout_s, isolation_level=None, uri=u.database.startswith("file:"))
    except sqlite3.Error as exc:
        return f"cannot open the database ({type(exc).__name__})"
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
        return None
    except sqlite3.OperationalError as exc:
        return "locked by another writer" if "locked" in str(exc).lower() or "busy" in str(exc).lower() \
            else type(exc).__name__
    finally:
        con.close()


def read_snapshot(session: Session) -> None:
    """Make every statement of a fresh read session see one snapshot (call it before the first statement).

    PostgreSQL's default (READ COMMITTED) takes a snapshot per statement, so a page's ``total`` could disagree
    with its items while rows are added, and an export could read a task's state before a job's append and its
    signature after it; REPEATABLE READ (reset when the connection returns to the pool) gives one. SQLite's read
    sessions are one snapshot already.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})

