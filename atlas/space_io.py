"""Space export and import: a space as JSON lines, and its all-or-nothing restore.

An export is a header line (``format``, ``version``, the space's spec and fingerprints, the task
count) followed by one line per ready task with its name, mode, metadata, counts and the base64
state, signature and baselines. :func:`import_space` validates the whole file before writing
anything, then stores every task in one transaction in the space with the export's model and spec
fingerprints (created if needed).

HTTP-agnostic and engine-agnostic: the functions take a session or session factory, a
:class:`~atlas.models.Space` and the raw bytes. Keeping the FAISS index caught up after an import is
the caller's job (:meth:`atlas.services.SpaceService.import_space`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from atlas import repository as repo
from atlas.errors import Conflict, InvalidInput
from atlas.models import TASK_READY, Space, Task

EXPORT_FORMAT = "fisher-atlas-space"
EXPORT_VERSION = 1
EXPORT_CHUNK = 64
"""Tasks read per transaction while streaming an export."""


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
    yield (json.dumps(header) + "\n").encode()
    for start in range(0, len(ids), EXPORT_CHUNK):
        part = ids[start : start + EXPORT_CHUNK]
        with read() as session:
            tasks = {t.id: t for t in session.execute(select(Task).where(Task.id.in_(part))).scalars()}
            states = repo.get_states(session, part)
            baselines = repo.get_baselines(session, part)
            sig_ids, vectors = repo.get_signatures(session, task_ids=part)
        sigs = {int(i): v for i, v in zip(sig_ids, vectors, strict=True)}
        for tid in part:
            t = tasks.get(tid)
            if t is None or tid not in states or tid not in sigs:
                continue  # deleted meanwhile
            line = {
                "name": t.name, "mode": t.mode, "metadata": t.meta or {}, "n_samples": t.n_samples,
                "n_tokens": t.n_tokens, "created_at": t.created_at.isoformat() if t.created_at else None,
                "state": base64.b64encode(states[tid]).decode(),
                "signature": base64.b64encode(sigs[tid].astype("<f4").tobytes()).decode(),
                "baselines": base64.b64encode(baselines[tid]).decode() if tid in baselines else None,
            }
            yield (json.dumps(line) + "\n").encode()


def parse_export(data: bytes) -> tuple[Any, str, str, list[dict[str, Any]]]:
    """Validate an export: ``(spec, model_fingerprint, model_name, tasks)``.

    Every line is checked (states deserialised against the spec, signature lengths, modes, unique
    names) before anything is returned; any problem raises :class:`~atlas.errors.InvalidInput`.
    """
    from fishersketch import SketchSpec, SketchState

    try:
        lines = [ln for ln in data.decode("utf-8").splitlines() if ln.strip()]
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the import file is not UTF-8 JSON lines (byte {exc.start})") from None
    if not lines:
        raise InvalidInput("the import file is empty")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"line 1 is not JSON: {exc.msg}") from None
    if not isinstance(header, dict) or header.get("format") != EXPORT_FORMAT:
        raise InvalidInput(f"not a FisherAtlas space export (expected format {EXPORT_FORMAT!r} on line 1)")
    if header.get("version") != EXPORT_VERSION:
        raise InvalidInput(f"unsupported export version {header.get('version')!r}")
    sp = header.get("space") or {}
    try:
        spec = SketchSpec.from_dict(sp["spec"])
    except Exception as exc:
        raise InvalidInput(f"the export's sketch spec is invalid: {exc}") from None
    if spec.fingerprint() != sp.get("spec_fingerprint"):
        raise InvalidInput("the export's spec does not match its spec fingerprint")
    model_fingerprint, model_name = sp.get("model_fingerprint"), sp.get("model_name", "imported")
    if not isinstance(model_fingerprint, str) or not 0 < len(model_fingerprint) <= 200:
        raise InvalidInput("the export's space needs a model_fingerprint string of 1-200 characters")
    if not isinstance(model_name, str) or not 0 < len(model_name) <= 500:
        raise InvalidInput("the export's model_name must be a string of 1-500 characters")
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    for lineno, line in enumerate(lines[1:], start=2):
        try:
            rec = json.loads(line)
            name = str(rec["name"])
            state_blob = base64.b64decode(rec["state"], validate=True)
            sig = np.frombuffer(base64.b64decode(rec["signature"], validate=True), dtype="<f4")
            base_blob = base64.b64decode(rec["baselines"], validate=True) if rec.get("baselines") else None
            counts = {key: int(rec.get(key, 0)) for key in ("n_samples", "n_tokens")}
            if not all(0 <= v < 2**63 for v in counts.values()):
                raise ValueError(f"counts out of range: {counts}")
            state = SketchState.from_bytes(state_blob, spec=spec)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"line {lineno}: invalid task record ({exc})") from None
        except Exception as exc:
            raise InvalidInput(f"line {lineno}: unreadable state ({exc})") from None
        if sig.shape != (spec.m,):
            raise InvalidInput(f"line {lineno}: signature has {sig.shape[0]} values, expected {spec.m}")
        if rec.get("mode") not in ("text", "completion"):
            raise InvalidInput(f"line {lineno}: mode must be 'text' or 'completion'")
        if name in seen:
            raise InvalidInput(f"line {lineno}: duplicate task name {name!r}")
        seen.add(name)
        del state
        tasks.append({"name": name, "mode": rec["mode"], "metadata": rec.get("metadata") or {}, **counts,
                      "state": state_blob, "signature": sig.copy(), "baselines": base_blob})
    return spec, model_fingerprint, model_name, tasks


def import_space(write: sessionmaker[Session], data: bytes, *,
                 on_conflict: str = "fail") -> tuple[int, int, list[str]]:
    """Restore an export (all or nothing): returns ``(space_id, imported, skipped_names)``.

    ``on_conflict``: ``"fail"`` (:class:`~atlas.errors.Conflict` if any task name already exists in
    the target space) or ``"skip"`` (such tasks are left out and named in ``skipped_names``).
    """
    if on_conflict not in ("fail", "skip"):
        raise InvalidInput("on_conflict must be 'fail' or 'skip'", {"on_conflict": on_conflict})
    spec, model_fingerprint, model_name, tasks = parse_export(data)
    skipped: list[str] = []
    with write.begin() as session:
        space = repo.get_or_create_space(
            session, model_fingerprint=model_fingerprint, spec_fingerprint=spec.fingerprint(),
            model_name=model_name, d=spec.d, K=spec.K, m=spec.m, seed=spec.seed,
            spec=spec.to_dict(),
        )
        session.flush()
        existing = set(session.execute(select(Task.name).where(Task.space_id == space.id)).scalars())
        clash = [t["name"] for t in tasks if t["name"] in existing]
        if clash and on_conflict == "fail":
            raise Conflict(f"{len(clash)} task name(s) already exist in space {space.id}: {clash[:10]}",
                           {"names": clash})
        for t in tasks:
            if t["name"] in existing:
                skipped.append(t["name"])
                continue
            repo.create_ready_task(
                session, space.id, t["name"], t["mode"], t["metadata"], state=t["state"],
                signature=t["signature"], baselines=t["baselines"], n_samples=t["n_samples"],
                n_tokens=t["n_tokens"],
            )
        space_id = int(space.id)
    return space_id, len(tasks) - len(skipped), skipped
