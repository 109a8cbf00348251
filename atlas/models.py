"""SQLAlchemy 2.0 models: the source of truth.

One schema for SQLite and PostgreSQL (created by the Alembic scripts in ``migrations/``).

``spaces``
    A (model fingerprint, sketch spec) pair; signatures are comparable only inside one space.
``tasks``
    Name unique per space, user metadata (JSON), mode, counts, status ``pending|ready|failed``.
``sketch_states`` / ``signatures`` / ``baselines``
    One row per task (cascade-deleted with it): the mergeable FisherSketch state blob, the float32
    signature (little-endian, ``m`` values) and the baseline sums blob, each with a row ``version``
    that increases with every stored merge.
``uploads``
    The samples of an upload as gzip-compressed JSONL, addressed by the sha256 of the JSONL text, so
    a job can be retried or resumed from its inputs.
``jobs`` / ``job_checkpoints``
    Work items (``create`` or ``append``), their lease, heartbeat, attempts, progress, cancel flag and
    idempotency key; the checkpoint holds the mergeable state after ``samples_done`` samples.
``changes`` / ``atlas_state``
    The change sequence the FAISS index is derived from: ``seq`` is allocated from the single
    ``atlas_state`` row under its row lock, so sequence order equals commit order (a reader that
    has seen ``seq = s`` has seen every change ``<= s``).
``task_routing``
    Routing side of a task: prompt-side state (completion tasks), calibration, threshold override.
``task_lexicon``
    A task's hashed term counts (the lexical side of routing, :mod:`atlas.lexical`), with their digest.
``api_keys``
    sha256 hashes of API keys with their scopes.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from atlas.vocabulary import ChangeKind, JobKind, JobStatus, Scope, TaskStatus

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BigId = BigInteger().with_variant(Integer(), "sqlite")
"""64-bit integer primary key that is still SQLite's rowid alias (autoincrement)."""

# Short names of the vocabulary's members (atlas.vocabulary is the one definition).
TASK_PENDING, TASK_READY, TASK_FAILED = TaskStatus.PENDING, TaskStatus.READY, TaskStatus.FAILED
TASK_STATUSES = tuple(TaskStatus)

JOB_QUEUED, JOB_RUNNING, JOB_SUCCEEDED = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED
JOB_FAILED, JOB_CANCELLED = JobStatus.FAILED, JobStatus.CANCELLED
JOB_STATUSES = tuple(JobStatus)
JOB_FINAL_STATUSES = tuple(s for s in JobStatus if s.is_final)
JOB_CREATE, JOB_APPEND = JobKind.CREATE, JobKind.APPEND

CHANGE_UPSERT, CHANGE_DELETE = ChangeKind.UPSERT, ChangeKind.DELETE

SCOPES = tuple(Scope)


def utcnow() -> dt.datetime:
    """Current time, timezone-aware UTC."""
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp stored as UTC and always returned timezone-aware.

    PostgreSQL stores ``timestamptz``; SQLite stores naive UTC text (sortable and comparable).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base with a stable constraint naming convention (needed by SQLite batch mode)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class AtlasState(Base):
    """Single row (``id = 1``): database identity and the change-sequence counter."""

    __tablename__ = "atlas_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[str] = mapped_column(String(36))
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    pruned_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class Space(Base):
    """A model fingerprint and sketch spec; every task belongs to one."""

    __tablename__ = "spaces"
    __table_args__ = (UniqueConstraint("model_fingerprint", "spec_fingerprint"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model_fingerprint: Mapped[str] = mapped_column(String(200))
    spec_fingerprint: Mapped[str] = mapped_column(String(200))
    model_name: Mapped[str] = mapped_column(String(500))
    d: Mapped[int] = mapped_column(Integer)
    K: Mapped[int] = mapped_column(Integer)
    m: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class ModelKeyAlias(Base):
    """An earlier key of a model (:attr:`workers.model_identity.ModelFingerprint.previous_keys`) and its current one,
    written by a process that loads the model (a worker, an embedded service): a process without the model (an API
    replica of a scaled-out deployment) maps an export written under the earlier key into the model's space with it."""

    __tablename__ = "model_key_aliases"

    previous_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    model_fingerprint: Mapped[str] = mapped_column(String(200))


class Task(Base):
    """A named set of samples with (once its first job succeeds) a state and a signature."""

    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("space_id", "name"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    space_id: Mapped[int] = mapped_column(ForeignKey("spaces.id", ondelete="RESTRICT"), index=True)
    name: Mapped[str] = mapped_column(String(300))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    mode: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), default=TASK_PENDING, index=True)
    n_samples: Mapped[int] = mapped_column(BigInteger, default=0)
    n_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    space: Mapped[Space] = relationship(lazy="joined", innerjoin=True)


class _TaskBlob:
    """Columns of a versioned per-task blob (one row per task, deleted with it)."""

    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class SketchStateRow(_TaskBlob, Base):
    """The task's mergeable FisherSketch state (``SketchState.to_bytes``)."""

    __tablename__ = "sketch_states"


class Signature(Base):
    """The task's unit signature vector: ``m`` float32 values, little-endian."""

    __tablename__ = "signatures"

    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    space_id: Mapped[int] = mapped_column(ForeignKey("spaces.id", ondelete="RESTRICT"), index=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class BaselineRow(_TaskBlob, Base):
    """The task's baseline sums (``BaselineSums.to_bytes``)."""

    __tablename__ = "baselines"


class Upload(Base):
    """Samples of one upload (gzip JSONL of ``Sample.canonical_json``), content-addressed."""

    __tablename__ = "uploads"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    n_samples: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    encoding: Mapped[str] = mapped_column(String(20), default="jsonl+gzip")
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class Job(Base):
    """A unit of work run by ``workers.jobs.run_job``."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_heartbeat", "status", "heartbeat_at"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))
    space_id: Mapped[int] = mapped_column(ForeignKey("spaces.id", ondelete="RESTRICT"))
    task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"), index=True)
    upload_id: Mapped[int] = mapped_column(ForeignKey("uploads.id", ondelete="RESTRICT"), index=True)
    status: Mapped[str] = mapped_column(String(20), default=JOB_QUEUED)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease: Mapped[str | None] = mapped_column(String(64))
    worker: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class JobRequest(Base):
    """What a job's ``Idempotency-Key`` is bound to: the SHA-256 of its request (``atlas.idempotency``); a row only
    for a keyed job created since revision 0010."""

    __tablename__ = "job_requests"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    request_sha256: Mapped[str] = mapped_column(String(64))


class TaskUpload(Base):
    """The content address (``Upload.sha256``) of an upload a task holds without a job of this store to say so: it
    came with the task in a space export. Appending that upload again is refused as a repeat
    (:func:`atlas.repository.create_append_job`), as for an upload a job of the task added; an export carries both.
    Deleted with its task (since revision 0012)."""

    __tablename__ = "task_uploads"

    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)


class JobCheckpoint(Base):
    """Mergeable state of a running job after ``samples_done`` samples (deleted when it succeeds)."""

    __tablename__ = "job_checkpoints"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    samples_done: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[bytes] = mapped_column(LargeBinary)
    baselines: Mapped[bytes | None] = mapped_column(LargeBinary)
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Change(Base):
    """One entry of the change sequence (an upsert or delete of a task's signature)."""

    __tablename__ = "changes"
    __table_args__ = (Index("ix_changes_space_seq", "space_id", "seq"),)

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    space_id: Mapped[int] = mapped_column(BigInteger)
    task_id: Mapped[int] = mapped_column(BigInteger)
    op: Mapped[str] = mapped_column(String(10))
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiKey(Base):
    """An API key, stored as the sha256 of its plaintext."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class TaskRouting(Base):
    """A task's routing side (docs/SCORES.md): prompt-side state, calibration and threshold override.

    ``prompt_state`` is the FisherSketch state of the task's *prompts* (prompt mode of the extractor),
    kept only for completion-mode tasks, whose signature covers answer tokens a prompt does not have;
    text-mode tasks route on their own state. ``cal_scores`` are leave-one-out route scores of the
    task's own samples (held out from the routing state), ``threshold_auto`` their
    ``false_reject_rate`` quantile, ``score_scale`` their spread; ``threshold_override`` (PATCH or
    ``/v1/route/fit``) wins over ``threshold_auto`` when set; ``template_test`` false turns the template
    test (:mod:`atlas.template`) off for the task, ``novelty_test`` false its novelty test (:mod:`atlas.novelty`;
    PATCH or ``fit``).
    """

    __tablename__ = "task_routing"

    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    prompt_state: Mapped[bytes | None] = mapped_column(LargeBinary)
    prompt_digest: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The last 32 bytes of ``prompt_state`` (a state blob ends with its BLAKE2b digest): what the route path
    reads to find the state's cached view without reading the blob."""
    cal_scores: Mapped[list[float]] = mapped_column(JSON, default=list)
    cal_views: Mapped[list[list[Any]] | None] = mapped_column(JSON)
    """Held-out views by length: ``[tokens, score, whole]`` per calibration sample and per prefix of it
    (:func:`atlas.routing.leave_one_out_views`); ``None`` for a task calibrated before 2026-11-28."""
    threshold_auto: Mapped[float | None] = mapped_column(Float)
    score_scale: Mapped[float | None] = mapped_column(Float)
    false_reject_rate: Mapped[float | None] = mapped_column(Float)
    threshold_override: Mapped[float | None] = mapped_column(Float)
    template_test: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    novelty_test: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class TaskLexicon(Base):
    """A task's term counts (:class:`atlas.lexical.TermCounts` blob), summed over its jobs' samples.

    ``digest`` (BLAKE2b-128 of ``terms``) lets a reader cache the decoded counts by content; ``n_terms``
    is the number of distinct terms kept.
    """

    __tablename__ = "task_lexicon"

    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    digest: Mapped[bytes] = mapped_column(LargeBinary)
    n_terms: Mapped[int] = mapped_column(Integer)
    terms: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
