"""Per-task open-set calibration: held-out in-task route scores → threshold and spread (docs/SCORES.md).

The route score and the ranking live in :mod:`atlas.routing` (which re-exports these names); this
module is the statistics of the threshold: which samples a job holds out, and the lower tolerance
bound read from their leave-one-out scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

FALSE_REJECT_RATE = 0.05
"""Target false-reject rate of the calibrated per-task thresholds (the quantile of held-out scores)."""
MAX_FALSE_REJECT_RATE = 0.5
"""Largest false-reject rate a task may be calibrated at (``PATCH /v1/tasks/{id}/routing``); rates lie in
``(0, MAX_FALSE_REJECT_RATE]``."""
MIN_CALIBRATION = 5
"""Fewest held-out scores from which a task's threshold is estimated; fewer: the global default."""
CALIBRATION_SAMPLES = 32
"""Samples of one job scored leave-one-out (evenly spaced over the job's samples)."""
MAX_CAL_SCORES = 256
"""Held-out scores kept per task (appends add theirs; the oldest are dropped beyond this)."""
NOVELTY_SHARE = 0.5
"""Share of a task's false-reject rate spent on its novelty test (:mod:`atlas.novelty`) when it has one; its route
threshold is calibrated at the rest, so the two tests together stay within the rate (docs/SCORES.md, "One budget,
two tests")."""


def split_rates(rate: float) -> tuple[float, float]:
    """The false-reject rates of a novelty-tested task's route threshold and of its novelty test, at the task's
    rate ``rate``: ``rate · (1 − NOVELTY_SHARE)`` and ``rate · NOVELTY_SHARE`` (they add up to ``rate``)."""
    return rate * (1.0 - NOVELTY_SHARE), rate * NOVELTY_SHARE


def is_false_reject_rate(rate: object) -> bool:
    """Whether ``rate`` is a number in ``(0, MAX_FALSE_REJECT_RATE]`` (a rate a task may be calibrated at)."""
    return (isinstance(rate, int | float) and not isinstance(rate, bool)
            and 0.0 < float(rate) <= MAX_FALSE_REJECT_RATE)


@dataclass(frozen=True)
class Calibration:
    """A task's calibration: held-out scores, the threshold at ``false_reject_rate`` and their spread."""

    scores: list[float]
    threshold: float | None
    scale: float | None
    false_reject_rate: float


CALIBRATION_CONFIDENCE = 0.9
"""Confidence that the calibrated threshold rejects at most ``FALSE_REJECT_RATE`` of the task's prompts."""


def calibrate(scores: Iterable[float], false_reject_rate: float = FALSE_REJECT_RATE) -> Calibration:
    """Threshold from held-out in-task scores (``None`` if fewer than ``MIN_CALIBRATION``).

    A lower tolerance bound: with confidence ``CALIBRATION_CONFIDENCE`` at most ``false_reject_rate``
    of the task's prompts score below it. The lower of the normal one-sided tolerance bound
    ``mean − k σ``, the empirical ``false_reject_rate`` quantile and, when one exists (n ≳ 45 at 5 %), the
    distribution-free order statistic ``x₍ᵣ₎`` with ``P(Binomial(n, rate) ≥ r) ≥ confidence``.

    Monotone in the rate: the order statistic first exists at the rate ``b* = 1 − (1 − confidence)^(1/n)``,
    where the lower of the three can drop. So a rate above the default takes the highest bound of the rates
    between the default and it, and a rate below the default the lowest — each is a valid bound at the
    requested rate (a bound at a lower rate is one at a higher), and the default's threshold is unchanged.
    """
    xs = [float(x) for x in scores if -1.0 <= float(x) <= 1.0][-MAX_CAL_SCORES:]  # route scores: cosines
    if len(xs) < MIN_CALIBRATION:
        return Calibration(xs, None, None, false_reject_rate)
    arr = np.sort(np.asarray(xs))
    n = arr.size
    sd = float(np.std(arr, ddof=1))
    thr = _lower_bound(arr, false_reject_rate)
    first = 1.0 - (1.0 - CALIBRATION_CONFIDENCE) ** (1.0 / n)  # b*: the order statistic's first rate
    if FALSE_REJECT_RATE < first <= false_reject_rate:
        thr = max(thr, _lower_bound(arr, first * (1.0 - 1e-9)))
    elif false_reject_rate <= first * (1.0 + 1e-9) and first <= FALSE_REJECT_RATE:  # rate = b*: its order
        thr = min(thr, _lower_bound(arr, first * (1.0 + 1e-9)))  # statistic exists only a few ulps above
    return Calibration(xs, float(np.clip(thr, -1.0, 1.0)), max(sd, 1e-3), false_reject_rate)


def _lower_bound(arr: np.ndarray, rate: float) -> float:
    """:func:`calibrate`'s bound at one rate, from sorted scores ``arr`` (n ≥ 2)."""
    from statistics import NormalDist

    from scipy.stats import binom

    n = arr.size
    sd = float(np.std(arr, ddof=1))
    zp = -NormalDist().inv_cdf(rate)  # the upper rate-quantile, exact for rates below 1e-16 (1 − rate rounds to 1)
    zg = NormalDist().inv_cdf(CALIBRATION_CONFIDENCE)
    a = 1.0 - zg**2 / (2.0 * (n - 1))
    b = zp**2 - zg**2 / n
    k = (zp + math.sqrt(max(zp**2 - a * b, 0.0))) / a if a > 0 else zp * 3.0
    thr = float(np.mean(arr)) - k * sd
    r = int(binom.isf(CALIBRATION_CONFIDENCE, n, rate))  # largest r with P(B >= r) >= confidence
    if r >= 1:
        thr = min(thr, float(arr[r - 1]))
    return min(thr, float(np.quantile(arr, rate, method="lower")))


def calibration_pick(n: int, cap: int = CALIBRATION_SAMPLES) -> list[int]:
    """Indices of the samples scored leave-one-out: at most ``cap``, evenly spaced over ``range(n)``."""
    if n <= cap:
        return list(range(n))
    return sorted(set(np.linspace(0, n - 1, cap).round().astype(int).tolist()))
