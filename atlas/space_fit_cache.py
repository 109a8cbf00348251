"""One fitted model per space, re-fitted when the space's tasks change: the staleness rule of the route path's
space-level fits (the ranking's whitening, :mod:`atlas.whitening`; the open set's novelty model,
:mod:`atlas.novelty`).

A fit is keyed by the space's content mark (:meth:`atlas.index.IndexManager.content_mark`: the change-log
position of the last change to the space's own tasks that its index reflects): every add, append or delete in
the space moves it — another space's changes do not — and the next route then re-fits: at once in a space of
fewer than ``max_tasks`` tasks (milliseconds), at most every ``refit_s`` seconds in a larger one (one change barely
moves such a fit, and a re-fit reads every task's stored data). A larger space is re-fitted **in the background**
when its caller can fit detached from its own request: the route that finds the fit stale is answered with the fit
of before, as every route within ``refit_s`` of a change is, instead of waiting for the re-fit (0.4–1.2 s with
2,000 tasks: a scale review, 2026-12-08), and one re-fit of a space runs at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np

FitT = TypeVar("FitT")

log = logging.getLogger(__name__)

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
        self._refitting: dict[int, threading.Thread] = {}
        self._generation = 0

    def fitted(self, space_id: int, mark: int, task_ids: Callable[[], TaskIds],
               fit: Callable[[TaskIds], FitT | None], *, detached: bool = False) -> FitT | None:
        """The space's model, fitted now when stale (in the background for a large space, when ``detached``).

        Parameters
        ----------
        space_id, mark
            The space and its content mark (any value that moves when the space's tasks change).
        task_ids
            Lists the space's indexed task ids; called only for a re-fit, so a fresh fit costs the route path
            nothing.
        fit
            Fits the model on the task ids it is given (``None``: nothing to fit on).
        detached
            ``task_ids`` and ``fit`` read nothing of the caller's (its database session): a stale fit of a space
            of at least ``max_tasks`` tasks is then returned as it is and re-fitted on a thread of its own.
        """
        with self._lock:
            cached = self._fits.get(space_id)
            generation = self._generation
        now = time.monotonic()
        large = cached is not None and cached[2] >= self.max_tasks
        if cached is not None and (cached[0] == mark or (large and now - cached[1] < self.refit_s)):
            return cached[3]
        if cached is not None and large and detached:
            self._refit_in_background(space_id, mark, task_ids, fit, now, generation)
            return cached[3]
        ids = task_ids()
        fitted = fit(ids) if len(ids) else None
        with self._lock:
            if self._generation == generation:
                self._fits[space_id] = (mark, now, len(ids), fitted)
        return fitted

    def _refit_in_background(self, space_id: int, mark: int, task_ids: Callable[[], TaskIds],
                             fit: Callable[[TaskIds], FitT | None], started: float, generation: int) -> None:
        """Re-fit ``space_id`` at ``mark`` on a daemon thread unless one is re-fitting it already. A failed re-fit is
        logged and keeps the fit of before for another ``refit_s`` seconds; a fit finished after :meth:`clear` is
        dropped."""

        def refit() -> None:
            try:
                ids = task_ids()
                fitted = fit(ids) if len(ids) else None
                entry = (mark, started, len(ids), fitted)
            except Exception:  # the route path must not die with it: the fit of before stays in use
                log.exception("re-fitting space %d in the background failed; its fit of before stays in use",
                              space_id)
                entry = None
            with self._lock:
                self._refitting.pop(space_id, None)
                if self._generation != generation:
                    return
                if entry is None:
                    old = self._fits.get(space_id)
                    if old is None:
                        return
                    entry = (old[0], started, old[2], old[3])
                self._fits[space_id] = entry

        with self._lock:
            if space_id in self._refitting:
                return
            thread = threading.Thread(target=refit, name=f"atlas-space-refit-{space_id}", daemon=True)
            self._refitting[space_id] = thread
        thread.start()

    def wait_refits(self, timeout_s: float | None = None) -> None:
        """Wait for the background re-fits running now (tests, and a clean shutdown)."""
        with self._lock:
            running = list(self._refitting.values())
        for thread in running:
            thread.join(timeout_s)

    def clear(self) -> None:
        """Forget every fit (a re-fit running now is dropped when it ends)."""
        with self._lock:
            self._fits.clear()
            self._generation += 1
