"""``Idempotency-Key``: the request a key is bound to, and the answer to a repeated one.

A create or append carrying a key stores the key on its job and :func:`request_digest` of the whole request beside it
(``job_requests``). The
same key again is answered from the store with the first request's task and job — if it carries the same request;
any other body under a used key is a :class:`~atlas.errors.Conflict` (409), never silently answered with the first
request's result. Jobs stored before revision 0010 have no digest: their replays are checked on the kind, the task's
fields and the samples' content address (not the metadata, which the request did not keep and a ``PATCH`` may have
changed since).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from atlas.errors import Conflict
from atlas.models import Job, JobRequest, Task, Upload
from atlas.samples import Sample
from atlas.upload_repository import samples_digest


def job_by_key(session: Session, key: str) -> Job | None:
    """The job created with this ``Idempotency-Key``, or ``None``."""
    return session.execute(select(Job).where(Job.idempotency_key == key)).scalar_one_or_none()


def request_digest(kind: str, samples: Sequence[Sample], **fields: Any) -> str:
    """SHA-256 (hex) of a request: its kind, its fields (JSON values, e.g. name, mode, metadata after
    normalisation) and the samples' content address. Equal requests give equal digests whatever the order of keys
    in their metadata."""
    canonical = json.dumps({"kind": kind, "fields": fields, "samples": samples_digest(samples)},
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def replay(session: Session, job: Job, kind: str, samples: Sequence[Sample], digest: str,
           **expect: Any) -> tuple[Task, Job]:
    """Answer a repeated request whose key is stored on ``job``: its task and job, or 409.

    Parameters
    ----------
    digest
        :func:`request_digest` of the repeated request, compared with the stored one.
    expect
        Task fields the request names (``name``, ``space_id``, ``mode`` or ``id``): checked when the job has no
        stored digest (before revision 0010), and the task must still exist.
    """
    task = session.get(Task, job.task_id) if job.task_id is not None else None
    stored = session.get(JobRequest, job.id)
    if stored is not None:
        mismatch = task is None or stored.request_sha256 != digest
    else:
        mismatch = job.kind != kind or task is None or any(getattr(task, k) != v for k, v in expect.items())
        if not mismatch:
            upload = session.get(Upload, job.upload_id) if job.upload_id is not None else None
            mismatch = upload is None or upload.sha256 != samples_digest(samples)
    if mismatch:
        raise Conflict(
            "this Idempotency-Key was already used for a different request (other task fields, metadata or "
            "samples); send a new key for a new request",
            {"idempotency_key": job.idempotency_key, "job_id": job.id},
        )
    assert task is not None
    return task, job
