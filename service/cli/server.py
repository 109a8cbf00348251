"""Server-side commands: ``serve``, ``worker``, ``migrate`` (act on the local configuration)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli.common import DatabaseUrl, DataDir, Model, fail
from service.logs import LOG_FORMATS, LOG_LEVELS

LogLevel = Annotated[str, typer.Option(envvar="FISHER_ATLAS_LOG_LEVEL",
                                       help="Log level: critical, error, warning, info, debug or trace.")]
LogFormat = Annotated[str, typer.Option(envvar="FISHER_ATLAS_LOG_FORMAT",
                                        help="Log lines as text, or json (one object a line, for a log pipeline).")]

app = typer.Typer()


def settings(**flags: Any) -> Any:
    """Settings from the environment with the given flags on top; a bad value exits 2 with one line naming each
    setting by its environment variable (it printed pydantic's traceback, naming the field only)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from atlas.settings import get_settings

    try:
        return get_settings(**flags)
    except ValidationError as exc:
        raise fail("invalid settings: " + "; ".join(_setting_error(e) for e in exc.errors()), 2) from None
    except SettingsError as exc:  # a list or mapping setting that is not JSON
        found = re.search(r'field "(\w+)"', str(exc))
        name = f"FISHER_ATLAS_{found[1].upper()}" if found else "a setting"
        raise fail(f"invalid settings: {name} must be JSON (a list is written '[\"a\", \"b\"]')", 2) from None


def check_logging(log_level: str, log_format: str) -> tuple[str, str]:
    """``--log-level`` and ``--log-format`` in lower case, or exit 2 naming what they may be (an unknown level was
    uvicorn's ``KeyError`` as a traceback, after the migration)."""
    if log_level.lower() not in LOG_LEVELS:
        raise fail(f"--log-level (FISHER_ATLAS_LOG_LEVEL) must be one of {', '.join(LOG_LEVELS)}, not {log_level!r}",
                   2)
    if log_format.lower() not in LOG_FORMATS:
        raise fail(f"--log-format (FISHER_ATLAS_LOG_FORMAT) must be one of {', '.join(LOG_FORMATS)}, "
                   f"not {log_format!r}", 2)
    return log_level.lower(), log_format.lower()


def check_port_free(host: str, port: int) -> None:
    """Exit 3 at once when ``host:port`` cannot be listened on (a port in use): the service loaded its model, about
    12 s with the bundled one and minutes with a large one, before uvicorn's bind failed."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind(address)
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another service there? choose --port)",
                   3) from None


def _secret(field: str) -> bool:
    """Whether an error line must not repeat the setting's value (a key, or a URL with its password)."""
    return field.endswith("_key") or any(word in field for word in ("password", "secret", "url"))


def _setting_error(error: Any) -> str:
    """One pydantic error as ``FISHER_ATLAS_NAME: message (got value)``."""
    field = str(error["loc"][0]) if error.get("loc") else ""
    name = f"FISHER_ATLAS_{field.upper()}" if field else "settings"
    # a whole-model error (no field) carries every setting as its input: the keys and URLs among them
    shown = "" if not field or _secret(field) or "input" not in error else f" (got {str(error['input'])[:80]!r})"
    return f"{name}: {error['msg']}{shown}"


def migrate_db(s: Any) -> None:
    """Create the data directory and upgrade the schema."""
    from migrations import upgrade

    s.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # uploads and key hashes: owner only
    upgrade(s.resolved_database_url())


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(envvar="FISHER_ATLAS_HOST", help="Bind address (default 127.0.0.1).")]
    = None,
    port: Annotated[int | None, typer.Option(envvar="FISHER_ATLAS_PORT", help="Port (default 8000).")] = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    model: Model = None,
    queue: Annotated[str | None, typer.Option(envvar="FISHER_ATLAS_QUEUE", help="inprocess or celery.")] = None,
    sketch_dim: Annotated[int | None, typer.Option(envvar="FISHER_ATLAS_SKETCH_DIM", help="Signature length m.")]
    = None,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Run the HTTP service (embedded defaults: SQLite, on-disk FAISS, in-process worker, bundled model)."""
    import uvicorn

    from atlas.db import make_engine, session_factory
    from service.app import create_app
    from service.auth import check_bind_allowed, check_origins_allowed, count_active_keys
    from service.logs import app_logging, uvicorn_log_config
    from service.process import AtlasServer, exit_on_stop_signals

    exit_on_stop_signals()  # from the first line: a stop during the migration, or as PID 1

    log_level, log_format = check_logging(log_level, log_format)
    s = settings(host=host, port=port, data_dir=data_dir, database_url=database_url, model=model, queue=queue,
                 sketch_dim=sketch_dim)
    try:
        check_origins_allowed(s)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    migrate_db(s)
    engine = make_engine(s.resolved_database_url(), pool_size=1)
    try:
        with session_factory(engine, readonly=True)() as session:
            n_keys = count_active_keys(session)
    finally:
        engine.dispose()
    try:
        check_bind_allowed(s, n_keys)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    check_port_free(s.host, s.port)
    app_logging(log_level, log_format)
    app = create_app(s)
    server = AtlasServer(uvicorn.Config(app, host=s.host, port=s.port, log_level=log_level, proxy_headers=False,
                                        log_config=uvicorn_log_config(log_format),
                                        timeout_graceful_shutdown=s.shutdown_grace_s), app.state.container)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: uvicorn's own forced exit
        server.run()
    if not server.started:  # its startup failed (uvicorn.run's rule)
        raise fail("the service did not start (see the log above)", 3)


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option(envvar="FISHER_ATLAS_WORKER_CONCURRENCY", help="Jobs run at once.")] = 1,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    model: Model = None,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Run a worker: loads its model, serves routing prompts (Redis) and upload jobs (Celery) of its space."""
    from service.logs import numeric_level, worker_logging
    from service.process import exit_on_stop_signals

    exit_on_stop_signals()  # until Celery's own handlers: a stop during the model's load, or as PID 1
    log_level, log_format = check_logging(log_level, log_format)
    # The Celery app reads its settings from the environment at import: flags become env twins first.
    for value, env in ((data_dir, "DATA_DIR"), (database_url, "DATABASE_URL"), (model, "MODEL")):
        if value is not None:
            os.environ[f"FISHER_ATLAS_{env}"] = str(value)
    migrate_db(settings())
    worker_logging(log_level, log_format)
    from workers.celery_app import run_worker

    run_worker(concurrency=concurrency, loglevel=logging.getLevelName(numeric_level(log_level)),
               banner=log_format == "text")


@app.command()
def migrate(data_dir: DataDir = None, database_url: DatabaseUrl = None) -> None:
    """Upgrade the database schema to the latest revision."""
    from sqlalchemy.engine import make_url

    from migrations import current_revision, head_revision

    s = settings(data_dir=data_dir, database_url=database_url)
    url = s.resolved_database_url()
    sqlite_file = make_url(url).database if url.startswith("sqlite") else None
    exists = sqlite_file is None or (sqlite_file not in ("", ":memory:")
                                     and Path(sqlite_file.removeprefix("file:")).exists())
    try:  # (reading a missing SQLite file would make it)
        before = current_revision(url) if exists else None
    except Exception:  # a database that does not answer: the upgrade below says so, in one line
        before = None
    migrate_db(s)
    shown = make_url(url).render_as_string(hide_password=True)
    head = head_revision()
    said = ("was at it already" if before == head else f"upgraded from {before}" if before else "created")
    print(f"database at {shown} is at the latest schema revision, {head} ({said})")
