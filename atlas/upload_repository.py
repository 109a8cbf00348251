"""Uploads: samples stored once per content (gzip JSONL, addressed by their SHA-256), shared by jobs.

Every function takes a session and works inside the caller's transaction (see :mod:`atlas.repository`).
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import delete, exists, select
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from atlas.errors import InvalidInput, NotFound
from atlas.models import JOB_APPEND, JOB_CREATE, JOB_SUCCEEDED, Job, TaskUpload, Upload
from atlas.sample_writers import decode_jsonl, write_jsonl
from atlas.samples import Sample


class EncodedSamples(Sequence[Sample]):
    """Samples with their stored form computed once, at construction: :func:`encode_samples` and
    :func:`samples_digest` of it return the stored values. A service makes it before its write transaction opens,
    so that the transaction does not hold the database's write lock while a large upload is serialised, hashed and
    compressed (a 53 MB upload held SQLite's lock for about 7 s, past other writers' 5 s busy timeout: a resource
    review, 2026-12-07)."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self.samples = list(samples)
        text = write_jsonl(self.samples)
        self.sha256 = hashlib.sha256(text).hexdigest()
        self.blob = gzip.compress(text, compresslevel=6, mtime=0)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: Any) -> Any:
        return self.samples[index]


def encode_samples(samples: Sequence[Sample]) -> tuple[bytes, str]:
    """Serialise samples to gzip-compressed JSONL (:func:`atlas.sample_writers.write_jsonl`).

    Returns
    -------
    blob : bytes
        gzip (deterministic: ``mtime=0``) of one ``Sample.canonical_json()`` per line.
    sha256 : str
        Hex digest of the uncompressed JSONL text (the content address).
    """
    if isinstance(samples, EncodedSamples):
        return samples.blob, samples.sha256
    text = write_jsonl(samples)
    return gzip.compress(text, compresslevel=6, mtime=0), hashlib.sha256(text).hexdigest()


def samples_digest(samples: Sequence[Sample]) -> str:
    """The content address :func:`encode_samples` gives these samples."""
    if isinstance(samples, EncodedSamples):
        return samples.sha256
    return hashlib.sha256(write_jsonl(samples)).hexdigest()


def decode_samples(blob: bytes) -> list[Sample]:
    """Inverse of :func:`encode_samples` (lines split on ``"\\n"`` only: U+2028 and friends stay inside)."""
    return decode_jsonl(gzip.decompress(blob))


def get_or_create_upload(session: Session, samples: Sequence[Sample]) -> Upload:
    """Store the samples once (content-addressed by sha256) and return the upload row.

    A row found is key-share locked (PostgreSQL; SQLite writers are serialised): a concurrent purge of orphan
    uploads (a deleted task's samples, :func:`purge_orphan_uploads_now`) then waits for this transaction and
    keeps the upload its new job references, instead of deleting it between this read and the job's insert.
    """
    if not samples:
        raise InvalidInput("an upload needs at least one sample")
    blob, digest = encode_samples(samples)
    stmt = select(Upload).where(Upload.sha256 == digest).with_for_update(key_share=True)
    found = session.execute(stmt).scalar_one_or_none()
    if found is not None:
        return found
    upload = Upload(sha256=digest, n_samples=len(samples), size_bytes=len(blob), content=blob)
    try:
        with session.begin_nested():
            session.add(upload)
    except IntegrityError:
        return session.execute(stmt).scalar_one()
    return upload


def load_upload_samples(session: Session, upload_id: int) -> list[Sample]:
    """The samples of an upload, in upload order."""
    upload = session.get(Upload, upload_id)
    if upload is None:
        raise NotFound(f"upload {upload_id} does not exist", {"upload_id": upload_id})
    return decode_samples(upload.content)


def purge_orphan_uploads(session: Session) -> int:
    """Delete uploads no job references any more; return how many."""
    referenced = exists().where(Job.upload_id == Upload.id)
    result = session.execute(delete(Upload).where(~referenced))
    return int(cast(CursorResult[Any], result).rowcount or 0)


def purge_orphan_uploads_now(session: Session) -> int:
    """:func:`purge_orphan_uploads` in a savepoint: an upload a concurrent request just reused stays (a later
    purge takes it) instead of failing the caller's transaction."""
    try:
        with session.begin_nested():
            return purge_orphan_uploads(session)
    except IntegrityError:
        return 0


def held_uploads(session: Session, task_ids: Sequence[int]) -> dict[int, list[str]]:
    """The content addresses of the uploads each task holds (sorted; a task without any is left out): those its
    succeeded create and append jobs added, and those it was imported with (``task_uploads``). A space export carries
    them, so appending one of them again after an import is refused as a repeat, as it is here."""
    ids = [int(t) for t in task_ids]
    out: dict[int, set[str]] = {}
    if not ids:
        return {}
    jobs = session.execute(
        select(Job.task_id, Upload.sha256).join(Upload, Upload.id == Job.upload_id)
        .where(Job.task_id.in_(ids), Job.kind.in_([JOB_CREATE, JOB_APPEND]), Job.status == JOB_SUCCEEDED)
    ).all()
    imported = session.execute(select(TaskUpload.task_id, TaskUpload.sha256).where(TaskUpload.task_id.in_(ids))).all()
    for tid, sha in [*jobs, *imported]:
        if tid is not None:
            out.setdefault(int(tid), set()).add(str(sha))
    return {tid: sorted(shas) for tid, shas in out.items()}


def record_held_uploads(session: Session, task_id: int, digests: Iterable[str]) -> None:
    """Remember that ``task_id`` holds the uploads of these content addresses without a job of this store (it was
    imported with them)."""
    for sha in sorted(set(digests)):
        session.add(TaskUpload(task_id=int(task_id), sha256=sha))


def held_by_import(session: Session, task_id: int, sha256: str) -> bool:
    """Whether ``task_id`` was imported holding the upload of content address ``sha256``."""
    return session.get(TaskUpload, (int(task_id), sha256)) is not None
