"""The SQL store of one service: engine, read and write sessions, migrations, space resolution.

SQL is the truth; everything else (FAISS, caches) is derived from it. Reads use a read-only session
factory (a snapshot on SQLite, never taking the write lock); writes use ``store.write.begin()``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from atlas import space_repository as spaces_sql
from atlas.db import make_engine, session_factory
from atlas.errors import AtlasError, Conflict, DatabaseUnavailable, ModelUnavailable, NotFound
from atlas.models import Space
from atlas.samples import is_storable_text
from atlas.settings import Settings
from fishersketch import SketchSpec

log = logging.getLogger(__name__)


class Store:
    """Database engine and session factories of one service (see the module docstring).

    Parameters
    ----------
    settings : Settings
    pool_size : int
        Connections kept open.

    The schema must exist (``migrations.upgrade``, run by the composition root or ``fisher-atlas migrate``).
    """

    def __init__(self, settings: Settings, *, pool_size: int = 8) -> None:
        self.settings = settings
        url = settings.resolved_database_url()
        busy, wait = settings.db_busy_timeout_s, settings.db_pool_timeout_s
        self.engine: Engine = make_engine(url, pool_size=pool_size, busy_timeout_s=busy, pool_timeout_s=wait)
        # reads have their own pool: they never queue behind writers waiting for the lock
        self.read_engine: Engine = make_engine(url, pool_size=pool_size, busy_timeout_s=busy, pool_timeout_s=wait)
        self.write: sessionmaker[Session] = session_factory(self.engine)
        self.read: sessionmaker[Session] = session_factory(self.read_engine, readonly=True)
        self.default_space_id: int | None = None
        self.fingerprint_aliases: dict[str, str] = {}
        """Earlier model fingerprints of the loaded model → its current one (an import maps through them)."""
        self.model_error: str | None = None
        """Why the embedded model did not load (set by the composition root): no space can exist before it."""
        self.is_served: Callable[[Space], bool] | None = None
        """Whether a live worker serves a space (set by the composition root of a replica without a model): among
        spaces of one model and sketch spec, the default is a served one."""
        self._specs: dict[int, SketchSpec] = {}
        self._said_fallback: set[str] = set()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A read-write transaction, committed on success."""
        with self.write.begin() as session:
            yield session

    def ping(self) -> None:
        """One trivial read, and whether writes could succeed (raises when the database does not answer, or
        :class:`DatabaseUnavailable` when it is read-only: a read-only data directory answered every write
        with "busy, retry" while readiness said yes)."""
        with self.read() as session:
            session.execute(text("SELECT 1"))
            url = self.engine.url
            if url.get_backend_name() == "postgresql":
                read_only = session.execute(text("SHOW transaction_read_only")).scalar_one() == "on"
            else:  # a read-only URI (file:…?mode=ro&uri=true), or a file or directory this process cannot write
                db = url.database or ""
                path = Path(db.removeprefix("file:"))
                read_only = url.query.get("mode") == "ro" or (db not in ("", ":memory:") and path.exists() and not (
                    os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)))
        if read_only:
            raise DatabaseUnavailable("the database is read-only", None)

    def close(self) -> None:
        """Close the connection pool."""
        self.engine.dispose()
        self.read_engine.dispose()

    # -- spaces ----------------------------------------------------------------------------------

    def spec_of(self, space: Space) -> SketchSpec:
        """The :class:`fishersketch.SketchSpec` of a space (parsed once)."""
        spec = self._specs.get(int(space.id))
        if spec is None:
            spec = self._specs.setdefault(int(space.id), SketchSpec.from_dict(space.spec))
        return spec

    def default_space(self, session: Session) -> Space:
        """The default space: the embedded model's, else the served model's (of this process's ``sketch_dim`` and
        ``sketch_seed`` when that model has several specs; of those, the newest that a live worker serves, else the
        newest), else the only one.

        Raises
        ------
        ModelUnavailable
            No space exists yet (no model has been loaded by this service or any worker).
        Conflict
            Several spaces and none is the default: pass a space id.
        """
        if self.default_space_id is not None:
            return spaces_sql.get_space(session, self.default_space_id)
        rows = spaces_sql.spaces_of_model(session, self.settings.model)
        configured = bool(rows)
        if not rows:
            rows = spaces_sql.list_spaces(session)
        if not rows and self.model_error is not None:
            raise ModelUnavailable(f"no space exists yet, and the model {self.settings.model!r} is not loaded: "
                                   f"{self.model_error}", {"model": self.settings.model})
        if not rows:
            raise ModelUnavailable(
                f"no space exists yet: start a worker for model {self.settings.model!r} (or the embedded service)",
                {"model": self.settings.model},
            )
        if len(rows) > 1 and len({r.model_name for r in rows}) > 1:
            raise Conflict("several spaces exist; pass the space id", {"ids": [r.id for r in rows]})
        # one model in several sketch specs: the one this process is configured for, if it exists
        same_spec = [r for r in rows if r.m == self.settings.sketch_dim and r.seed == self.settings.sketch_seed]
        chosen = self._newest_served(same_spec or rows)
        # Once, for a model named on purpose (an API replica left at the default serves the workers' model, and a
        # local directory is stored resolved): a mistyped FISHER_ATLAS_MODEL answered from another model silently.
        if (not configured and chosen.model_name not in self._said_fallback
                and "model" in self.settings.model_fields_set and not Path(self.settings.model).expanduser().is_dir()):
            self._said_fallback.add(chosen.model_name)
            log.warning("no space holds the configured model %r (FISHER_ATLAS_MODEL); the default space is the only "
                        "model's there, %r (space %s): set FISHER_ATLAS_MODEL to it if that is meant",
                        self.settings.model, chosen.model_name, chosen.id)
        return chosen

    def _newest_served(self, rows: list[Space]) -> Space:
        """The newest of ``rows`` that a live worker serves, else the newest: an import of another deployment's
        export made a space of the same model name and another fingerprint, which a replica without a model then
        took as its default, and every prompt without a space answered 503 "no worker serves" (a review,
        2026-12-07)."""
        if len(rows) > 1 and self.is_served is not None:
            try:
                served = [r for r in rows if self.is_served(r)]
            except AtlasError:  # the registry does not answer: the newest, as before (the request says why next)
                served = []
            if served:
                return served[-1]
        return rows[-1]

    def resolve_space(self, session: Session, ref: str | int | None) -> Space:
        """A space by id, ``"default"``/``None`` (see :meth:`default_space`) or model name (if unique)."""
        if ref is None or (isinstance(ref, str) and ref.strip().lower() in ("", "default")):
            return self.default_space(session)
        if isinstance(ref, int) or (isinstance(ref, str) and ref.isascii() and ref.isdigit()):
            space_id = int(ref)
            if space_id > 2**62:
                raise NotFound(f"space {ref} does not exist", {"space": str(ref)})
            return spaces_sql.get_space(session, space_id)
        rows = spaces_sql.spaces_of_model(session, ref) if is_storable_text(ref) else []
        if not rows:
            raise NotFound(f"no space named {ref!r}", {"space": ref})
        if len(rows) > 1:
            if self.default_space_id is not None and any(r.id == self.default_space_id for r in rows):
                return next(r for r in rows if r.id == self.default_space_id)
            raise Conflict(f"several spaces use model {ref!r}; pass the space id", {"ids": [r.id for r in rows]})
        return rows[0]

    def list_spaces(self) -> list[dict[str, Any]]:
        """Every space with its task count and whether it is the default."""
        with self.read() as session:
            counts = spaces_sql.task_counts(session)
            try:  # resolved as requests resolve it: a replica without a model has no default_space_id of its own,
                default_id: int | None = int(self.default_space(session).id)  # and said "default": false for all
            except AtlasError:  # none yet, or several and none the default
                default_id = None
            return [
                {"id": s.id, "model_name": s.model_name, "model_fingerprint": s.model_fingerprint,
                 "spec_fingerprint": s.spec_fingerprint, "d": s.d, "K": s.K, "m": s.m, "seed": s.seed,
                 "spec": s.spec, "n_tasks": int(counts.get(s.id, 0)), "default": s.id == default_id}
                for s in spaces_sql.list_spaces(session)
            ]
