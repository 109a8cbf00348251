"""Repository of the lexical side of tasks (``task_lexicon`` rows; all its SQL lives here).

A job adds the term counts of its samples' routing texts (:func:`routing_text`) to its task
(:func:`add_terms`, in the job's final transaction); the route path reads the candidates' terms
through a process-wide LRU keyed by the blob's digest (:func:`get_task_terms`). See
:mod:`atlas.lexical` and docs/SCORES.md ("Lexical evidence").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from atlas.lexical import TaskTerms, TermCounts
from atlas.lru import ContentLru
from atlas.models import JOB_SUCCEEDED, TaskLexicon, utcnow
from atlas.samples import Sample


def routing_text(sample: Sample, mode: str) -> str | None:
    """What a prompt routed to the task is compared with: the ``prompt`` of a completion-mode sample
    (a prompt has no answer), the text (or prompt + completion) of a text-mode one."""
    if mode == "completion":
        return sample.prompt
    return sample.text if sample.text is not None else (sample.prompt or "") + (sample.completion or "")


def counts_of(samples: Iterable[Sample], mode: str) -> TermCounts:
    """Term counts of the samples' routing texts."""
    return TermCounts.from_texts(routing_text(s, mode) for s in samples)


def _digest(blob: bytes) -> bytes:
    return hashlib.blake2b(blob, digest_size=16).digest()


def add_terms(session: Session, task_id: int, counts: TermCounts) -> None:
    """Add ``counts`` to the task's stored term counts (creates the row)."""
    row = session.get(TaskLexicon, int(task_id), populate_existing=True)
    put_terms(session, task_id, counts if row is None else TermCounts.from_bytes(row.terms).merge(counts))


def put_terms(session: Session, task_id: int, counts: TermCounts) -> None:
    """Store ``counts`` as the task's term counts (replacing any)."""
    blob = counts.to_bytes()
    row = session.get(TaskLexicon, int(task_id))
    if row is None:
        session.add(TaskLexicon(task_id=int(task_id), digest=_digest(blob), n_terms=len(counts), terms=blob,
                                updated_at=utcnow()))
    else:
        row.terms, row.digest, row.n_terms, row.updated_at = blob, _digest(blob), len(counts), utcnow()
    session.flush()


_TERMS: ContentLru[TaskTerms] = ContentLru(16 * 1024 * 1024, weigh=lambda t: int(t.keys.size))
"""Decoded :class:`TaskTerms` by blob digest, bounded by the terms held (8 bytes each: 16 M is 128 MiB)."""


def get_task_terms(session: Session, task_ids: Sequence[int]) -> dict[int, TaskTerms]:
    """The :class:`TaskTerms` of the tasks that have term counts (blobs read only for cache misses)."""
    ids = [int(i) for i in task_ids]
    if not ids:
        return {}
    out: dict[int, TaskTerms] = {}
    missing: dict[bytes, int] = {}
    for tid, digest in session.execute(select(TaskLexicon.task_id, TaskLexicon.digest)
                                       .where(TaskLexicon.task_id.in_(ids))).all():
        hit = _TERMS.get(bytes(digest))
        if hit is None:
            missing[bytes(digest)] = int(tid)
        else:
            out[int(tid)] = hit
    if missing:
        rows = session.execute(select(TaskLexicon.task_id, TaskLexicon.digest, TaskLexicon.terms)
                               .where(TaskLexicon.task_id.in_(list(missing.values())))).all()
        for tid, digest, blob in rows:
            terms = TaskTerms.of(TermCounts.from_bytes(blob))
            _TERMS.put(bytes(digest), terms)
            out[int(tid)] = terms
    return out


def get_blobs(session: Session, task_ids: Sequence[int]) -> dict[int, bytes]:
    """The stored term-count blobs of the tasks that have one (for space export)."""
    if not task_ids:
        return {}
    rows = session.execute(select(TaskLexicon.task_id, TaskLexicon.terms)
                           .where(TaskLexicon.task_id.in_([int(i) for i in task_ids]))).all()
    return {int(t): bytes(b) for t, b in rows}


def tasks_without_terms(session: Session) -> list[int]:
    """Ready tasks that have no term counts (stored before the lexical side existed), by id."""
    from atlas.models import TASK_READY, Task

    rows = session.execute(select(Task.id).outerjoin(TaskLexicon, TaskLexicon.task_id == Task.id)
                           .where(Task.status == TASK_READY, TaskLexicon.task_id.is_(None)).order_by(Task.id))
    return [int(i) for i in rows.scalars()]


def backfill(session: Session, task_ids: Sequence[int]) -> int:
    """Compute the term counts of tasks from the uploads of their succeeded jobs; returns how many got a row.

    Reads named columns only (no ORM entity loads), so migration ``0003`` can run it on its own schema.
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
        counts = TermCounts.empty()
        for upload_id in dict.fromkeys(uploads):
            content = session.execute(select(Upload.content).where(Upload.id == upload_id)).scalar_one_or_none()
            if content is not None:
                counts = counts.merge(counts_of(decode_samples(content), str(mode)))
        put_terms(session, int(tid), counts)
        done += 1
    return done
