"""The change sequence: a durable, gap-free log of signature upserts and deletes.

The FAISS index of a space is a pure function of the ``changes`` log (or, equivalently, of the
``signatures`` table at a given sequence number); an index records the last sequence number it
applied — its *watermark* — and catches up by reading ``seq > watermark``.

Sequence numbers are allocated by incrementing ``atlas_state.last_seq`` inside the writing
transaction. That row lock is held until commit, so two transactions can never commit their changes
out of sequence order: a reader that sees ``seq = s`` is guaranteed to see every change ``<= s``
(a plain autoincrement column would let ``s + 1`` commit before ``s`` and a reader could skip ``s``
forever). Writers allocate the number as the last statement of their transaction to keep the lock
short.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, aliased

from atlas.models import CHANGE_DELETE, CHANGE_UPSERT, AtlasState, Change


@dataclass(frozen=True)
class ChangeRecord:
    """One applied-or-to-apply change."""

    seq: int
    space_id: int
    task_id: int
    op: str


def record_change(session: Session, space_id: int, task_id: int, op: str) -> int:
    """Append a change in the current transaction and return its sequence number.

    Parameters
    ----------
    session
        The session whose transaction also writes (or deletes) the signature.
    space_id, task_id
        What changed.
    op
        ``"upsert"`` or ``"delete"``.
    """
    if op not in (CHANGE_UPSERT, CHANGE_DELETE):
        raise ValueError(f"unknown change op {op!r}")
    seq = session.execute(
        update(AtlasState).where(AtlasState.id == 1).values(last_seq=AtlasState.last_seq + 1)
        .returning(AtlasState.last_seq)
    ).scalar_one()
    session.add(Change(seq=seq, space_id=space_id, task_id=task_id, op=op))
    session.flush()
    return int(seq)


def last_seq(session: Session) -> int:
    """Highest committed sequence number (0 when nothing changed yet)."""
    return int(session.execute(select(AtlasState.last_seq).where(AtlasState.id == 1)).scalar_one())


def instance_id(session: Session) -> str:
    """Random identity of this database, fixed at migration time (guards persisted index files)."""
    return str(session.execute(select(AtlasState.instance_id).where(AtlasState.id == 1)).scalar_one())


def _format_mark(seq: int, space_id: int, task_id: int, op: str, at: Any) -> str:
    stamp = at.replace(tzinfo=None).isoformat(timespec="microseconds") if at is not None else ""
    return f"{int(seq)}:{int(space_id)}:{int(task_id)}:{op}:{stamp}"


def mark(session: Session, seq: int) -> str | None:
    """What identifies the change ``seq`` in this history (its space, task, op and time): a persisted index
    records it for its watermark, so that a database restored from a backup and written again (the same
    sequence numbers for other changes) is told apart. ``""`` for 0; ``None`` when the row is gone (pruned)."""
    if seq <= 0:
        return ""
    row = session.execute(select(Change.space_id, Change.task_id, Change.op, Change.at)
                          .where(Change.seq == int(seq))).one_or_none()
    return None if row is None else _format_mark(seq, row.space_id, row.task_id, row.op, row.at)


def is_same(now: str | None, recorded: str) -> bool:
    """Whether a change whose :func:`mark` is ``now`` is the one recorded as ``recorded`` (true when nothing was
    recorded or the row was pruned, ``now`` is ``None``: then it cannot be told)."""
    return not recorded or now is None or now == recorded


def same_history(session: Session, seq: int, recorded: str) -> bool:
    """Whether change ``seq`` is still the one whose :func:`mark` was ``recorded`` (see :func:`is_same`)."""
    return is_same(mark(session, seq) if recorded else None, recorded)


@dataclass(frozen=True)
class Head:
    """The log's head and two marks, read by :func:`head` in one statement."""

    seq: int
    """Highest committed sequence number."""
    mark: str
    """:func:`mark` of the change at ``seq`` (``""`` for 0 or a pruned row)."""
    at: int
    """The change asked about (a reader's watermark)."""
    at_mark: str | None
    """:func:`mark` of the change ``at`` (``None`` when pruned)."""

    def same_history(self, recorded: str) -> bool:
        """Whether the change ``at`` is still the one recorded as ``recorded`` (:func:`is_same`)."""
        return is_same(self.at_mark, recorded)

    def unchanged(self, recorded: str) -> bool:
        """Nothing new for a reader at ``at`` that recorded ``recorded`` there: the head is still ``at``, in the
        same history (a database restored and written up to the same number again is new)."""
        return self.seq == self.at and self.same_history(recorded)


_AT_HEAD, _AT_SEQ = aliased(Change), aliased(Change)
_HEAD_STATEMENT = (
    select(AtlasState.last_seq, _AT_HEAD.space_id, _AT_HEAD.task_id, _AT_HEAD.op, _AT_HEAD.at,
           _AT_SEQ.space_id, _AT_SEQ.task_id, _AT_SEQ.op, _AT_SEQ.at)
    .select_from(AtlasState)
    .outerjoin(_AT_HEAD, _AT_HEAD.seq == AtlasState.last_seq)
    .outerjoin(_AT_SEQ, _AT_SEQ.seq == bindparam("at"))
    .where(AtlasState.id == 1)
)
"""Built once: building it per call (two aliases, two joins) cost more than the round trips it saves."""


def head(session: Session, at: int) -> Head:
    """:func:`last_seq`, its :func:`mark` and the mark of change ``at``, in one round trip.

    The readers that keep current (the state cache, the index catch-up) poll this several times a second: one
    statement instead of two or three (``python -m bench.store.bench_head``: bench/results/store.md)."""
    row = session.execute(_HEAD_STATEMENT, {"at": int(at)}).one()
    seq = int(row[0])
    head_mark = _format_mark(seq, *row[1:5]) if row[1] is not None and seq > 0 else ""
    if at <= 0:
        at_mark: str | None = ""
    else:
        at_mark = _format_mark(at, *row[5:9]) if row[5] is not None else None
    return Head(seq=seq, mark=head_mark, at=int(at), at_mark=at_mark)


def pruned_seq(session: Session) -> int:
    """Changes with ``seq <= pruned_seq`` have been deleted from the log."""
    return int(session.execute(select(AtlasState.pruned_seq).where(AtlasState.id == 1)).scalar_one())


def changes_since(
    session: Session, after: int, *, space_id: int | None = None, limit: int | None = None
) -> list[ChangeRecord]:
    """Changes with ``seq > after`` in sequence order (optionally one space, at most ``limit``)."""
    stmt = select(Change.seq, Change.space_id, Change.task_id, Change.op).where(Change.seq > after)
    if space_id is not None:
        stmt = stmt.where(Change.space_id == space_id)
    stmt = stmt.order_by(Change.seq)
    if limit is not None:
        stmt = stmt.limit(limit)
    return [ChangeRecord(int(s), int(sp), int(t), str(o)) for s, sp, t, o in session.execute(stmt)]


def count_since(session: Session, after: int, *, space_id: int | None = None) -> int:
    """Number of changes with ``seq > after``."""
    stmt = select(func.count()).select_from(Change).where(Change.seq > after)
    if space_id is not None:
        stmt = stmt.where(Change.space_id == space_id)
    return int(session.execute(stmt).scalar_one())


def prune(session: Session, through: int) -> int:
    """Delete changes with ``seq <= through`` and return how many were removed.

    An index whose watermark is below the pruned point can no longer catch up and is rebuilt from
    the ``signatures`` table instead.
    """
    through = min(through, last_seq(session))
    session.execute(
        update(AtlasState).where(AtlasState.id == 1, AtlasState.pruned_seq < through).values(pruned_seq=through)
    )
    result = session.execute(delete(Change).where(Change.seq <= through))
    return int(cast(CursorResult[Any], result).rowcount or 0)


def compact(session: Session, *, retain: int, floors: list[int] | None = None) -> int:
    """Prune the log through the compaction point ``min(last_seq - retain, *(f - 1 for f in floors))``; return the
    rows deleted.

    Parameters
    ----------
    session
        A writing session (its transaction commits the prune).
    retain
        Changes kept at the head: a replica or restarted process at most this far behind catches
        up; one further behind (watermark below ``pruned_seq``) rebuilds its index and clears its
        state cache from SQL — correct, only slower.
    floors
        Watermarks the caller still needs (e.g. of its persisted index files). The change *at* each floor
        is kept too: its :func:`mark` is what tells a restored database's history from the one an index
        file was written against.
    """
    through = min([last_seq(session) - retain, *(f - 1 for f in floors or [])])
    if through <= pruned_seq(session):
        return 0
    return prune(session, through)
