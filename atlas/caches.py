"""In-memory cache of deserialised task states, bounded in bytes, kept current by the change log.

:class:`StateCache` holds, per task, its name, space, state version, the deserialised
:class:`~fishersketch.SketchState` and its route view (:func:`atlas.analysis.state_view`). It is filled
on demand by :class:`atlas.services.StateLoader` and invalidated by the FAISS
:class:`~atlas.index.IndexManager`'s change listeners: every change row of a task (append, delete,
import) drops its entry when the index applies it, and a rebuild drops the space's entries. A query
first catches the index up with SQL (read-your-writes), so a cached entry is never older than the
change log the query saw; hits need no SQL at all. Least recently used entries are evicted past
``max_bytes``. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas import analysis

STATE_CACHE_BYTES = 512 * 1024 * 1024
"""Default memory budget of the deserialised-state cache."""


@dataclass(frozen=True)
class CachedState:
    """One task's state as the re-rank needs it."""

    task_id: int
    name: str
    space_id: int
    version: int
    state: Any
    view: Any
    nbytes: int


def _nbytes(state: Any, view: Any) -> int:
    arrays = [getattr(state, f, None) for f in ("sums", "sq_norms", "token_counts", "sample_counts")]
    arrays += list(view) if isinstance(view, tuple) else [view]
    return 256 + sum(int(a.nbytes) for a in arrays if isinstance(a, np.ndarray))


class StateCache:
    """LRU of :class:`CachedState` by task id, bounded by ``max_bytes`` (see the module docstring)."""

    def __init__(self, max_bytes: int = STATE_CACHE_BYTES) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._items: OrderedDict[int, CachedState] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.epoch = 0
        """Bumped by every invalidation: a reader that saw another epoch before its SQL read must not
        cache what it read (the change that bumped it may be newer than the read)."""

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, task_id: int) -> CachedState | None:
        """The cached state of a task, or ``None``."""
        with self._lock:
            hit = self._items.get(task_id)
            if hit is None:
                self.misses += 1
                return None
            self._items.move_to_end(task_id)
            self.hits += 1
            return hit

    def put(self, task_id: int, name: str, space_id: int, version: int, state: Any, *,
            epoch: int | None = None) -> CachedState:
        """Cache a state read from SQL at ``epoch`` (its route view is computed once here); returns the
        entry. Nothing is cached when an invalidation happened since ``epoch``."""
        view = analysis.state_view(state)
        entry = CachedState(task_id, name, space_id, version, state, view, _nbytes(state, view))
        with self._lock:
            if epoch is not None and epoch != self.epoch:
                return entry
            old = self._items.pop(task_id, None)
            if old is not None:
                self._bytes -= old.nbytes
            if entry.nbytes <= self.max_bytes:
                self._items[task_id] = entry
                self._bytes += entry.nbytes
            while self._bytes > self.max_bytes and self._items:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= evicted.nbytes
        return entry

    def drop(self, task_id: int) -> None:
        """Forget a task."""
        with self._lock:
            self.epoch += 1
            old = self._items.pop(task_id, None)
            if old is not None:
                self._bytes -= old.nbytes

    def on_changes(self, space_id: int, task_ids: list[int] | None) -> None:
        """Index change listener: drop the changed tasks, or every task of a rebuilt space."""
        with self._lock:
            self.epoch += 1
            ids = [t for t, e in self._items.items() if e.space_id == space_id] if task_ids is None else task_ids
            for t in ids:
                old = self._items.pop(int(t), None)
                if old is not None:
                    self._bytes -= old.nbytes
