"""Space export and import: a space as JSON lines, and its verified, all-or-nothing restore.

Format (version 2)::

    {"format": "fisher-atlas-space", "version": 2, "space": {...spec and fingerprints...}, "n_tasks": N}
    {"name": ..., "mode": ..., "metadata": {...}, "version": v, "n_samples": ..., "n_tokens": ...,
     "state": base64, "signature": base64, "baselines": base64 | null,
     "routing": {...} | null, "terms": base64,       (one line per ready task; "terms", the lexical record,
     "uploads": [sha256 hex, ...]}                    only when there is no routing record to carry it; "uploads",
                                                      the content addresses of the uploads the task holds)
    {"trailer": true, "n_tasks": n, "sha256": hex of every byte before this line}

Lines end at ``"\\n"`` only (JSON escapes every control character, so no record spans lines).

**Import verifies, never trusts** (:func:`parse_export`, all checks before anything is written):
every line is validated by a pydantic model; the spec must be within bounds (``m`` 64..65,536,
``d`` and ``K`` up to 2**21) and match its fingerprint; every state is deserialised against the spec
(a state of another space is refused, naming both specs), must be finite, and its counts must match
the line's; the signature is **recomputed from the state** and a stored signature that differs from
it (e.g. scaled) is refused; baselines must deserialise and have the space's width, a lexical record
(``terms``) must deserialise; names are normalised (stripped) like every other task name and must be
unique. **Completeness**: a version-2 file must end with the trailer,
whose count and SHA-256 must match (a truncated or edited export is refused). A version-1 file (no
trailer) is accepted only when its number of task lines equals the header's ``n_tasks``. Task
versions are preserved.

HTTP-agnostic: the functions take a session or session factory, a :class:`~atlas.models.Space` and
the raw bytes, or a memory map of the file (:func:`map_export`: an import then holds about one task's records at a
time besides the file's pages — it is checked in a first pass that keeps only each line's offsets and small fields,
and each task's records are decoded again as it is stored). Keeping the FAISS index caught up after an import is
the caller's job.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import mmap
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, BinaryIO, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from atlas import lexicon_repo, routing_repo
from atlas import repository as repo
from atlas import upload_repository as upload_repo
from atlas.db import read_snapshot
from atlas.errors import Conflict, InvalidInput, PayloadTooLarge
from atlas.json_bounds import MAX_JSON_VALUES, first_line_over
from atlas.models import TASK_READY, Space, Task
from atlas.samples import Metadata, nested_keys, refuse_control_chars, refuse_repeated_keys
from atlas.task_names import normalize_name

_NEWLINE = re.compile(b"\n")
ExportBytes = bytes | mmap.mmap
"""An export's content: its bytes, or a read-only memory map of its file (:func:`map_export`)."""
EXPORT_FORMAT = "fisher-atlas-space"
EXPORT_VERSION = 2
READABLE_VERSIONS = (1, 2)
EXPORT_CHUNK = 64
"""Tasks read per transaction while streaming an export."""
MAX_M = 65_536
MAX_DK = 1 << 21
SIGNATURE_ATOL = 1e-5
"""Largest difference allowed between a line's signature and the one recomputed from its state."""
MAX_HELD_UPLOADS = 10_000
"""Most upload addresses one task line carries (each append adds one; the line stays under the import's JSON value
bound): a task of more uploads keeps this many of them, the smallest addresses (an arbitrary but stable choice)."""


class ExportSpace(BaseModel):
    """The ``space`` object of an export header."""

    model_config = ConfigDict(extra="ignore")

    model_name: str = Field(default="imported", min_length=1, max_length=500)
    model_fingerprint: str = Field(min_length=1, max_length=200)
    spec_fingerprint: str = Field(min_length=1, max_length=200)
    d: int = Field(ge=1, le=MAX_DK)
    K: int = Field(ge=1, le=MAX_DK)
    m: int = Field(ge=64, le=MAX_M)
    seed: int = Field(ge=0, lt=2**63)
    spec: dict[str, Any]


class ExportHeader(BaseModel):
    """Line 1 of an export."""

    model_config = ConfigDict(extra="ignore")

    format: Literal["fisher-atlas-space"]
    version: int
    exported_at: str | None = None
    space: ExportSpace
    n_tasks: int = Field(ge=0)


class ExportTask(BaseModel):
    """One task line of an export. Counts and the version are bounded with room for appends (``2**53``, ``2**30``):
    counts near ``2**63`` wrapped negative on the next append, and a version at ``2**31 − 1`` passed PostgreSQL's
    integer after one."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=300)
    mode: Literal["text", "completion"]
    metadata: Metadata = Field(default_factory=dict)
    version: int = Field(default=1, ge=1, lt=2**30)
    n_samples: int = Field(ge=0, lt=2**53)
    n_tokens: int = Field(ge=0, lt=2**53)
    created_at: dt.datetime | None = None
    """When the task was created where it was exported (kept on import; a naive time is read as UTC)."""

    @field_validator("created_at")
    @classmethod
    def _in_utc(cls, when: dt.datetime | None) -> dt.datetime | None:
        try:
            return _aware(when)
        except OverflowError:  # year 1 at +01:00, 9999 at -02:00: not a date once read as UTC
            raise ValueError("out of the range of dates once read as UTC") from None
    state: str
    signature: str
    baselines: str | None = None
    routing: dict[str, Any] | None = None
    terms: str | None = None
    uploads: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = Field(default_factory=list,
                                                                            max_length=MAX_HELD_UPLOADS)
    """Content addresses of the uploads the task holds (its jobs' and those it was imported with): an append of one
    of them again after the import is refused as a repeat. Absent from exports written before 2026-12-02."""


class ExportTrailer(BaseModel):
    """Last line of a version-2 export."""

    model_config = ConfigDict(extra="forbid")

    trailer: Literal[True]
    n_tasks: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def _aware(when: dt.datetime | None) -> dt.datetime | None:
    """``when`` as an aware UTC time (an export written without a zone wrote UTC)."""
    if when is None:
        return None
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def ready_task_ids(session: Session, space_id: int) -> list[int]:
    """Ids of the space's ready tasks, ascending."""
    return [int(i) for i in session.execute(
        select(Task.id).where(Task.space_id == space_id, Task.status == TASK_READY).order_by(Task.id)
    ).scalars()]


def export_lines(read: sessionmaker[Session], space: Space, ids: list[int]) -> Iterator[bytes]:
    """The export of ``space`` restricted to ``ids`` (see the module docstring), lazily.

    ``space`` must be usable outside a session (expunged); every chunk of tasks is read in a fresh
    session from ``read``, and tasks deleted meanwhile are left out.
    """
    header = {
        "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
        "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        "space": {"id": space.id, "model_name": space.model_name, "model_fingerprint": space.model_fingerprint,
                  "spec_fingerprint": space.spec_fingerprint, "d": space.d, "K": space.K, "m": space.m,
                  "seed": space.seed, "spec": space.spec},
        "n_tasks": len(ids),
    }
    digest = hashlib.sha256()
    written = 0
    first = (json.dumps(header) + "\n").encode()
    digest.update(first)
    yield first
    for start in range(0, len(ids), EXPORT_CHUNK):
        part = ids[start : start + EXPORT_CHUNK]
        with read() as session:
            read_snapshot(session)  # a job's append between its reads of a state and a signature
            tasks = {t.id: t for t in session.execute(select(Task).where(Task.id.in_(part))).scalars()}
            states = repo.get_states(session, part)
            baselines = repo.get_baselines(session, part)
            sig_ids, vectors = repo.get_signatures(session, task_ids=part)
            routes = routing_repo.export_records(session, part)
            held = upload_repo.held_uploads(session, part)
            # the lexical record of a task without a routing record (stored before routing existed, or whose
            # prompt-side pass failed) is not in ``routes``: carried on its own, else the import loses it
            orphan_terms = lexicon_repo.get_blobs(session, [t for t in part if t not in routes])
        sigs = {int(i): v for i, v in zip(sig_ids, vectors, strict=True)}
        for tid in part:
            t = tasks.get(tid)
            if t is None or tid not in states or tid not in sigs:
                continue  # deleted meanwhile
            line = {
                "name": t.name, "mode": t.mode, "metadata": t.meta or {}, "n_samples": t.n_samples,
                "n_tokens": t.n_tokens, "version": max(int(t.version or 1), 1),
                "created_at": t.created_at.isoformat() if t.created_at else None,
                "state": base64.b64encode(states[tid]).decode(),
                "signature": base64.b64encode(sigs[tid].astype("<f4").tobytes()).decode(),
                "baselines": base64.b64encode(baselines[tid]).decode() if tid in baselines else None,
                "routing": routes.get(tid),
                "uploads": held.get(tid, [])[:MAX_HELD_UPLOADS],
            }
            if tid in orphan_terms:
                line["terms"] = base64.b64encode(orphan_terms[tid]).decode()
            out = (json.dumps(line) + "\n").encode()
            digest.update(out)
            written += 1
            yield out
    trailer = {"trailer": True, "n_tasks": written, "sha256": digest.hexdigest()}
    yield (json.dumps(trailer) + "\n").encode()


@contextmanager
def map_export(file: BinaryIO) -> Iterator[ExportBytes]:
    """A read-only memory map of an export file's content (``b""`` for an empty file), for :func:`import_space`:
    the pages come from the file as they are read, so an import of a large export does not copy it into memory.

    Parameters
    ----------
    file : binary file object with a ``fileno`` (an open file; a spooled upload rolls over to disk)
    """
    file.flush()
    size = os.fstat(file.fileno()).st_size
    if size == 0:
        yield b""
        return
    mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield mapped
    finally:
        mapped.close()


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'line'}: {e['msg']}" for e in exc.errors()[:5])


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not valid base64") from None


def _spans(data: ExportBytes, start: int, stop: int) -> Iterator[tuple[int, int]]:
    """The ``(start, stop)`` offsets of the lines of ``data[start:stop]`` (split on ``"\\n"`` only); at least one."""
    while True:
        nl = data.find(b"\n", start, stop)
        if nl < 0:
            yield start, stop
            return
        yield start, nl
        start = nl + 1


class _TaskParts(NamedTuple):
    """What an import stores of one task line besides its small fields (:func:`_line_parts`)."""

    state: bytes
    signature: np.ndarray
    """``(m,)`` float32: recomputed from the state, as :func:`parse_export` checked it against the line's."""
    baselines: bytes | None
    routing: Any
    terms: Any


def _line_parts(data: ExportBytes, span: tuple[int, int], spec: Any) -> _TaskParts:
    """The records of the task line at ``span``, decoded again: :func:`parse_export` checked them and kept only where
    they are (a state, its signature and baselines, and a completion task's prompt-side state in its routing record,
    are all but a few bytes of a task's line), so an import holds one task's records at a time."""
    from fishersketch import SketchState

    rec = ExportTask.model_validate_json(data[span[0]:span[1]])
    state = _b64(rec.state, "state")
    terms = lexicon_repo.LexicalRecord.from_bytes(_b64(rec.terms, "terms")) if rec.terms else None
    signature = SketchState.from_bytes(state, spec=spec).signature().astype(np.float32)
    return _TaskParts(state, signature, _b64(rec.baselines, "baselines") if rec.baselines else None, rec.routing,
                      terms)


def parse_export(data: ExportBytes) -> tuple[Any, str, str, list[dict[str, Any]]]:
    """Validate an export (see the module docstring): ``(spec, model_fingerprint, model_name, tasks)``.

    ``data`` is the file's bytes, or a memory map of it (what an import reads: the file is not copied into memory).
    A task's checked records (state, signature, baselines, routing and lexical records) are not kept: its line's
    offsets are (``"span"``), and :func:`_line_parts` decodes them again when the task is stored.

    Raises
    ------
    InvalidInput
        (422) naming the line and the problem; nothing is returned for a file with any problem.
    """
    from atlas.baselines import BaselineSums
    from fishersketch import SketchSpec, SketchState, SpecMismatch

    # Lines are found by offset and read one at a time: a list of every line (data.split) of a file of millions of
    # short lines cost hundreds of megabytes before the first one was checked.
    if (over := first_line_over(data, MAX_JSON_VALUES)) is not None:
        raise PayloadTooLarge(f"line {over} of the import holds more than {MAX_JSON_VALUES} JSON values; no exported "
                              "task does", {"line": over, "max_json_values": MAX_JSON_VALUES})
    end = len(data) - 1 if data[-1:] == b"\n" else len(data)  # the content, without a final newline
    first_nl = data.find(b"\n", 0, end)
    head_end = end if first_nl < 0 else first_nl
    if not data[:head_end].strip():
        raise InvalidInput("the import file is empty")
    try:
        header = ExportHeader.model_validate_json(data[:head_end])
        refuse_repeated_keys(bytes(data[:head_end]), len(header.model_fields_set) + len(header.space.model_fields_set)
                             + nested_keys(header.space.spec))
    except ValidationError as exc:
        raise InvalidInput(f"line 1 is not a FisherAtlas space export header ({_errors(exc)})") from None
    except InvalidInput as exc:
        raise InvalidInput(f"line 1: {exc.message}", exc.detail) from None
    if header.version not in READABLE_VERSIONS:
        raise InvalidInput(f"unsupported export version {header.version} (this service reads {READABLE_VERSIONS})")
    sp = header.space
    for what, text in (("the export's model name", sp.model_name), ("its model fingerprint", sp.model_fingerprint),
                       ("its spec fingerprint", sp.spec_fingerprint)):
        if "\x00" in text:  # stored in text columns: PostgreSQL refuses NUL (a 500), SQLite kept it
            raise InvalidInput(f"{what} holds a NUL character")
        refuse_control_chars(text, what)
    try:
        spec = SketchSpec.from_dict(sp.spec)
    except Exception as exc:
        raise InvalidInput(f"the export's sketch spec is invalid: {exc}") from None
    if (spec.d, spec.K, spec.m, spec.seed) != (sp.d, sp.K, sp.m, sp.seed):
        raise InvalidInput("the export's spec disagrees with its space's d, K, m or seed")
    if spec.fingerprint() != sp.spec_fingerprint:
        raise InvalidInput("the export's spec does not match its spec fingerprint")
    body_start, body_end = (end, end) if first_nl < 0 else (first_nl + 1, end)  # the lines after the header
    n_body = 0 if first_nl < 0 else sum(1 for _ in _NEWLINE.finditer(data, body_start, end)) + 1
    if header.version >= 2:
        last_nl = data.rfind(b"\n", 0, end)
        trailer_line = data[last_nl + 1:end] if first_nl >= 0 else b""
        try:
            trailer = ExportTrailer.model_validate_json(trailer_line)
        except ValidationError:
            raise InvalidInput("the export is incomplete: its last line is not the trailer (the file was cut "
                               "short or edited); export the space again") from None
        if trailer.sha256 != hashlib.sha256(memoryview(data)[:last_nl + 1]).hexdigest():
            raise InvalidInput("the export's checksum does not match its content (the file was edited or damaged)")
        body_end, n_body = last_nl, n_body - 1
        if trailer.n_tasks != n_body:
            raise InvalidInput(f"the export's trailer counts {trailer.n_tasks} tasks but the file holds {n_body}")
    body = _spans(data, body_start, body_end) if n_body else iter(())
    if header.version < 2:
        non_blank = sum(1 for a, b in _spans(data, body_start, body_end) if data[a:b].strip()) if n_body else 0
        if non_blank != header.n_tasks:
            raise InvalidInput(f"the version-1 export holds {n_body} task lines but its header announces "
                               f"{header.n_tasks}: the file is incomplete")
    tasks: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    widths: set[int] = set()
    for lineno, span in enumerate(body, start=2):
        line = data[span[0]:span[1]]
        if not line.strip():
            continue
        try:
            rec = ExportTask.model_validate_json(line)
            # a repeated key kept its last value (a name, a metadata key), as the service refuses elsewhere
            refuse_repeated_keys(line, len(rec.model_fields_set) + nested_keys(rec.metadata)
                                 + nested_keys(rec.routing))
        except ValidationError as exc:
            raise InvalidInput(f"line {lineno}: invalid task record ({_errors(exc)})") from None
        except InvalidInput as exc:
            raise InvalidInput(f"line {lineno}: {exc.message}", exc.detail) from None
        try:
            state_blob = _b64(rec.state, "state")
            sig = np.frombuffer(_b64(rec.signature, "signature"), dtype="<f4")
            base_blob = _b64(rec.baselines, "baselines") if rec.baselines else None
            base = BaselineSums.from_bytes(base_blob) if base_blob is not None else None
            base_d = base.d if base is not None else spec.d
            if base_d not in (spec.d, spec.d - 1):  # the head input's width H (d = H + 1 with a head bias)
                raise ValueError(f"baselines of width {base_d} do not belong to a space of d = {spec.d}")
            if base is not None:
                base.check_imported()
                widths.add(base_d)
                if len(widths) > 1:  # one model: one width (crafted tasks of another could outvote the space's)
                    raise ValueError(f"baselines of widths {sorted(widths)} in one export")
            terms_blob = _b64(rec.terms, "terms") if rec.terms else None
        except ValueError as exc:
            raise InvalidInput(f"line {lineno}: {exc}") from None
        try:
            if terms_blob is not None:  # checked here; decoded again when the task is stored (_line_parts)
                lexicon_repo.LexicalRecord.from_bytes(terms_blob)
        except Exception as exc:
            raise InvalidInput(f"line {lineno}: unreadable lexical record ({exc})") from None
        try:
            state = SketchState.from_bytes(state_blob, spec=spec)
        except SpecMismatch as exc:
            raise InvalidInput(f"line {lineno}: the task's state belongs to another space than the export's "
                               f"header (spec {spec.fingerprint()}): {exc}") from None
        except Exception as exc:
            raise InvalidInput(f"line {lineno}: unreadable state ({exc})") from None
        recomputed = state.signature()
        if not np.all(np.isfinite(recomputed)):
            raise InvalidInput(f"line {lineno}: the state holds non-finite values")
        if np.any(state.token_counts >= 2**53) or np.any(state.sample_counts >= 2**53):
            raise InvalidInput(f"line {lineno}: the state's counts are past 2**53")
        if sig.shape != (spec.m,):
            raise InvalidInput(f"line {lineno}: signature has {sig.shape[0]} values, expected {spec.m}")
        if not np.all(np.isfinite(sig)) or float(np.max(np.abs(sig - recomputed))) > SIGNATURE_ATOL:
            raise InvalidInput(f"line {lineno}: the signature does not match the one recomputed from the task's "
                               "state (tampered or corrupt)")
        if (rec.n_samples, rec.n_tokens) != (state.n_samples, state.n_tokens):
            raise InvalidInput(f"line {lineno}: counts ({rec.n_samples} samples, {rec.n_tokens} tokens) differ "
                               f"from the state's ({state.n_samples}, {state.n_tokens})")
        try:
            name = normalize_name(rec.name, imported=True)
        except InvalidInput as exc:
            raise InvalidInput(f"line {lineno}: {exc.message}", exc.detail) from None
        exported = rec.name.strip()
        if (name, exported) in seen:
            raise InvalidInput(f"line {lineno}: duplicate task name {name!r}")
        seen.add((name, exported))
        tasks.append({"name": name, "mode": rec.mode, "metadata": rec.metadata, "version": rec.version,
                      "n_samples": state.n_samples, "n_tokens": state.n_tokens, "span": span,
                      "created_at": rec.created_at, "uploads": rec.uploads, "exported": exported})
    # Two names of one normal form (a decomposed and a composed 'café', both kept by revision 0007 from before names
    # were normalised) keep their exported forms, as their store holds them: their export was refused by its own import.
    forms = Counter(t["name"] for t in tasks)
    for t in tasks:
        exported = t.pop("exported")
        t["keep_form"] = forms[t["name"]] > 1
        if t["keep_form"]:
            t["name"] = exported
    return spec, sp.model_fingerprint, sp.model_name, tasks


def import_space(write: sessionmaker[Session], data: ExportBytes, *, on_conflict: str = "fail",
                 fingerprint_aliases: Mapping[str, str] | None = None) -> tuple[int, int, list[str]]:
    """Restore an export (all or nothing): returns ``(space_id, imported, skipped_names)``.

    ``on_conflict``: ``"fail"`` (:class:`~atlas.errors.Conflict` if any task name already exists in
    the target space) or ``"skip"`` (such tasks are left out and named in ``skipped_names``).
    ``fingerprint_aliases`` maps an earlier model fingerprint of the loaded model to its current one, so an
    export written under an earlier key lands in the loaded model's space; so do the aliases stored by processes
    loading the model (``model_key_aliases``: an API without the model).

    Memory: the file (or its memory map, :func:`map_export`) and one task's rows at a time — each task is flushed
    into the transaction and its ORM objects let go, so an import of thousands of tasks does not hold their states
    twice over until the commit.
    """
    if on_conflict not in ("fail", "skip"):
        raise InvalidInput("on_conflict must be 'fail' or 'skip'", {"on_conflict": on_conflict})
    spec, model_fingerprint, model_name, tasks = parse_export(data)
    model_fingerprint = (fingerprint_aliases or {}).get(model_fingerprint, model_fingerprint)
    skipped: list[str] = []
    with write.begin() as session:
        # an earlier key of a model some process here loads (a worker): its space, not a second one nobody serves
        model_fingerprint = repo.current_model_key(session, model_fingerprint)
        space = repo.get_or_create_space(
            session, model_fingerprint=model_fingerprint, spec_fingerprint=spec.fingerprint(),
            model_name=model_name, d=spec.d, K=spec.K, m=spec.m, seed=spec.seed,
            spec=spec.to_dict(),
        )
        session.flush()
        space_id = int(space.id)
        for t in tasks:
            repo.free_failed_name(session, space_id, t["name"])
        existing = set(session.execute(select(Task.name).where(Task.space_id == space_id)).scalars())
        clash = [t["name"] for t in tasks if t["name"] in existing]
        if clash and on_conflict == "fail":
            raise Conflict(f"{len(clash)} task name(s) already exist in space {space_id}: {clash[:10]}; import "
                           "with on_conflict=skip (CLI: --on-conflict skip) to leave those tasks out",
                           {"names": clash})
        for t in tasks:
            if t["name"] in existing:
                skipped.append(t["name"])
                continue
            parts = _line_parts(data, t["span"], spec)
            routing, terms = parts.routing, parts.terms
            task = repo.create_ready_task(
                session, space_id, t["name"], t["mode"], t["metadata"], state=parts.state,
                signature=parts.signature, baselines=parts.baselines, n_samples=t["n_samples"],
                n_tokens=t["n_tokens"], keep_form=t["keep_form"],
            )
            task.version = t["version"]  # preserved, not reset
            if t["created_at"] is not None:
                task.created_at = t["created_at"]  # the task's age travels with it
            try:
                routing_repo.import_record(session, task.id, routing, spec)
            except InvalidInput as exc:  # name the task of the file: its new id is rolled back with the import
                raise InvalidInput(f"task {t['name']!r}: {exc.message}", exc.detail) from None
            if terms is not None and not (isinstance(routing, dict) and routing.get("terms")):
                lexicon_repo.put_record(session, task.id, terms)
            upload_repo.record_held_uploads(session, task.id, t["uploads"])
            session.flush()
            session.expunge_all()  # the rows are in the transaction; their ORM copies (the state) need not stay
    return space_id, len(tasks) - len(skipped), skipped
