"""One fitted model per space, re-fitted when the space's tasks change: the staleness rule of the route path's
space-level fits (the ranking's whitening, :mod:`atlas.whitening`; the open set's novelty model,
:mod:`atlas.novelty`).

A fit is keyed by the space's content mark (:meth:`atlas.index.IndexManager.content_mark`: the change-log
position of the last change to the space's own tasks that its index reflects): every add, append or delete in
the space moves it — another space's changes do not — and the next route then re-fits: at once in a space of
fewer than ``max_tasks`` tasks, at most every ``refit_s`` seconds in a larger one (one change barely moves such
a fit, and a re-fit reads every task's stored data).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np

FitT = TypeVar("FitT")

TaskIds = Sequence[int] | np.ndarray
"""A space's task ids (a sequence or an int array)."""


class SpaceFitCache(Generic[FitT]):
    """One fitted model per space (``None`` is cached too: a space with nothing to fit on).

    Parameters
    ----------
    max_tasks : int
        Spaces of at least this many tasks are re-fitted at most every ``refit_s`` seconds.
    refit_s : float
    """

    def __init__(self, max_tasks: int, refit_s: float) -> None:
        self.max_tasks = max_tasks
        self.refit_s = refit_s
        self._fits: dict[int, tuple[int, float, int, FitT | None]] = {}
        self._lock = threading.Lock()

    def fitted(self, space_id: int, mark: int, task_ids: Callable[[], TaskIds],
               fit: Callable[[TaskIds], FitT | None]) -> FitT | None:
        """The space's model, fitted now when stale.

        Parameters
        ----------
        space_id, mark
            The space and its content mark (any value that moves when the space's tasks change).
        task_ids
            Lists the space's indexed task ids; called only for a re-fit, so a fresh fit costs the route path
            nothing.
        fit
            Fits the model on the task ids it is given (``None``: nothing to fit on).
        """
        with self._lock:
            cached = self._fits.get(space_id)
        now = time.monotonic()
        if cached is not None and (cached[0] == mark or (cached[2] >= self.max_tasks
                                                         and now - cached[1] < self.refit_s)):
            return cached[3]
        ids = task_ids()
        fitted = fit(ids) if len(ids) else None
        with self._lock:
            self._fits[space_id] = (mark, now, len(ids), fitted)
        return fitted

    def clear(self) -> None:
        """Forget every fit."""
        with self._lock:
            self._fits.clear()
