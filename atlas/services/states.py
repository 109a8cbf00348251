"""Stored task states for the exact re-rank, read through the change-log-driven :class:`~atlas.caches.StateCache`.

Cache hits need no SQL; misses read the blobs of the missing tasks in one query. Entries are dropped by
the index's change listeners (``IndexManager.listeners``), and every query catches the index up with
SQL first, so a hit is as fresh as the change log the query saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

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
    """Loads tasks' states, in the order asked, through a :class:`~atlas.caches.StateCache`."""

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
        ids = [int(i) for i in task_ids]
        epoch = self.cache.epoch
        entries = {i: e for i in ids if (e := self.cache.get(i)) is not None}
        missing = [i for i in ids if i not in entries]
        if missing:
            meta = sql.state_metas(session, missing)
            spec = self.store.spec_of(space)
            for tid, version, blob in sql.state_blobs(session, list(meta)):
                m = meta[tid]
                entries[tid] = self.cache.put(tid, m.name, m.space_id, version,
                                              SketchState.from_bytes(blob, spec=spec), epoch=epoch)
        out = []
        for i in ids:
            e = entries.get(i)
            if e is None:
                continue
            if e.space_id != space.id:
                raise IncompatibleSpace(f"task {i} belongs to space {e.space_id}, not {space.id}",
                                        {"task_id": i, "space_id": e.space_id})
            out.append(Loaded(i, e.name, e.state, e.view))
        return out

    def drop(self, task_id: int) -> None:
        """Forget a task (deleted)."""
        self.cache.drop(task_id)
