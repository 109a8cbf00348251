"""In-memory LRU caches of the service engine (:class:`service.engine.AtlasEngine`).

:class:`StateCache` keeps deserialised task states (and their route views) by task id and state
version; :class:`PromptCache` keeps prompt states by prompt text, so repeated prompts skip the
model forward. Both are thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from atlas import analysis

STATE_CACHE_BYTES = 512 * 1024 * 1024
"""Memory budget of the deserialised-state cache."""

PROMPT_CACHE_BYTES = 64 * 1024 * 1024
"""Memory budget of the prompt-state cache (repeated prompts skip the model forward)."""


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


class PromptCache:
    """LRU cache of prompt states: a prompt's state is a pure function of (model, spec, text)."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> Any | None:
        with self._lock:
            state = self._items.get(text)
            if state is not None:
                self._items.move_to_end(text)
            return state

    def put(self, text: str, state: Any) -> None:
        if self.max_items <= 0:
            return
        with self._lock:
            self._items[text] = state
            self._items.move_to_end(text)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
