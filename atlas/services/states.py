"""Stored task states for the exact re-rank, read through :class:`~atlas.state_cache.StateCache`.

The cache is bounded in bytes and follows the change log on its own (``StateCache.sync``), so a cache
hit runs no SQL; misses read the blobs of the missing tasks in one query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from atlas.models import Space
from atlas.state_cache import StateCache
from atlas.store import Store
from fishersketch import SketchState


@dataclass
class Loaded:
    """A task with its deserialised state (and the state's cached route view)."""

    task_id: int
    name: str
    state: SketchState
    view: Any = None
    version: int = 0
    """Version of the stored state row (a new one at every append)."""
    digest: bytes = b""
    """The stored state's content digest (what names the state, in any store: a restored database reuses task ids
    and versions)."""


class StateLoader:
    """Loads tasks' states, in the order asked (others left out), through the state cache."""

    def __init__(self, store: Store, cache: StateCache) -> None:
        self.store = store
        self.cache = cache

    def load(self, session: Session, space: Space, task_ids: Sequence[int]) -> list[Loaded]:
        """Ready tasks of ``task_ids`` with their states (``session`` is the caller's read snapshot; the
        cache reads misses through its own).

        Raises
        ------
        IncompatibleSpace
            A task belongs to another space.
        """
        return [Loaded(e.task_id, e.name, e.state, e.view, e.version, e.digest)
                for e in self.cache.get_many(self.store.read, space, [int(i) for i in task_ids])]

    def sync(self) -> int:
        """Apply new change-log rows to the cache (the background loop calls this)."""
        return self.cache.sync(self.store.read, wait=False)

    def catch_up(self, head: int, *, mark: str | None = None, check: bool = False) -> None:
        """Apply the change log now if the cache has not seen change ``head`` (read-your-writes: a
        change the caller's snapshot shows is never answered from a stale entry, whatever the cache's
        sync interval), or is ahead of it (a database restored under this replica), or the change there is another
        one than the cache saw (``mark``, :func:`atlas.changes.mark` of ``head``: a database restored and written
        up to the same number again — the index, caught up by another thread, no longer said so), or when
        ``check``; no SQL when the cache is current."""
        if check or head != self.cache.watermark or (mark is not None and mark != self.cache.mark):
            self.cache.sync(self.store.read)

    def drop(self, task_id: int) -> None:
        """Forget a task (deleted)."""
        self.cache.invalidate([task_id])
