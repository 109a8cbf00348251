"""In-memory cache of deserialised task states, bounded in bytes and kept current by the change log.

The exact re-rank of a route (and recommend / align) reads the full FisherSketch state of every
candidate. Reading and decoding those blobs from SQL per request costs more than the search itself,
so a :class:`StateCache` keeps them in memory:

* **bounded in bytes** — every entry is charged the bytes of its arrays (state, route view) plus a
  fixed overhead; the least recently used entries are evicted once ``max_bytes`` is exceeded;
* **kept current by the change log** (:mod:`atlas.changes`) — the cache has a *watermark* like a
  FAISS index; :meth:`StateCache.sync` reads the changes after it and drops every entry a change row
  names (an upsert re-stores the state, a delete removes the task, a rename logs an upsert too). A
  request therefore costs no SQL at all when its candidates are cached and nothing changed, and one
  ``last_seq`` read at most every ``sync_interval_s`` otherwise;
* **correct under races** — an entry is tagged with the sequence number read *before* its blob, so
  a change committed after that read always drops it; an entry loaded while a concurrent sync moved
  the watermark past its tag is returned but not cached; when the changes after the watermark were
  pruned (:func:`atlas.changes.prune`), or another change sits at the watermark (a database restored
  from a backup and written again), the whole cache is cleared instead.

Only ``ready`` tasks have states; tasks without one are left out of :meth:`StateCache.get_many`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from atlas import analysis, changes
from atlas.errors import IncompatibleSpace
from atlas.models import SketchStateRow, Space, Task
from fishersketch import SketchSpec, SketchState

ENTRY_OVERHEAD_BYTES = 512
"""Bytes charged per entry on top of its arrays (Python objects, dict slots)."""

_IN_CHUNK = 500
_DIGEST = 32
"""Bytes of the digest a state blob ends with (``SketchState.to_bytes``)."""


@dataclass(frozen=True)
class LoadedState:
    """A ready task with its deserialised state and the state's route view.

    Attributes
    ----------
    task_id, name, space_id
        The task.
    version
        Version of its stored state row.
    state : fishersketch.SketchState
        The decoded state.
    view : tuple of ndarray
        :func:`atlas.analysis.state_view` of the state (computed once, when loaded).
    loaded_seq
        Change sequence number read before the state: every change ``<= loaded_seq`` is reflected.
    nbytes
        Bytes charged to the cache for this entry.
    digest
        The stored blob's trailing BLAKE2b digest (:meth:`SketchState.to_bytes`): names the state's content, whatever
        the store (a database restored under a running process reuses task ids and versions).
    """

    task_id: int
    name: str
    space_id: int
    version: int
    state: Any
    view: tuple[Any, ...]
    loaded_seq: int
    nbytes: int = field(default=0, compare=False)
    digest: bytes = b""


@dataclass
class CacheStats:
    """Counters of a :class:`StateCache`."""

    entries: int
    bytes: int
    max_bytes: int
    watermark: int
    hits: int
    misses: int
    evictions: int
    invalidations: int
    clears: int


def _entry_bytes(state: Any, view: tuple[Any, ...], name: str) -> int:
    arrays = (state.sums, state.sq_norms, state.token_counts, state.sample_counts, *view)
    return int(sum(np.asarray(a).nbytes for a in arrays)) + len(name.encode()) + ENTRY_OVERHEAD_BYTES


class StateCache:
    """LRU cache of :class:`LoadedState` by task id, bounded in bytes, invalidated by the change log.

    Parameters
    ----------
    max_bytes
        Memory budget; ``0`` disables caching (every call reads SQL).
    sync_interval_s
        :meth:`get_many` with ``fresh=True`` reads the change log at most this often (``0``: on
        every call, which gives read-your-writes across processes at one cheap query per request).

    Notes
    -----
    Thread-safe. One instance per process; several API replicas each keep their own and stay
    correct because each follows the shared change log.
    """

    def __init__(self, max_bytes: int, *, sync_interval_s: float = 0.25) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = int(max_bytes)
        self.sync_interval_s = float(sync_interval_s)
        self._items: OrderedDict[int, LoadedState] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._watermark = -1  # unknown until the first sync: nothing is cached before it
        self._mark = ""  # changes.mark of the change at the watermark (another one there: a restored database)
        self._last_sync = -float("inf")
        self._specs: dict[int, SketchSpec] = {}
        self._hits = self._misses = self._evictions = self._invalidations = self._clears = 0

    # -- reading ---------------------------------------------------------------------------------

    def get_many(
        self, factory: sessionmaker[Session], space: Space, task_ids: Sequence[int], *, fresh: bool = True
    ) -> list[LoadedState]:
        """States of ``task_ids`` in that order; tasks missing or without a state are left out.

        Parameters
        ----------
        factory
            Session factory (read-only is fine); used only for the change log and for misses.
        space
            The space every task must belong to (its ``spec`` decodes the blobs).
        task_ids
            Task ids; duplicates are returned once per occurrence.
        fresh
            Apply new change-log rows first (at most every ``sync_interval_s``).

        Raises
        ------
        IncompatibleSpace
            A task belongs to another space.
        """
        ids = [int(i) for i in task_ids]
        if not ids:
            return []
        if fresh and time.monotonic() - self._last_sync >= self.sync_interval_s:
            self.sync(factory)
        found: dict[int, LoadedState] = {}
        with self._lock:
            for i in dict.fromkeys(ids):
                entry = self._items.get(i)
                if entry is not None:
                    self._items.move_to_end(i)
                    found[i] = entry
            self._hits += len(found)
        need = [i for i in dict.fromkeys(ids) if i not in found]
        if need:
            self._misses += len(need)
            found.update(self._load(factory, space, need))
        out = []
        for i in ids:
            entry = found.get(i)
            if entry is None:
                continue
            if entry.space_id != space.id:
                raise IncompatibleSpace(
                    f"task {i} belongs to space {entry.space_id}, not {space.id}",
                    {"task_id": i, "space_id": entry.space_id},
                )
            out.append(entry)
        return out

    def _spec(self, space: Space) -> SketchSpec:
        spec = self._specs.get(space.id)
        if spec is None:
            spec = self._specs[space.id] = SketchSpec.from_dict(space.spec)
        return spec

    def _load(self, factory: sessionmaker[Session], space: Space, ids: list[int]) -> dict[int, LoadedState]:
        spec = self._spec(space)
        loaded: dict[int, LoadedState] = {}
        with factory() as session:
            seq = changes.last_seq(session)  # before the blobs: every change <= seq is in them
            for start in range(0, len(ids), _IN_CHUNK):
                part = ids[start : start + _IN_CHUNK]
                rows = session.execute(
                    select(Task.id, Task.name, Task.space_id, SketchStateRow.version, SketchStateRow.blob)
                    .join(SketchStateRow, SketchStateRow.task_id == Task.id)
                    .where(Task.id.in_(part))
                )
                for tid, name, sid, version, blob in rows:
                    if int(sid) != space.id:  # not decoded with a foreign spec; refused by the caller
                        loaded[int(tid)] = LoadedState(int(tid), str(name), int(sid), int(version), None,
                                                       (np.empty(0), np.empty(0)), seq)
                        continue
                    state = SketchState.from_bytes(blob, spec=spec)
                    view = analysis.state_view(state)
                    loaded[int(tid)] = LoadedState(int(tid), str(name), int(sid), int(version), state, view, seq,
                                                   _entry_bytes(state, view, str(name)), bytes(blob[-_DIGEST:]))
        with self._lock:
            if seq >= self._watermark >= 0:  # else a sync moved past `seq` meanwhile: do not cache
                for entry in loaded.values():
                    if entry.state is not None:
                        self._put(entry)
        return loaded

    def _put(self, entry: LoadedState) -> None:
        if entry.nbytes > self.max_bytes:
            return
        old = self._items.pop(entry.task_id, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._items[entry.task_id] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self._bytes -= evicted.nbytes
            self._evictions += 1

    # -- keeping current -------------------------------------------------------------------------

    def sync(self, factory: sessionmaker[Session], *, wait: bool = True) -> int:
        """Apply the change-log rows after the watermark; return how many entries were dropped.

        Parameters
        ----------
        factory
            Session factory.
        wait
            If another thread is syncing, wait for it (``True``) or return 0 at once.
        """
        if not self._sync_lock.acquire(blocking=wait):
            return 0
        try:
            self._last_sync = time.monotonic()
            with factory() as session:
                since = self._watermark
                log_head = changes.head(session, since)
                if log_head.unchanged(self._mark):
                    return 0
                head = log_head.seq
                # A database reset or restored from a backup behind our back (written up to the same head, too).
                restored = since >= 0 and not log_head.same_history(self._mark)
                self._mark = log_head.mark
                if since < 0 or head < since or restored:
                    return self._reset(head)
                records = changes.changes_since(session, since)
                # Read after the changes: a prune that raced with the read above shows here.
                if changes.pruned_seq(session) > since:
                    return self._reset(head)
            return self.apply_changes(records, head)
        finally:
            self._sync_lock.release()

    def apply_changes(self, records: Iterable[changes.ChangeRecord], head: int) -> int:
        """Drop the entries named by ``records`` and move the watermark to ``head``.

        For callers that already read the change log (e.g. alongside an index catch-up):
        ``records`` must be every change with ``watermark < seq <= head``.
        """
        dropped = 0
        with self._lock:
            for rec in records:
                entry = self._items.get(rec.task_id)
                if entry is not None and entry.loaded_seq < rec.seq:
                    del self._items[rec.task_id]
                    self._bytes -= entry.nbytes
                    dropped += 1
            self._invalidations += dropped
            self._watermark = max(self._watermark, int(head))
        return dropped

    def _reset(self, head: int) -> int:
        with self._lock:
            dropped = len(self._items)
            self._items.clear()
            self._bytes = 0
            self._watermark = int(head)
            self._clears += 1
        return dropped

    def invalidate(self, task_ids: Iterable[int]) -> None:
        """Drop entries (a local write can call this for read-your-writes before the next sync)."""
        with self._lock:
            for i in task_ids:
                entry = self._items.pop(int(i), None)
                if entry is not None:
                    self._bytes -= entry.nbytes
                    self._invalidations += 1

    def clear(self) -> None:
        """Drop every entry (the watermark is kept)."""
        with self._lock:
            self._items.clear()
            self._bytes = 0
            self._clears += 1

    # -- introspection ---------------------------------------------------------------------------

    @property
    def mark(self) -> str:
        """:func:`atlas.changes.mark` of the change at the watermark, as the last sync read it."""
        return self._mark

    @property
    def watermark(self) -> int:
        """Last change sequence number applied (``-1`` before the first sync)."""
        return self._watermark

    def __contains__(self, task_id: object) -> bool:
        with self._lock:
            return task_id in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def stats(self) -> CacheStats:
        """Entry count, bytes and counters."""
        with self._lock:
            return CacheStats(len(self._items), self._bytes, self.max_bytes, self._watermark, self._hits,
                              self._misses, self._evictions, self._invalidations, self._clears)
