"""Repository of the lexical side of tasks (``task_lexicon`` rows; all its SQL lives here).

A task's lexical record (:class:`atlas.lexical_record.LexicalRecord`: term counts and template; its blob
format lives there, re-exported here with :class:`LexicalDelta` and the text helpers) is one blob. A job adds
its samples' :class:`LexicalDelta` to its task (:func:`add_delta`, in the job's final
transaction); the route path reads the candidates' records through a process-wide LRU keyed by the
blob's digest (:func:`get_task_lexicon`). See :mod:`atlas.lexical`, :mod:`atlas.template` and
docs/SCORES.md ("Lexical evidence", "Open set: template test").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from atlas.lexical import TaskTerms
from atlas.lexical_record import LexicalDelta, LexicalRecord, routing_text, template_text
from atlas.lru import ContentLru
from atlas.models import JOB_SUCCEEDED, TaskLexicon, utcnow
from atlas.template import TaskTemplate

__all__ = ["LexicalDelta", "LexicalRecord", "TaskLexical", "add_delta", "backfill", "get_blobs",
           "get_task_lexicon", "put_record", "routing_text", "tasks_with_template_terms", "tasks_without_template",
           "tasks_without_terms", "template_text"]


@dataclass(frozen=True)
class TaskLexical:
    """What the route path reads of a task's record: ranking ``terms`` and the ``template``."""

    terms: TaskTerms
    template: TaskTemplate | None


def _digest(blob: bytes) -> bytes:
    return hashlib.blake2b(blob, digest_size=16).digest()


def add_delta(session: Session, task_id: int, delta: LexicalDelta) -> None:
    """Add a job's ``delta`` to the task's stored record (creates it; a record stored without a template
    gets none until re-derived — migration ``0004``, :func:`backfill` — its earlier samples not at hand)."""
    blob = session.execute(select(TaskLexicon.terms).where(TaskLexicon.task_id == int(task_id))).scalar_one_or_none()
    old = LexicalRecord.from_bytes(blob) if blob is not None else LexicalRecord.empty()
    put_record(session, task_id, old.add(delta))


def put_record(session: Session, task_id: int, record: LexicalRecord) -> None:
    """Store ``record`` as the task's lexical record (replacing any).

    Core statements over the named columns (no ORM entity), so the migrations that run :func:`backfill` keep
    working on their own schema when later revisions add columns to ``task_lexicon``.
    """
    blob = record.to_bytes()
    values = {"digest": _digest(blob), "n_terms": len(record.counts), "terms": blob, "updated_at": utcnow()}
    updated = session.execute(update(TaskLexicon).where(TaskLexicon.task_id == int(task_id)).values(**values))
    if not cast(CursorResult[Any], updated).rowcount:  # no record yet (the task row's lock orders writers)
        session.execute(insert(TaskLexicon).values(task_id=int(task_id), **values))


def _decode(blob: bytes) -> TaskLexical:
    record = LexicalRecord.from_bytes(blob)
    return TaskLexical(record.terms(), record.template)


_LEXICAL: ContentLru[TaskLexical] = ContentLru(16 * 1024 * 1024, weigh=lambda t: int(t.terms.keys.size))
"""Decoded records by blob digest, bounded by the terms held (8 bytes each: 16 M is 128 MiB)."""


def get_task_lexicon(session: Session, task_ids: Sequence[int]) -> dict[int, TaskLexical]:
    """The :class:`TaskLexical` of the tasks that have a record (blobs read only for cache misses)."""
    ids = [int(i) for i in task_ids]
    if not ids:
        return {}
    out: dict[int, TaskLexical] = {}
    missing: list[int] = []
    for tid, digest in session.execute(select(TaskLexicon.task_id, TaskLexicon.digest)
                                       .where(TaskLexicon.task_id.in_(ids))).all():
        hit = _LEXICAL.get(bytes(digest))
        if hit is None:
            missing.append(int(tid))
        else:
            out[int(tid)] = hit
    if missing:  # every missing task read (tasks of equal records share one digest: each gets it), decoded once
        decoded: dict[bytes, TaskLexical] = {}
        for tid, digest, blob in session.execute(select(TaskLexicon.task_id, TaskLexicon.digest, TaskLexicon.terms)
                                                 .where(TaskLexicon.task_id.in_(missing))).all():
            key = bytes(digest)
            if key not in decoded:
                decoded[key] = _decode(blob)
                _LEXICAL.put(key, decoded[key])
            out[int(tid)] = decoded[key]
    return out


def get_blobs(session: Session, task_ids: Sequence[int]) -> dict[int, bytes]:
    """The stored lexical-record blobs of the tasks that have one (for space export)."""
    if not task_ids:
        return {}
    rows = session.execute(select(TaskLexicon.task_id, TaskLexicon.terms)
                           .where(TaskLexicon.task_id.in_([int(i) for i in task_ids]))).all()
    return {int(t): bytes(b) for t, b in rows}


def tasks_without_terms(session: Session) -> list[int]:
    """Ready tasks that have no lexical record (stored before the lexical side existed), by id."""
    from atlas.models import TASK_READY, Task

    rows = session.execute(select(Task.id).outerjoin(TaskLexicon, TaskLexicon.task_id == Task.id)
                           .where(Task.status == TASK_READY, TaskLexicon.task_id.is_(None)).order_by(Task.id))
    return [int(i) for i in rows.scalars()]


def tasks_without_template(session: Session) -> list[int]:
    """Tasks whose lexical record has no template (stored before templates existed), by id."""
    rows = session.execute(select(TaskLexicon.task_id, TaskLexicon.terms).order_by(TaskLexicon.task_id)).all()
    return [int(t) for t, blob in rows if not LexicalRecord.has_template(blob)]


def tasks_with_template_terms(session: Session) -> list[int]:
    """Tasks whose stored template has at least one term (the only ones the template test can apply to), by id."""
    rows = session.execute(select(TaskLexicon.task_id, TaskLexicon.terms).order_by(TaskLexicon.task_id)).all()
    out = []
    for tid, blob in rows:
        template = LexicalRecord.from_bytes(blob).template if LexicalRecord.has_template(blob) else None
        if template is not None and template.keys.size:
            out.append(int(tid))
    return out


def backfill(session: Session, task_ids: Sequence[int], *, complete_only: bool = False) -> int:
    """Re-derive the lexical records of tasks from the uploads of their succeeded jobs, job by job as the
    jobs added them; returns how many got a record. ``complete_only``: leave a task as it is unless it has
    succeeded jobs and every one's upload is stored (an imported task has none: its record came with it).

    Reads and writes named columns only (no ORM entity), so migrations ``0003`` to ``0005`` can run it on
    their own schema.
    """
    from atlas.models import Job, Task, Upload
    from atlas.upload_repository import decode_samples

    done = 0
    for tid in task_ids:
        mode = session.execute(select(Task.mode).where(Task.id == int(tid))).scalar_one_or_none()
        if mode is None:
            continue
        uploads = session.execute(select(Job.upload_id).where(Job.task_id == int(tid),
                                                              Job.status == JOB_SUCCEEDED)
                                  .order_by(Job.id)).scalars().all()
        upload_ids = list(dict.fromkeys(uploads))
        if complete_only and (not upload_ids or None in upload_ids or len(upload_ids) != session.execute(
                select(func.count()).select_from(Upload).where(Upload.id.in_(upload_ids),
                                                               Upload.content.is_not(None))).scalar_one()):
            continue
        record = LexicalRecord.empty()
        for upload_id in upload_ids:  # one upload in memory at a time
            content = session.execute(select(Upload.content).where(Upload.id == upload_id)).scalar_one_or_none()
            if content is not None:
                record = record.add(LexicalDelta.of_samples(decode_samples(content), str(mode)))
        put_record(session, int(tid), record)
        done += 1
    return done
