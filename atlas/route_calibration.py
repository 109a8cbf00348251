"""Per-task open-set calibration: held-out in-task route scores → threshold and spread (docs/SCORES.md).

The route score and the ranking live in :mod:`atlas.routing` (which re-exports these names); this
module is the statistics of the threshold: which samples a job holds out, and the lower tolerance
bound read from their leave-one-out scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

FALSE_REJECT_RATE = 0.05
"""Target false-reject rate of the calibrated per-task thresholds (the quantile of held-out scores)."""
MAX_FALSE_REJECT_RATE = 0.5
"""Largest false-reject rate a task may be calibrated at (``PATCH /v1/tasks/{id}/routing``); rates lie in
``(0, MAX_FALSE_REJECT_RATE]``."""
MIN_CALIBRATION = 5
"""Fewest held-out scores from which a task's threshold is estimated; fewer: the global default."""
CALIBRATION_SAMPLES = 64
"""Samples of one job scored leave-one-out (evenly spaced over the job's samples). Until 2026-12-07 32: a 50-sample
task's two lowest-scoring samples were among the 18 left out, and it refused 10 % of its own prompts at a 2.5 % route
share (2 of 250 with 64). The product's benches with 64: 4b 0.438 "none" on unseen at 0.031 on indexed (0.038 with
32), 4d's means 0.312 at 0.022 (0.257 / 0.021), 4e unchanged (bench/results/quality.md, 4b, 4d, "More held-out samples
a job")."""
VIEW_SAMPLES = 32
"""Of a job's calibration samples, those whose prefix views are scored too (:data:`PREFIX_FRACTIONS`; evenly spaced
among them, :func:`view_pick`): what a short prompt is calibrated on, at the cost it had before the whole samples
doubled."""
MAX_CAL_SCORES = 256
"""Held-out scores kept per task (appends add theirs; the oldest are dropped beyond this)."""
NOVELTY_SHARE = 0.5
"""Share of a task's false-reject rate spent on its novelty test (:mod:`atlas.novelty`) when it has one; its route
threshold is calibrated at the rest, so the two tests together stay within the rate (docs/SCORES.md, "One budget,
two tests")."""


def split_rates(rate: float) -> tuple[float, float]:
    """The false-reject rates of a novelty-tested task's route threshold and of its novelty test, at the task's
    rate ``rate``: ``rate · (1 − NOVELTY_SHARE)`` and ``rate · NOVELTY_SHARE`` (they add up to ``rate``), each at least
    the smallest positive double (then their sum is a little more)."""
    smallest = math.ulp(0.0)  # neither underflows to 0 (a rate of 5e-324 gave 0.0 and a 500 on every route)
    return max(rate * (1.0 - NOVELTY_SHARE), smallest), max(rate * NOVELTY_SHARE, smallest)


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


def view_pick(pick: list[int], cap: int = VIEW_SAMPLES) -> list[int]:
    """Those of the calibration ``pick`` (ascending) whose prefix views are scored: at most ``cap``, evenly spaced
    through it (all of a pick of ``cap`` or fewer)."""
    if len(pick) <= cap:
        return list(pick)
    return [pick[i] for i in calibration_pick(len(pick), cap)]


PREFIX_FRACTIONS = (0.5, 0.25, 0.125)
"""Besides each calibration sample whole, its first half, quarter and eighth of tokens are scored held out (a
*view* of the sample): what a prompt shorter than the samples is calibrated on (:class:`LengthViews`)."""
MIN_VIEW_TOKENS = 2
"""Fewest counted token positions of a prefix view (shorter prefixes are not scored)."""
MAX_CAL_VIEWS = MAX_CAL_SCORES * (1 + len(PREFIX_FRACTIONS))
"""Held-out views kept per task (appends add theirs; the oldest are dropped beyond this)."""
SHORT_PROMPT_QUANTILE = 0.25
SHORT_PROMPT_SHARE = 0.75
"""A prompt is *short* for a task when it has fewer token positions than ``SHORT_PROMPT_SHARE`` times the
``SHORT_PROMPT_QUANTILE`` quantile of the task's whole held-out samples' (under three quarters of the length of three
in four of them): its route threshold is then taken from the held-out views nearest its length, at the task's full
rate, and neither its template nor its novelty test applies (docs/SCORES.md, "Prompts shorter than the samples").
The share keeps a prompt a few tokens shorter than a fixed-length template's samples ("native tongue" for "native
language") a whole one, held to both tests. Until 2026-12-02 the quantile was the 10 % one (nine in ten): a prompt
cut to half a long sample's words stayed "whole" for a task of samples of many lengths and met tests calibrated on
whole samples — 11.7 % of half-length prompts whose top match was their own task were refused (bench 4f)."""
LENGTH_NEIGHBOURS = 32
"""Held-out views, nearest a short prompt's length (in log tokens), that its threshold is calibrated on."""


@dataclass(frozen=True, eq=False)
class LengthViews:
    """A task's held-out views — whole calibration samples and their prefixes — by token count: the route threshold
    of a prompt shorter than the samples (the threshold calibrated on whole samples sits above most short prompts'
    scores: bench 4f).

    Attributes
    ----------
    tokens : ndarray of shape (v,), int64
        Counted token positions of each view.
    scores : ndarray of shape (v,), float64
        Each view's leave-one-out route score (the whole sample removed from the task's routing state).
    short_below : float
        :data:`SHORT_PROMPT_SHARE` times the :data:`SHORT_PROMPT_QUANTILE` quantile of the whole views' token counts:
        a prompt with fewer positions is short.
    """

    tokens: np.ndarray
    scores: np.ndarray
    short_below: float
    _memo: dict[tuple[int, float], float | None] = field(default_factory=dict, repr=False)

    @classmethod
    def from_records(cls, records: Iterable[object] | None) -> LengthViews | None:
        """From stored ``[tokens, score, whole]`` records (``task_routing.cal_views``); ``None`` when there is no
        whole view or fewer than ``MIN_CALIBRATION`` valid views (then every prompt is judged as a whole one)."""
        rows = [r for r in (records or []) if _valid_view(r)][-MAX_CAL_VIEWS:]
        whole = [int(r[0]) for r in rows if r[2]]  # type: ignore[index]
        if not whole or len(rows) < MIN_CALIBRATION:
            return None
        tokens = np.array([int(r[0]) for r in rows], dtype=np.int64)  # type: ignore[index]
        scores = np.array([float(r[1]) for r in rows], dtype=np.float64)  # type: ignore[index]
        return cls(tokens, scores, SHORT_PROMPT_SHARE * float(np.quantile(whole, SHORT_PROMPT_QUANTILE)))

    def short(self, n_tokens: int) -> bool:
        """Whether a prompt of ``n_tokens`` counted positions is short for the task."""
        return 0 < n_tokens < self.short_below

    def threshold(self, n_tokens: int, false_reject_rate: float) -> float | None:
        """The route threshold at ``false_reject_rate`` calibrated on the :data:`LENGTH_NEIGHBOURS` views nearest
        ``n_tokens`` in log length (:func:`calibrate`'s tolerance bound; ``None``: too few views). Memoised."""
        key = (int(n_tokens), float(false_reject_rate))
        if key not in self._memo:
            gap = np.abs(np.log(self.tokens) - math.log(max(n_tokens, 1)))
            near = np.argsort(gap, kind="stable")[:LENGTH_NEIGHBOURS]
            self._memo[key] = calibrate(self.scores[near].tolist(), false_reject_rate).threshold
        return self._memo[key]


MAX_VIEW_TOKENS = 2**31
"""Most token positions a held-out view may count (an imported ``10**30`` overflowed NumPy's int64: every route of
its space answered 500)."""


def _valid_view(record: object) -> bool:
    """Whether ``record`` is a ``[1 ≤ tokens ≤ MAX_VIEW_TOKENS, score in [−1, 1], whole]`` view."""
    if not isinstance(record, list | tuple) or len(record) != 3:
        return False
    tokens, score, whole = record
    return (isinstance(tokens, int) and not isinstance(tokens, bool) and 1 <= tokens <= MAX_VIEW_TOKENS
            and isinstance(score, int | float) and not isinstance(score, bool) and -1.0 <= float(score) <= 1.0
            and isinstance(whole, bool | int))


def validate_views(records: object) -> list[list[object]]:
    """Exported ``cal_views`` checked (a list of ``[tokens, score, whole]``), as stored; raises ``ValueError``."""
    if records is None:
        return []
    if not isinstance(records, list) or not all(_valid_view(r) for r in records):
        raise ValueError("cal_views must be [tokens >= 1, route score in [-1, 1], whole] records")
    views: list[list[object]] = [[int(t), float(s), bool(w)] for t, s, w in records]
    return views[-MAX_CAL_VIEWS:]
