"""Read side of the stored results: state and baseline blobs, signatures (bytes <-> float32 vectors).

Every function takes a session and works inside the caller's transaction (see :mod:`atlas.repository`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from atlas.baselines import BaselineSums
from atlas.errors import InvalidInput
from atlas.models import BaselineRow, Signature, SketchStateRow, Space


def vector_to_bytes(vector: np.ndarray, m: int) -> bytes:
    """Validate a signature (shape ``(m,)``, finite) and encode it as little-endian float32."""
    vec = np.asarray(vector, dtype=np.float32)
    if vec.shape != (m,):
        raise InvalidInput(f"signature must have shape ({m},), got {vec.shape}")
    if not np.all(np.isfinite(vec)):
        raise InvalidInput("signature has non-finite values")
    return vec.astype("<f4", copy=False).tobytes()


def bytes_to_vectors(blobs: Sequence[bytes], m: int) -> np.ndarray:
    """Decode signature blobs into a C-contiguous float32 matrix of shape ``(n, m)``."""
    out = np.empty((len(blobs), m), dtype=np.float32)
    for i, blob in enumerate(blobs):
        out[i] = np.frombuffer(blob, dtype="<f4", count=m)
    return out


def get_state_blob(session: Session, task_id: int) -> bytes | None:
    """The task's stored state blob, or ``None``."""
    return session.execute(select(SketchStateRow.blob).where(SketchStateRow.task_id == task_id)).scalar_one_or_none()


def get_baseline_blob(session: Session, task_id: int) -> bytes | None:
    """The task's stored baseline blob, or ``None``."""
    return session.execute(select(BaselineRow.blob).where(BaselineRow.task_id == task_id)).scalar_one_or_none()


def get_states(session: Session, task_ids: Sequence[int]) -> dict[int, bytes]:
    """State blobs of the given tasks (tasks without a state are absent from the result)."""
    stmt = select(SketchStateRow.task_id, SketchStateRow.blob).where(SketchStateRow.task_id.in_(list(task_ids)))
    return {int(t): b for t, b in session.execute(stmt)}


def get_baselines(session: Session, task_ids: Sequence[int]) -> dict[int, bytes]:
    """Baseline blobs of the given tasks (tasks without baselines are absent)."""
    stmt = select(BaselineRow.task_id, BaselineRow.blob).where(BaselineRow.task_id.in_(list(task_ids)))
    return {int(t): b for t, b in session.execute(stmt)}


def get_signatures(
    session: Session, *, task_ids: Sequence[int] | None = None, space_id: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Signatures of given tasks or of a whole space.

    Returns
    -------
    ids : ndarray, shape (n,), int64
        Task ids, ascending (tasks without a signature are left out).
    vectors : ndarray, shape (n, m), float32
    """
    if (task_ids is None) == (space_id is None):
        raise ValueError("give exactly one of task_ids or space_id")
    stmt = select(Signature.task_id, Signature.vector, Signature.space_id)
    stmt = stmt.where(Signature.task_id.in_(list(task_ids))) if task_ids is not None else stmt.where(
        Signature.space_id == space_id
    )
    rows = session.execute(stmt.order_by(Signature.task_id)).all()
    if not rows:
        return np.empty(0, dtype=np.int64), np.empty((0, 0), dtype=np.float32)
    spaces = {int(r[2]) for r in rows}
    if len(spaces) > 1:
        from atlas.errors import IncompatibleSpace

        raise IncompatibleSpace("the tasks belong to different spaces", {"space_ids": sorted(spaces)})
    m = session.get(Space, spaces.pop()).m  # type: ignore[union-attr]
    return np.array([r[0] for r in rows], dtype=np.int64), bytes_to_vectors([r[1] for r in rows], m)


def iter_signatures(
    session: Session, space_id: int, m: int, *, chunk: int = 4096
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(ids, vectors)`` chunks of a space's signatures in task-id order (keyset paging)."""
    after = -1
    while True:
        rows = session.execute(
            select(Signature.task_id, Signature.vector)
            .where(Signature.space_id == space_id, Signature.task_id > after)
            .order_by(Signature.task_id)
            .limit(chunk)
        ).all()
        if not rows:
            return
        yield np.array([r[0] for r in rows], dtype=np.int64), bytes_to_vectors([r[1] for r in rows], m)
        after = int(rows[-1][0])


def count_signatures(session: Session, space_id: int) -> int:
    """Number of stored signatures in a space."""
    stmt = select(func.count()).select_from(Signature).where(Signature.space_id == space_id)
    return int(session.execute(stmt).scalar_one())


def novelty_vectors(session: Session, task_ids: Sequence[int]) -> dict[int, np.ndarray]:
    """The stored novelty vectors of the given tasks, shape (n_t, r) each (tasks without any are absent; a
    baseline blob that does not read is skipped: the test is only off for that task)."""
    out: dict[int, np.ndarray] = {}
    for t, blob in get_baselines(session, list(task_ids)).items():
        try:
            sums = BaselineSums.from_bytes(bytes(blob))
        except ValueError:
            continue
        if len(sums.sample_keys):
            out[t] = sums.sample_vectors
    return out
