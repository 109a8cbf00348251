"""The route path's per-space fit cache (atlas.space_fit_cache): when a space's model is re-fitted."""

from __future__ import annotations

import numpy as np

from atlas.novelty import MIN_NOVELTY_SAMPLES, NoveltyCache
from atlas.space_fit_cache import SpaceFitCache


class Counting:
    """A fit that records the ids it was given and returns their sum (``None`` for an odd sum)."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, ids: object) -> int | None:
        got = [int(i) for i in ids]  # type: ignore[attr-defined]
        self.calls.append(got)
        return None if sum(got) % 2 else sum(got)


def test_refits_when_the_mark_moves_and_only_then() -> None:
    cache: SpaceFitCache[int] = SpaceFitCache(max_tasks=100, refit_s=3600.0)
    fit, listed = Counting(), []

    def ids() -> list[int]:
        listed.append(1)
        return [1, 3]

    assert cache.fitted(7, mark=1, task_ids=ids, fit=fit) == 4
    assert cache.fitted(7, mark=1, task_ids=ids, fit=fit) == 4
    assert len(fit.calls) == 1 and len(listed) == 1  # a fresh fit lists nothing
    assert cache.fitted(7, mark=2, task_ids=lambda: [1, 2], fit=fit) is None  # None is a fit too ...
    assert cache.fitted(7, mark=2, task_ids=lambda: [1, 2], fit=fit) is None
    assert len(fit.calls) == 2  # ... and cached
    assert cache.fitted(8, mark=2, task_ids=lambda: [2, 2], fit=fit) == 4  # another space: its own fit
    assert len(fit.calls) == 3


def test_a_large_space_refits_at_most_every_refit_s() -> None:
    fit = Counting()
    slow: SpaceFitCache[int] = SpaceFitCache(max_tasks=2, refit_s=3600.0)
    for mark in range(5):
        assert slow.fitted(1, mark=mark, task_ids=lambda: [1, 1, 2], fit=fit) == 4
    assert len(fit.calls) == 1  # the mark moved four times, within the hour
    eager: SpaceFitCache[int] = SpaceFitCache(max_tasks=2, refit_s=0.0)
    for mark in range(3):
        eager.fitted(1, mark=mark, task_ids=lambda: [1, 1, 2], fit=fit)
    assert len(fit.calls) == 4
    small: SpaceFitCache[int] = SpaceFitCache(max_tasks=4, refit_s=3600.0)  # below max_tasks: every change
    for mark in range(3):
        small.fitted(1, mark=mark, task_ids=lambda: [1, 1, 2], fit=fit)
    assert len(fit.calls) == 7


def test_an_empty_space_is_not_fitted_and_clear_forgets() -> None:
    cache: SpaceFitCache[int] = SpaceFitCache(max_tasks=10, refit_s=1.0)
    fit = Counting()
    assert cache.fitted(1, mark=0, task_ids=lambda: np.array([], dtype=int), fit=fit) is None
    assert fit.calls == []
    cache.fitted(1, mark=1, task_ids=lambda: np.array([2, 4]), fit=fit)
    cache.clear()
    cache.fitted(1, mark=1, task_ids=lambda: np.array([2, 4]), fit=fit)
    assert fit.calls == [[2, 4], [2, 4]]


def test_novelty_cache_fits_the_loaded_vectors() -> None:
    rng = np.random.default_rng(0)
    vectors = {t: rng.standard_normal((MIN_NOVELTY_SAMPLES + 5, 6)) + 3 * t for t in (1, 2)}
    loads: list[list[int]] = []

    def load(ids: list[int]) -> dict[int, np.ndarray]:
        loads.append(ids)
        return {t: vectors[t] for t in ids}

    cache = NoveltyCache()
    model = cache.get(3, mark=5, task_ids=lambda: [1, 2], load=load)
    assert model is not None and model.tested(1) and model.tested(2)
    assert cache.get(3, mark=5, task_ids=lambda: [1, 2], load=load) is model
    assert loads == [[1, 2]]


def test_a_large_space_refits_in_the_background_when_detached() -> None:
    """A stale fit of a large space is served at once and re-fitted on a thread of its own, one re-fit at a time;
    a small space still re-fits on the caller's thread."""
    import threading

    release, entered = threading.Event(), threading.Event()
    calls: list[list[int]] = []

    def slow_fit(ids: object) -> int:
        got = [int(i) for i in ids]  # type: ignore[attr-defined]
        calls.append(got)
        if len(calls) > 1:  # the first fit (no fit of before) runs on the caller's thread
            entered.set()
            assert release.wait(10)
        return sum(got)

    cache: SpaceFitCache[int] = SpaceFitCache(max_tasks=2, refit_s=0.0)
    assert cache.fitted(1, mark=0, task_ids=lambda: [1, 2, 3], fit=slow_fit, detached=True) == 6
    # The mark moves: the route is answered with the fit of before while the re-fit waits on `release`.
    assert cache.fitted(1, mark=1, task_ids=lambda: [1, 2, 3, 4], fit=slow_fit, detached=True) == 6
    assert entered.wait(10)
    assert cache.fitted(1, mark=2, task_ids=lambda: [1, 2, 3, 4, 5], fit=slow_fit, detached=True) == 6
    assert len(calls) == 2  # one re-fit of a space at a time
    release.set()
    cache.wait_refits(10)
    assert cache.fitted(1, mark=1, task_ids=lambda: [9], fit=slow_fit, detached=True) == 10  # the re-fit's, at mark 1
    small: SpaceFitCache[int] = SpaceFitCache(max_tasks=10, refit_s=0.0)
    fit = Counting()
    small.fitted(1, mark=0, task_ids=lambda: [2, 2], fit=fit, detached=True)
    assert small.fitted(1, mark=1, task_ids=lambda: [2, 4], fit=fit, detached=True) == 6  # below max_tasks: now


def test_a_failed_background_refit_keeps_the_fit_of_before_and_clear_drops_a_late_one() -> None:
    import threading

    cache: SpaceFitCache[int] = SpaceFitCache(max_tasks=1, refit_s=0.0)
    assert cache.fitted(1, mark=0, task_ids=lambda: [4], fit=lambda ids: 4, detached=True) == 4

    def broken(ids: object) -> int:
        raise RuntimeError("store down")

    assert cache.fitted(1, mark=1, task_ids=lambda: [5], fit=broken, detached=True) == 4
    cache.wait_refits(10)
    assert cache.fitted(1, mark=1, task_ids=lambda: [5], fit=broken, detached=True) == 4  # still served
    cache.wait_refits(10)
    gate = threading.Event()

    def late(ids: object) -> int:
        assert gate.wait(10)
        return 8

    assert cache.fitted(1, mark=2, task_ids=lambda: [8], fit=late, detached=True) == 4
    cache.clear()
    gate.set()
    cache.wait_refits(10)
    assert cache.fitted(1, mark=2, task_ids=lambda: [7], fit=lambda ids: 7, detached=True) == 7  # fitted anew
