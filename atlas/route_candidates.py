"""What the re-ranker reads for one task besides its state (:class:`TaskRoute`, :class:`Candidate`), and the route
threshold it holds a prompt to (:func:`prompt_threshold`: the calibrated one, matched to a short prompt's length).

Re-exported by :mod:`atlas.routing` (docs/SCORES.md, "Open set: thresholds").
"""

from __future__ import annotations

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
                     split_threshold=None if split is None else float(split), length_views=views)


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


class PromptThreshold(NamedTuple):
    """The route threshold a task holds one prompt to (:func:`prompt_threshold`)."""

    threshold: float
    length_bound: float | None = None
    """For a prompt short for the task, the bound of its held-out views of about the prompt's length (``threshold``
    is then the lower of it and the task's own); ``None`` otherwise. ``fit`` reads it: raising the task's threshold
    never moves a short prompt's past it."""

    @property
    def length_matched(self) -> bool:
        """Whether the prompt is short for the task and its threshold was matched to its length."""
        return self.length_bound is not None


def prompt_threshold(c: Candidate, n_tokens: int, default: float, per_task: bool, *, split: bool = False
                     ) -> PromptThreshold:
    """The route threshold candidate ``c`` holds a prompt of ``n_tokens`` positions to.

    ``default`` without ``per_task`` or without a threshold of the task's own. Else the task's threshold for prompts
    as long as its samples — its override (a user's or ``fit``'s) as set, or its calibrated threshold at its full
    rate, or with ``split`` (a task whose novelty test applies) its ``split_threshold`` at the rate's route share —
    lowered, for a prompt short for the task, to the threshold of its held-out views nearest the prompt's length at
    the task's full rate. Never raised: a prompt as long as the samples is judged on whole samples, and an override
    that raises a task's threshold (``fit`` rejecting foreign prompts of the samples' length) leaves its short
    prompts the false-reject rate of their length.
    """
    if not per_task or c.threshold is None:
        return PromptThreshold(default)
    use_split = split and not c.overridden and c.split_threshold is not None
    base = c.split_threshold if use_split and c.split_threshold is not None else c.threshold
    lv = c.length_views
    if lv is None or not lv.short(n_tokens):
        return PromptThreshold(base)
    local = lv.threshold(n_tokens, c.false_reject_rate if c.false_reject_rate is not None else FALSE_REJECT_RATE)
    if local is None:
        return PromptThreshold(base)
    return PromptThreshold(min(base, local), local)
