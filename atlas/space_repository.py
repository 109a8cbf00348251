"""Space and read-side queries used by the services (all SQL stays in ``atlas``).

Complements :mod:`atlas.repository` (tasks, uploads, states, signatures): the lookups the query and
task services need — spaces by model, task counts, ready task ids, state versions, job statistics.
Every function takes a session and works inside the caller's transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from atlas.errors import InvalidInput, NotFound
from atlas.models import (
    JOB_STATUSES,
    JOB_SUCCEEDED,
    TASK_READY,
    TASK_STATUSES,
    Job,
    ModelKeyAlias,
    SketchStateRow,
    Space,
    Task,
)
from atlas.paging import Page
from atlas.samples import name_forms
from atlas.vocabulary import MAX_LISTED_IDS

log = logging.getLogger(__name__)

__all__ = [
    "StateMeta",
    "get_or_create_space",
    "get_space",
    "job_counts",
    "list_spaces",
    "ready_task_ids",
    "spaces_of_model",
    "state_blobs",
    "state_metas",
    "succeeded_job_figures",
    "task_counts",
    "tasks_by_exact_name",
]


def spaces_of_model(session: Session, model_name: str) -> list[Space]:
    """Spaces whose model name is ``model_name``, oldest first."""
    return list(session.execute(select(Space).where(Space.model_name == model_name).order_by(Space.id)).scalars())


def task_counts(session: Session) -> dict[int, int]:
    """Number of tasks per space id."""
    return {int(s): int(n) for s, n in session.execute(select(Task.space_id, func.count()).group_by(Task.space_id))}


def ready_task_ids(session: Session, space_id: int, *, exclude: int | None = None, limit: int | None = None
                   ) -> list[int]:
    """Ids of a space's ready tasks, ascending (``exclude`` left out, at most ``limit``)."""
    stmt = select(Task.id).where(Task.space_id == space_id, Task.status == TASK_READY)
    if exclude is not None:
        stmt = stmt.where(Task.id != exclude)
    stmt = stmt.order_by(Task.id)
    if limit is not None:
        stmt = stmt.limit(limit)
    return [int(i) for i in session.execute(stmt).scalars()]


@dataclass(frozen=True)
class StateMeta:
    """A task's name, space and stored state version."""

    task_id: int
    name: str
    space_id: int
    version: int


def state_metas(session: Session, task_ids: Sequence[int]) -> dict[int, StateMeta]:
    """Name, space and state version of each task that has a stored state."""
    rows = session.execute(
        select(Task.id, Task.name, Task.space_id, SketchStateRow.version)
        .join(SketchStateRow, SketchStateRow.task_id == Task.id)
        .where(Task.id.in_([int(i) for i in task_ids]))
    ).all()
    return {int(r[0]): StateMeta(int(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows}


def state_blobs(session: Session, task_ids: Sequence[int]) -> list[tuple[int, int, bytes]]:
    """``(task_id, version, blob)`` of the stored states of the given tasks."""
    rows = session.execute(
        select(SketchStateRow.task_id, SketchStateRow.version, SketchStateRow.blob)
        .where(SketchStateRow.task_id.in_([int(i) for i in task_ids]))
    ).all()
    return [(int(t), int(v), bytes(b)) for t, v, b in rows]


def name_starts_with(prefix: str) -> Any:
    """``Task.name`` starts with ``prefix``, case-sensitive on every database (``%`` and ``_`` literal): SQLite's
    LIKE ignores ASCII case ("AB" matched "abc"), so the prefix is also compared exactly (the LIKE stays for the
    index)."""
    return and_(Task.name.startswith(prefix, autoescape=True), func.substr(Task.name, 1, len(prefix)) == prefix)


def ids_filter(task_ids: Sequence[int] | None) -> list[Any]:
    """The ``WHERE`` condition of a list's ``task_ids`` filter (none when ``None``)."""
    if task_ids is None:
        return []
    if len(task_ids) > MAX_LISTED_IDS:
        raise InvalidInput(f"at most {MAX_LISTED_IDS} task ids may be listed at once", {"ids": len(task_ids)})
    return [Task.id.in_(sorted({int(t) for t in task_ids}))]


def list_tasks(
    session: Session,
    *,
    space_id: int | None = None,
    name_prefix: str | None = None,
    status: str | None = None,
    task_ids: Sequence[int] | None = None,
    offset: int = 0,
    limit: int = 50,
) -> Page[Task]:
    """List tasks (oldest first) with optional filters; ``total`` counts all matches.

    Parameters
    ----------
    space_id
        Only tasks of this space.
    name_prefix
        Only names starting with this text (case-sensitive; ``%`` and ``_`` are literal).
    status
        ``pending``, ``ready`` or ``failed``.
    task_ids
        Only these tasks (at most 1,000 ids; an unknown id is not listed).
    offset, limit
        Page window (``limit`` 1..1000).
    """
    if not 1 <= limit <= 1000 or offset < 0:
        raise InvalidInput("limit must be in 1..1000 and offset >= 0", {"offset": offset, "limit": limit})
    if status is not None and status not in TASK_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(TASK_STATUSES)}", {"status": status})
    conds = []
    if space_id is not None:
        conds.append(Task.space_id == space_id)
    if name_prefix:
        conds.append(name_starts_with(name_prefix))
    if status is not None:
        conds.append(Task.status == status)
    conds.extend(ids_filter(task_ids))
    total = session.execute(select(func.count()).select_from(Task).where(*conds)).scalar_one()
    items = session.execute(select(Task).where(*conds).order_by(Task.id).offset(offset).limit(limit)).scalars()
    return Page(items=list(items), total=int(total), offset=offset, limit=limit)


def tasks_by_exact_name(session: Session, name: str, *, space_id: int | None, status: str | None,
                        name_prefix: str | None, default_space_id: int | None, offset: int, limit: int,
                        task_ids: Sequence[int] | None = None) -> Page[Task]:
    """Tasks named exactly ``name`` (default space first, then oldest), with the list filters."""
    conds: list[Any] = [Task.name.in_(name_forms(name))]
    if space_id is not None:
        conds.append(Task.space_id == space_id)
    if status is not None:
        conds.append(Task.status == status)
    if name_prefix:
        conds.append(name_starts_with(name_prefix))
    conds.extend(ids_filter(task_ids))
    total = int(session.execute(select(func.count()).select_from(Task).where(*conds)).scalar_one())
    order = (Task.space_id != (default_space_id or -1), Task.id)
    items = list(session.execute(select(Task).where(*conds).order_by(*order).offset(offset).limit(limit)).scalars())
    return Page(items=items, total=total, offset=offset, limit=limit)


def job_counts(session: Session) -> dict[str, int]:
    """Number of jobs per status (every status present, zero when none)."""
    out: dict[str, int] = {str(s): 0 for s in JOB_STATUSES}
    for status, n in session.execute(select(Job.status, func.count()).group_by(Job.status)):
        out[str(status)] = int(n)
    return out


def succeeded_job_figures(session: Session) -> dict[str, float]:
    """Count, summed duration (s) and summed tokens of succeeded jobs, aggregated in SQL.

    The tokens come from each job's ``progress`` JSON; only the count and durations are aggregated by
    the database, the token sum is read from the most recent 10,000 jobs at most.
    """
    rows = session.execute(
        select(Job.started_at, Job.finished_at).where(Job.status == JOB_SUCCEEDED, Job.started_at.is_not(None),
                                                      Job.finished_at.is_not(None))
        .order_by(Job.id.desc()).limit(10_000)
    ).all()
    durations = [(f - s).total_seconds() for s, f in rows if s is not None and f is not None]
    progress = session.execute(
        select(Job.progress).where(Job.status == JOB_SUCCEEDED).order_by(Job.id.desc()).limit(10_000)
    ).scalars().all()
    tokens = sum(int((p or {}).get("tokens", 0) or 0) for p in progress)
    last = float((progress[0] or {}).get("tokens_per_s", 0.0) or 0.0) if progress else 0.0
    return {"duration_count": len(durations), "duration_sum": float(sum(durations)), "tokens_total": tokens,
            "last_tokens_per_s": last}


def get_or_create_space(
    session: Session,
    *,
    model_fingerprint: str,
    spec_fingerprint: str,
    model_name: str,
    d: int,
    K: int,
    m: int,
    seed: int,
    spec: dict[str, Any],
    previous_fingerprints: Sequence[str] = (),
) -> Space:
    """Return the space of (model fingerprint, sketch spec), creating it on first use.

    Parameters
    ----------
    model_fingerprint
        ``ModelFingerprint.key()`` of the loaded model.
    spec_fingerprint
        ``SketchSpec.fingerprint()``.
    model_name, d, K, m, seed, spec
        Descriptive copies (``spec`` is the JSON form of the ``SketchSpec``, enough to rebuild it).
    previous_fingerprints
        The keys the same model had under earlier fingerprint schemes, newest first
        (:attr:`workers.model_identity.ModelFingerprint.previous_keys`): a space stored under one, when none is
        stored under ``model_fingerprint``, is re-keyed to it (once) and returned, tasks and all; each is stored as
        an alias (:func:`record_key_aliases`), which an import in a process without the model reads.
    """
    stmt = select(Space).where(
        Space.model_fingerprint == model_fingerprint, Space.spec_fingerprint == spec_fingerprint
    )
    record_key_aliases(session, model_fingerprint, previous_fingerprints)
    found = session.execute(stmt).scalar_one_or_none()
    if found is not None:
        return found
    for previous in previous_fingerprints:
        if previous == model_fingerprint:
            continue
        old = session.execute(select(Space).where(
            Space.model_fingerprint == previous, Space.spec_fingerprint == spec_fingerprint
        )).scalar_one_or_none()
        if old is not None:
            log.info("space %d re-keyed from model fingerprint %s to %s (content fingerprint of %s)",
                     old.id, previous, model_fingerprint, model_name)
            old.model_fingerprint, old.model_name = model_fingerprint, model_name
            session.flush()
            return old
    space = Space(
        model_fingerprint=model_fingerprint, spec_fingerprint=spec_fingerprint, model_name=model_name,
        d=d, K=K, m=m, seed=seed, spec=dict(spec),
    )
    try:
        with session.begin_nested():
            session.add(space)
    except IntegrityError:  # created concurrently by another transaction
        return session.execute(stmt).scalar_one()
    return space


def record_key_aliases(session: Session, model_fingerprint: str, previous_keys: Sequence[str]) -> None:
    """Store ``previous key -> model_fingerprint`` for each earlier key of the model (kept if already stored)."""
    for previous in previous_keys:
        if previous == model_fingerprint or session.get(ModelKeyAlias, previous) is not None:
            continue
        try:
            with session.begin_nested():
                session.add(ModelKeyAlias(previous_key=previous, model_fingerprint=model_fingerprint))
        except IntegrityError:  # stored concurrently by another process loading the model
            pass


def current_model_key(session: Session, key: str) -> str:
    """The current key of a model given one of its earlier keys (:class:`ModelKeyAlias`), else ``key`` itself."""
    alias = session.get(ModelKeyAlias, key)
    return alias.model_fingerprint if alias is not None else key


def get_space(session: Session, space_id: int) -> Space:
    """Return a space or raise :class:`NotFound`."""
    space = session.get(Space, space_id)
    if space is None:
        raise NotFound(f"space {space_id} does not exist", {"space_id": space_id})
    return space


def list_spaces(session: Session) -> list[Space]:
    """All spaces, oldest first."""
    return list(session.execute(select(Space).order_by(Space.id)).scalars())
