"""What the re-ranker reads for one task besides its state (:class:`TaskRoute`, :class:`Candidate`), and the route
threshold it holds a prompt to (:func:`prompt_threshold`: the calibrated one, matched to a short prompt's length).

Re-exported by :mod:`atlas.routing` (docs/SCORES.md, "Open set: thresholds").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from atlas.route_calibration import FALSE_REJECT_RATE, LengthViews


@dataclass(frozen=True)
class TaskRoute:
    """What routing reads for one task beside its state: prompt-side state and threshold."""

    threshold: float | None = None
    scale: float | None = None
    prompt_side: bool = False
    """Whether the task routes on a prompt-side state (a completion-mode task) rather than on its own."""
    prompt_digest: bytes | None = None
    """The last 32 bytes of the task's prompt-side state blob (its BLAKE2b digest: a state blob ends with it),
    as stored; ``None`` when not stored. The blob is read only where its view is not cached."""
    version: int = 0
    typical: float | None = None
    template_test: bool = True
    novelty_test: bool = True
    """Whether the task's novelty test is on (``task_routing.novelty_test``; off: routed as a task without one)."""
    false_reject_rate: float | None = None
    overridden: bool = False
    """Whether ``threshold`` is the task's override (set by a user or ``fit``), not its calibrated one."""
    split_threshold: float | None = None
    """The calibrated threshold at half the task's false-reject rate (a task with a novelty test is held to it)."""
    length_views: LengthViews | None = None
    """The task's held-out views by length (a prompt shorter than its samples is calibrated on them)."""
    calibrated: float | None = None
    """The task's calibrated threshold at its full rate (``threshold_auto``), whether or not an override is set (a
    short prompt is held to its length's threshold below it, moved by the override: :func:`prompt_threshold`)."""


def resolve(row: Any, typical: float | None, split: float | None = None,
            views: LengthViews | None = None) -> TaskRoute:
    """A :class:`TaskRoute` from a ``TaskRouting`` row read by :func:`atlas.routing_repo.get_task_routes` (its
    columns but the blob, the held-out scores and views, and ``prompt_side``), the :func:`typical_score` of its
    held-out scores (``None``: none), its threshold at half its rate and its held-out views by length; the override
    wins over the calibrated threshold."""
    thr = row.threshold_override if row.threshold_override is not None else row.threshold_auto
    return TaskRoute(threshold=None if thr is None else float(thr),
                     scale=None if row.score_scale is None else float(row.score_scale),
                     prompt_side=bool(row.prompt_side),
                     prompt_digest=None if row.prompt_digest is None else bytes(row.prompt_digest),
                     version=int(row.version or 0),
                     typical=typical,
                     template_test=row.template_test is not False,
                     novelty_test=row.novelty_test is not False,
                     false_reject_rate=None if row.false_reject_rate is None else float(row.false_reject_rate),
                     overridden=row.threshold_override is not None,
                     split_threshold=None if split is None else float(split), length_views=views,
                     calibrated=None if row.threshold_auto is None else float(row.threshold_auto))


@dataclass(frozen=True)
class Candidate:
    """A stored task offered to the re-ranker.

    Attributes
    ----------
    task_id, name
        Identity of the task.
    state : fishersketch.SketchState
        Its stored state.
    faiss_score : float
        Inner product of the prompt's and the task's unit signatures.
    view : tuple of ndarray, optional
        The state's :func:`state_view`, if the caller cached it (saves recomputing it per query).
    threshold : float, optional
        The task's own open-set threshold (override, else calibrated); ``None``: the global default.
    scale : float, optional
        Spread of the task's held-out scores (the confidence scale).
    typical : float, optional
        The task's :func:`typical_score`; ``None``: never calibrated (see :func:`rank_scores`).
    terms : atlas.lexical.TaskTerms, optional
        The task's lexical terms; ``None``: none stored (then the query is ranked without lexical evidence).
    template : atlas.template.TaskTemplate, optional
        The terms every sample of the task has (the open set's template test); ``None``: none stored.
    false_reject_rate : float, optional
        The task's false-reject rate (``None``: the default); the novelty test's threshold is taken at it.
    overridden : bool
        Whether ``threshold`` is an override (a user's or ``fit``'s) rather than the calibrated one.
    split_threshold : float, optional
        The calibrated threshold at half the task's false-reject rate (used with a novelty test).
    novelty_test : bool
        Whether the task's novelty test is on (false: routed as a task without one, at its full-rate threshold).
    length_views : atlas.route_calibration.LengthViews, optional
        The task's held-out views by length (``None``: none stored): a prompt shorter than the task's samples
        (:meth:`~atlas.route_calibration.LengthViews.short`) is held to the threshold of the views nearest its
        length, and to neither the template nor the novelty test.
    calibrated : float, optional
        The task's calibrated threshold at its full rate (``threshold_auto``; with an override too).
    """

    task_id: int
    name: str
    state: Any
    faiss_score: float = 0.0
    view: Any = None
    threshold: float | None = None
    scale: float | None = None
    typical: float | None = None
    terms: Any = None
    template: Any = None
    false_reject_rate: float | None = None
    overridden: bool = False
    split_threshold: float | None = None
    novelty_test: bool = True
    length_views: LengthViews | None = None
    calibrated: float | None = None


class PromptThreshold(NamedTuple):
    """The route threshold a task holds one prompt to (:func:`prompt_threshold`)."""

    threshold: float
    length_drop: float | None = None
    """For a prompt short for the task, how far below the threshold its prompts as long as its samples are held to
    without an override (negative: above) it is held — the same whatever override the task is given: any threshold
    ``x`` set for whole prompts (a user's, ``fit``'s) holds it to ``x − length_drop``. ``None`` for a prompt that is
    not short for the task. ``fit`` reads it (:attr:`atlas.route_fit.FitItem.length_drops`)."""

    @property
    def length_matched(self) -> bool:
        """Whether the prompt is short for the task and its threshold was matched to its length."""
        return self.length_drop is not None


def prompt_threshold(c: Candidate, n_tokens: int, default: float, per_task: bool, *, split: bool = False,
                     tested: bool | Callable[[], bool] = False) -> PromptThreshold:
    """The route threshold candidate ``c`` holds a prompt of ``n_tokens`` positions to.

    ``default`` without ``per_task`` or without a threshold of the task's own. Else, for a prompt as long as the
    task's samples, its override (a user's or ``fit``'s) as set, or its calibrated threshold at its full rate, or with
    ``split`` (the task's novelty test applies to this prompt) its ``split_threshold`` at the rate's route share.

    A prompt short for the task is held to ``min(calibrated, local)`` — ``local`` the threshold of the task's held-out
    views nearest the prompt's length at its full rate: that length's false-reject rate — moved by the override's
    distance from ``whole``, the threshold the task's whole prompts are held to without it (``split_threshold`` when
    ``tested``: the task's novelty test applies to its whole prompts — a callable is asked only for a short prompt;
    else the calibrated one). So a user's or ``fit``'s raise of a task's threshold raises its short prompts' by as
    much, and an override equal to the threshold ``GET …/routing`` shows leaves them as they were (until 2026-12-01 a
    short prompt was held to ``min(override, local)``: a raise stopped only prompts as long as the samples). A task
    overridden without a calibrated threshold (too few samples to calibrate) holds every prompt to its override.
    """
    if not per_task or c.threshold is None:
        return PromptThreshold(default)
    use_split = split and not c.overridden and c.split_threshold is not None
    base = c.split_threshold if use_split and c.split_threshold is not None else c.threshold
    calibrated = c.calibrated if c.overridden else c.threshold
    held = length_threshold(c.length_views, n_tokens, calibrated, c.false_reject_rate)
    if held is None or calibrated is None:
        return PromptThreshold(base)
    whole = whole_threshold(calibrated, c.split_threshold, tested() if callable(tested) else tested)
    drop = whole - held
    return PromptThreshold(c.threshold - drop if c.overridden else held, drop)  # fit computes x − drop alike


def whole_threshold(calibrated: float, split_threshold: float | None, tested: bool) -> float:
    """What a task holds prompts as long as its samples to without an override: its ``split_threshold`` (at the
    rate's route share) when ``tested`` — its novelty test applies to them — else its full-rate ``calibrated`` one.
    An override, and ``fit``, measure a short prompt's threshold from it (:func:`prompt_threshold`)."""
    return split_threshold if tested and split_threshold is not None else calibrated


def length_threshold(views: LengthViews | None, n_tokens: int, calibrated: float | None,
                     false_reject_rate: float | None) -> float | None:
    """What a task calibrated at ``calibrated`` (its full-rate threshold) holds a prompt of ``n_tokens`` positions to
    without an override when the prompt is short for it: ``min(calibrated, local)``, ``local`` the threshold of its
    held-out ``views`` nearest that length at its full rate; ``None`` when the prompt is not short for the task (or
    it has no views, no calibrated threshold, too few views near that length)."""
    if views is None or calibrated is None or not views.short(n_tokens):
        return None
    local = views.threshold(n_tokens, false_reject_rate if false_reject_rate is not None else FALSE_REJECT_RATE)
    return None if local is None else min(calibrated, local)


def short_view_scores(views: LengthViews | None, calibrated: float | None, whole: float | None,
                      false_reject_rate: float | None) -> list[float]:
    """The task's held-out views short for it, each on the scale of prompts as long as its samples: its score plus
    its length's drop, ``whole − length_threshold`` (``whole``: what whole prompts are held to without an override).
    A short prompt is held to a threshold ``x`` set for whole prompts less its drop, so these are what ``fit``'s cap
    keeps within the rate for short prompts (:func:`atlas.route_fit.fit_thresholds`)."""
    if views is None or calibrated is None or whole is None:
        return []
    out = []
    for tokens, score in zip(views.tokens.tolist(), views.scores.tolist(), strict=True):
        held = length_threshold(views, int(tokens), calibrated, false_reject_rate)
        if held is not None:
            out.append(float(score) + (whole - held))
    return out
