"""Repository of the lexical side of tasks (``task_lexicon`` rows; all its SQL lives here).

A task's lexical record (:class:`LexicalRecord`: term counts and template) is one blob. A job adds
its samples' :class:`LexicalDelta` to its task (:func:`add_delta`, in the job's final
transaction); the route path reads the candidates' records through a process-wide LRU keyed by the
blob's digest (:func:`get_task_lexicon`). See :mod:`atlas.lexical`, :mod:`atlas.template` and
docs/SCORES.md ("Lexical evidence", "Open set: template test").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from atlas.lexical import TaskTerms, TermCounts, term_hashes
from atlas.lru import ContentLru
from atlas.models import JOB_SUCCEEDED, TaskLexicon, utcnow
from atlas.samples import Sample
from atlas.template import TaskTemplate, presence


def routing_text(sample: Sample, mode: str) -> str | None:
    """What a prompt routed to the task is compared with: the ``prompt`` of a completion-mode sample
    (a prompt has no answer), the text (or prompt + completion) of a text-mode one."""
    if mode == "completion":
        return sample.prompt
    return sample.text if sample.text is not None else (sample.prompt or "") + (sample.completion or "")


def template_text(sample: Sample) -> str | None:
    """What a sample brings to its task's template: its ``prompt`` when it has one (a prompt routed to the
    task has no completion, so a term every completion shares must not be required of it), else its text."""
    return sample.prompt if sample.prompt is not None else sample.text


def counts_of(samples: Iterable[Sample], mode: str) -> TermCounts:
    """Term counts of the samples' routing texts."""
    return TermCounts.from_texts(routing_text(s, mode) for s in samples)


_RECORD = b"FALR1"


@dataclass(frozen=True)
class LexicalDelta:
    """What a job adds to its task's record, computed outside the final transaction: the term ``counts`` of
    its samples' routing texts and each sample's :func:`atlas.template.presence`."""

    counts: TermCounts
    presences: list[np.ndarray]

    @staticmethod
    def of_texts(texts: Sequence[str | None], template_texts: Sequence[str | None] | None = None) -> LexicalDelta:
        """The delta of a job's routing ``texts`` (the template from ``template_texts``, default the same; each
        text is hashed once where both are the same string)."""
        hashes = [term_hashes(t) if t else np.zeros(0, np.uint32) for t in texts]
        tpl = texts if template_texts is None else template_texts
        presences = [np.unique(h) if t == r else presence(t) for h, r, t in zip(hashes, texts, tpl, strict=True)]
        return LexicalDelta(TermCounts.from_hashes(hashes), presences)

    @staticmethod
    def of_samples(samples: Sequence[Sample], mode: str) -> LexicalDelta:
        """The delta of a job's samples: counts of their :func:`routing_text`, template of their
        :func:`template_text`."""
        return LexicalDelta.of_texts([routing_text(s, mode) for s in samples], [template_text(s) for s in samples])


@dataclass(frozen=True)
class LexicalRecord:
    """What a task stores of its samples' words: term ``counts`` and ``template`` (``None``: stored before
    templates existed — a bare :class:`atlas.lexical.TermCounts` blob — so the template test is off)."""

    counts: TermCounts
    template: TaskTemplate | None

    def add(self, delta: LexicalDelta) -> LexicalRecord:
        """This record with a job's :class:`LexicalDelta` added (counts summed, template intersected)."""
        return LexicalRecord(self.counts.merge(delta.counts),
                             None if self.template is None else self.template.add_presences(delta.presences))

    def to_bytes(self) -> bytes:
        """Serialisation (``from_bytes`` inverts it; a record without template is a bare counts blob)."""
        counts = self.counts.to_bytes()
        if self.template is None:
            return counts
        return _RECORD + len(counts).to_bytes(4, "little") + counts + self.template.to_bytes()

    @staticmethod
    def from_bytes(blob: bytes) -> LexicalRecord:
        """Inverse of :meth:`to_bytes`; also reads a bare counts blob (no template).

        Raises
        ------
        ValueError
            Neither, or a corrupt one.
        """
        blob = bytes(blob)
        if not blob.startswith(_RECORD):
            return LexicalRecord(TermCounts.from_bytes(blob), None)
        head = len(_RECORD) + 4
        n = int.from_bytes(blob[len(_RECORD):head], "little")
        if len(blob) < head + n:
            raise ValueError("corrupt lexical record (length)")
        return LexicalRecord(TermCounts.from_bytes(blob[head:head + n]), TaskTemplate.from_bytes(blob[head + n:]))


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
    row = session.get(TaskLexicon, int(task_id), populate_existing=True)
    old = LexicalRecord.from_bytes(row.terms) if row is not None else LexicalRecord(TermCounts.empty(),
                                                                                      TaskTemplate.empty())
    put_record(session, task_id, old.add(delta))


def put_record(session: Session, task_id: int, record: LexicalRecord) -> None:
    """Store ``record`` as the task's lexical record (replacing any)."""
    blob = record.to_bytes()
    n = len(record.counts)
    row = session.get(TaskLexicon, int(task_id))
    if row is None:
        session.add(TaskLexicon(task_id=int(task_id), digest=_digest(blob), n_terms=n, terms=blob,
                                updated_at=utcnow()))
    else:
        row.terms, row.digest, row.n_terms, row.updated_at = blob, _digest(blob), n, utcnow()
    session.flush()


def _decode(blob: bytes) -> TaskLexical:
    record = LexicalRecord.from_bytes(blob)
    return TaskLexical(TaskTerms.of(record.counts), record.template)


_LEXICAL: ContentLru[TaskLexical] = ContentLru(16 * 1024 * 1024, weigh=lambda t: int(t.terms.keys.size))
"""Decoded records by blob digest, bounded by the terms held (8 bytes each: 16 M is 128 MiB)."""


def get_task_lexicon(session: Session, task_ids: Sequence[int]) -> dict[int, TaskLexical]:
    """The :class:`TaskLexical` of the tasks that have a record (blobs read only for cache misses)."""
    ids = [int(i) for i in task_ids]
    if not ids:
        return {}
    out: dict[int, TaskLexical] = {}
    missing: dict[bytes, int] = {}
    for tid, digest in session.execute(select(TaskLexicon.task_id, TaskLexicon.digest)
                                       .where(TaskLexicon.task_id.in_(ids))).all():
        hit = _LEXICAL.get(bytes(digest))
        if hit is None:
            missing[bytes(digest)] = int(tid)
        else:
            out[int(tid)] = hit
    if missing:
        rows = session.execute(select(TaskLexicon.task_id, TaskLexicon.digest, TaskLexicon.terms)
                               .where(TaskLexicon.task_id.in_(list(missing.values())))).all()
        for tid, digest, blob in rows:
            lexical = _decode(blob)
            _LEXICAL.put(bytes(digest), lexical)
            out[int(tid)] = lexical
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
    return [int(t) for t, blob in rows if not bytes(blob).startswith(_RECORD)]


def backfill(session: Session, task_ids: Sequence[int]) -> int:
    """Re-derive the lexical records of tasks from the uploads of their succeeded jobs, job by job as the
    jobs added them; returns how many got a record.

    Reads named columns only (no ORM entity loads), so migrations ``0003`` and ``0004`` can run it on their
    own schema.
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
        record = LexicalRecord(TermCounts.empty(), TaskTemplate.empty())
        for upload_id in dict.fromkeys(uploads):
            content = session.execute(select(Upload.content).where(Upload.id == upload_id)).scalar_one_or_none()
            if content is not None:
                record = record.add(LexicalDelta.of_samples(decode_samples(content), str(mode)))
        put_record(session, int(tid), record)
        done += 1
    return done
