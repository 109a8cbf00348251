"""In-memory LRU cache of deserialised task states (used by :class:`atlas.services.StateLoader`).

:class:`StateCache` keeps deserialised task states (and their route views) by task id and state
version; thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from atlas import analysis

STATE_CACHE_BYTES = 512 * 1024 * 1024
"""Memory budget of the deserialised-state cache."""


class StateCache:
    """LRU cache of deserialised states and their route views, by task id and state version."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max(1, max_items)
        self._items: OrderedDict[int, tuple[int, tuple[Any, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, task_id: int, version: int) -> tuple[Any, Any] | None:
        """``(state, view)`` of the task at ``version``, or ``None``."""
        with self._lock:
            hit = self._items.get(task_id)
            if hit is None or hit[0] != version:
                return None
            self._items.move_to_end(task_id)
            return hit[1]

    def put(self, task_id: int, version: int, state: Any) -> tuple[Any, Any]:
        """Cache a state (its :func:`atlas.analysis.state_view` is computed once here)."""
        entry = (state, analysis.state_view(state))
        with self._lock:
            self._items[task_id] = (version, entry)
            self._items.move_to_end(task_id)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return entry

    def drop(self, task_id: int) -> None:
        with self._lock:
            self._items.pop(task_id, None)
