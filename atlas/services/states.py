"""Stored task states for the exact re-rank, read through an in-memory cache.

The cache is keyed by task id and state version: a state replaced by an append (new version) or
deleted is never served stale. Blobs are read from SQL only for tasks missing from the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from atlas import analysis
from atlas import repository as repo
from atlas import space_repository as sql
from atlas.caches import StateCache
from atlas.errors import IncompatibleSpace
from atlas.models import Space
from atlas.store import Store
from fishersketch import SketchState


@dataclass
class Loaded:
    """A task with its deserialised state (and the state's cached route view)."""

    task_id: int
    name: str
    state: SketchState
    view: Any = None


class StateLoader:
    """Loads ready tasks' states, in the order asked, through a :class:`~atlas.caches.StateCache`."""

    def __init__(self, store: Store, cache: StateCache) -> None:
        self.store = store
        self.cache = cache

    def load(self, session: Session, space: Space, task_ids: Sequence[int]) -> list[Loaded]:
        """Tasks of ``task_ids`` that have a state (in that order; others left out).

        Raises
        ------
        IncompatibleSpace
            A task belongs to another space.
        """
        if not task_ids:
            return []
        ids = [int(i) for i in task_ids]
        meta = sql.state_metas(session, ids)
        spec = self.store.spec_of(space)
        entries = {i: self.cache.get(i, meta[i].version) for i in meta}
        need = [i for i, e in entries.items() if e is None]
        if need:
            for tid, version, blob in sql.state_blobs(session, need):
                fresh = self.cache.put(tid, version, SketchState.from_bytes(blob, spec=spec))
                if version == meta[tid].version:
                    entries[tid] = fresh
        out = []
        for i in ids:
            if i not in meta:
                continue
            m = meta[i]
            if m.space_id != space.id:
                raise IncompatibleSpace(f"task {i} belongs to space {m.space_id}, not {space.id}",
                                        {"task_id": i, "space_id": m.space_id})
            entry = entries.get(i)
            if entry is None:  # replaced between the two reads: read it once more
                again = repo.get_state_blob(session, i)
                if again is None:
                    continue
                state = SketchState.from_bytes(again, spec=spec)
                entry = (state, analysis.state_view(state))
            out.append(Loaded(i, m.name, entry[0], entry[1]))
        return out

    def drop(self, task_id: int) -> None:
        """Forget a task (deleted)."""
        self.cache.drop(task_id)
