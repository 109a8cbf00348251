"""A thread-safe LRU keyed by content (a digest), bounded by the total weight of what it holds.

Used for decoded blobs on the route path (prompt-side states in :mod:`atlas.routing_repo`, term counts
in :mod:`atlas.lexicon_repo`): keys are content digests, so two stores in one process (a server and a
library, or tests) never share an entry by task id, and an entry never goes stale.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ContentLru(Generic[V]):
    """LRU of values by content key, evicting the least recently used while ``Σ weigh(v) > max_weight``
    (the newest entry is always kept). ``weigh`` defaults to 1 per entry (a count bound)."""

    def __init__(self, max_weight: int, weigh: Callable[[V], int] | None = None) -> None:
        self.max_weight = max_weight
        self._weigh = weigh or (lambda _v: 1)
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Total weight held."""
        return self._held

    def get(self, key: Hashable) -> V | None:
        """The value for ``key`` (now the most recently used), or ``None``."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: Hashable, value: V) -> None:
        """Hold ``value`` under ``key`` (a key already held keeps its value: same content)."""
        with self._lock:
            if key in self._items:
                return
            self._items[key] = value
            self._held += self._weigh(value)
            while self._held > self.max_weight and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._held -= self._weigh(old)

    def get_or_make(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value for ``key``, made (outside the lock) and held on a miss."""
        hit = self.get(key)
        if hit is None:
            hit = make()
            self.put(key, hit)
        return hit

    def clear(self) -> None:
        """Forget every value."""
        with self._lock:
            self._items.clear()
            self._held = 0
