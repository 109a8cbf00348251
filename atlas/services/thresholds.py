"""Route thresholds: each task's effective threshold, overrides, and ``fit`` from labelled prompts
(semantic-router's ``fit``; ``docs/SCORES.md``)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

from atlas import lexicon_repo, repository, routing, routing_repo
from atlas.analysis import ROUTE_POOL
from atlas.errors import IncompatibleSpace, InvalidInput, NotFound, NotReady, PayloadTooLarge
from atlas.models import TASK_READY
from atlas.novelty import vectors_needed
from atlas.route_calibration import FALSE_REJECT_RATE, LengthViews, split_rates
from atlas.route_candidates import short_view_scores, whole_threshold
from atlas.route_fit import FitItem, accuracy_of, fit_thresholds, novelty_to_turn_off, templates_to_turn_off
from atlas.services.queries import QueryService
from atlas.signature_repository import novelty_vectors
from atlas.store import Store


@dataclass(frozen=True)
class FitResult:
    """Thresholds by task name, accuracy on the labelled prompts before and after, whether stored, and the tasks
    whose template or novelty test was turned off."""

    thresholds: dict[str, float]
    accuracy_before: float
    accuracy_after: float
    stored: bool
    template_off: list[str] = field(default_factory=list)
    """Tasks whose template test ``fit`` turned off (their labelled prompts lack their template)."""
    novelty_off: list[str] = field(default_factory=list)
    """Tasks whose novelty test ``fit`` turned off (it rejected too many of their labelled prompts,
    :func:`atlas.route_fit.novelty_to_turn_off`)."""
    previous: dict[str, float] = field(default_factory=dict)
    """For each task in ``thresholds`` or ``unsplit``: the threshold its labelled prompts were held to before (its
    override, its calibrated threshold — at its route share of the rate while its novelty test is on — or the
    default)."""
    unsplit: dict[str, float] = field(default_factory=dict)
    """For each task in ``novelty_off`` that ``fit`` set no threshold for and that had no override: the threshold its
    prompts are held to once the test is off — its calibrated one at its whole rate (the test's share is no longer
    spent; an override holds whatever the test)."""
    held_by_cap: dict[str, int] = field(default_factory=dict)
    """For each task that still answers prompts labelled otherwise because refusing them would take its threshold past
    its false-reject rate on its own positives (``fit``'s cap): how many of the labelled prompts."""


MAX_TASK_ID = 2**62
"""Largest task id a label may name (ids are 64-bit)."""


class ThresholdService:
    """Per-task route thresholds (see the module docstring)."""

    def __init__(self, store: Store, queries: QueryService) -> None:
        self.store = store
        self.queries = queries

    @property
    def default(self) -> float:
        """The global default threshold (tasks too small to calibrate)."""
        return float(self.store.settings.route_threshold)

    def info(self, task_id: int) -> dict[str, Any]:
        """The task's effective threshold for prompts as long as its samples (override, else calibrated — at the
        route threshold's share of the rate while its novelty test applies, ``novelty_active`` — else default) and
        its calibration."""
        with self.store.read() as session:
            space_id = int(repository.get_task(session, task_id).space_id)
            row = routing_repo.get_routing(session, task_id)
            lexical = lexicon_repo.get_task_lexicon(session, [task_id]).get(task_id)
            vectors = novelty_vectors(session, [task_id]).get(task_id)
            if row is not None:
                session.expunge(row)  # read whole; the novelty model below opens its own read session
        tpl = None if lexical is None else lexical.template
        template = {} if tpl is None else {
            "template_terms": int(tpl.keys.size), "template_active": tpl.active,
            "template_false_reject": tpl.false_reject}
        template["novelty_samples"] = 0 if vectors is None else len(vectors)
        rate = routing_repo.calibration_rate(None if row is None else row.false_reject_rate)
        template["novelty_samples_needed"] = vectors_needed(split_rates(rate)[1])  # (a task without a row: the default)
        if row is None:
            return {"task_id": task_id, "threshold": self.default, "source": "default"} | template
        template["template_test"] = row.template_test is not False
        template["novelty_test"] = row.novelty_test is not False
        # the test applies to whole prompts: switched on, on for the service, and enough vectors for its rate
        active = row.novelty_test is not False and task_id in self.queries.novelty_tested(space_id, {task_id: rate})
        template["novelty_active"] = active
        thr, src = self.default, "default"
        views = LengthViews.from_records(row.cal_views)
        split = routing_repo.split_threshold(row.cal_scores, row.false_reject_rate) if active else None
        if row.threshold_override is not None:
            thr, src = float(row.threshold_override), "override"
        elif split is not None:  # the route threshold whole prompts are held to: the rest of the rate
            thr, src = float(split), "calibrated"
        elif row.threshold_auto is not None:
            thr, src = float(row.threshold_auto), "calibrated"
        return {"task_id": task_id, "threshold": thr, "source": src,
                "threshold_override": row.threshold_override, "threshold_auto": row.threshold_auto,
                "calibration_scores": len(row.cal_scores or []), "false_reject_rate": row.false_reject_rate,
                "length_views": 0 if views is None else len(views.tokens),
                "short_prompt_tokens": None if views is None else views.short_below,
                "prompt_side": row.prompt_state is not None,
                "typical_score": routing.typical_score(row.cal_scores) if row.cal_scores else None} | template

    def _labels(self, space_ref: str | None, labels: Sequence[str | int]) -> tuple[int, list[int | None]]:
        """The space's id, and the task ids of ``fit`` labels (``None`` for ``"none"``): each names a ready task
        of the space (an error names the first bad label's example: ``detail["example"]``).

        Raises
        ------
        NotFound
            No task of that name in the space, or of that id.
        IncompatibleSpace
            A task id of another space.
        NotReady
            A task that is not ready (pending or failed): its prompts cannot be answered by it.
        """
        with self.store.read() as session:
            space_id = int(self.store.resolve_space(session, space_ref).id)
            ids: dict[str | int, int | None] = {}
            for i, lb in enumerate(labels):
                if lb in ids:
                    continue
                try:
                    ids[lb] = _label(session, space_id, lb)
                except (NotFound, IncompatibleSpace, NotReady) as e:  # named by its example, as a bad prompt is
                    detail = e.detail if isinstance(e.detail, dict) else {}
                    raise type(e)(f"example {i}: {e.message}", {**detail, "example": i}) from None
            return space_id, [ids[lb] for lb in labels]

    def patch(self, task_id: int, threshold: float | EllipsisType | None = ..., template: bool | None = None,
              false_reject_rate: float | None = None, novelty: bool | None = None) -> dict[str, Any]:
        """Set (or clear with ``None``) the threshold override unless ``threshold`` is ``...``; turn the template
        test on or off unless ``template`` is ``None``, the novelty test unless ``novelty`` is ``None``;
        re-calibrate the task's threshold at ``false_reject_rate`` unless it is ``None``; one transaction.

        Raises
        ------
        InvalidInput
            A threshold outside [−1, 1] (``routing_repo.route_threshold``); a false-reject rate outside
            ``(0, MAX_FALSE_REJECT_RATE]``.
        """
        with self.store.session() as session:
            # the task's row lock, as a job's final transaction takes it: a job ending meanwhile neither overwrites
            # this change with a calibration read before it, nor is it re-calibrated without the job's scores
            repository.lock_task(session, task_id)
            if not isinstance(threshold, EllipsisType):
                routing_repo.set_threshold_override(session, task_id, threshold)
            if template is not None:
                routing_repo.set_template_test(session, task_id, template)
            if novelty is not None:
                routing_repo.set_novelty_test(session, task_id, novelty)
            if false_reject_rate is not None:
                routing_repo.set_false_reject_rate(session, task_id, false_reject_rate)
        return self.info(task_id)

    async def fit(self, examples: Sequence[tuple[str, str | int]], *, space_ref: str | None = None,
                  dry_run: bool = False) -> FitResult:
        """Route the labelled prompts, then raise each task's threshold just above the prompts it wrongly
        accepts, never past the documented false-reject rate of its own held-out scores; turn off the template and
        novelty tests of tasks whose labelled prompts they reject too often
        (:func:`atlas.route_fit.templates_to_turn_off`, :func:`atlas.route_fit.novelty_to_turn_off`: those prompts
        are then scored as answered, not forced "none")."""
        if not examples:
            raise InvalidInput("no examples")
        # labels first: a bad one fails before any prompt is sketched
        space_id, labels = await asyncio.to_thread(self._labels, space_ref, [lb for _, lb in examples])
        answers = await self._route_examples([p for p, _ in examples], space_ref)
        # Accuracy before: the answers as routed (every test as it stands), not a replay of them.
        before = accuracy_of(labels, [None if a.none or not a.matches else a.matches[0].task_id for a in answers])
        matched = sorted({m.task_id for a in answers for m in a.matches})
        # a dry run stores nothing: it reads, and never waits for (or holds) the database's write lock
        rates, tested = await asyncio.to_thread(self._rates_and_tested, space_id, matched)
        with self.store.read() if dry_run else self.store.session() as session:
            problem = _fit_problem(session, labels, answers, matched, rates, tested)
            res = fit_thresholds(problem.items, problem.current, routing_repo.get_held_out_scores(session, matched),
                                 default=self.default, false_reject_rate=problem.rates,
                                 short_held_out=problem.short_views, short_rate=problem.full_rates)
            # a task deleted since the prompts were routed is left out (its routing row went with it)
            names = repository.task_names(session, [*res.thresholds, *problem.template_off, *problem.novelty_off,
                                                    *res.held_by_cap])
            thresholds = {t: v for t, v in res.thresholds.items() if t in names}
            off = {t for t in problem.template_off if t in names}
            novelty_off = {t for t in problem.novelty_off if t in names}
            if not dry_run:
                for t, thr in thresholds.items():
                    routing_repo.set_threshold_override(session, t, thr)
                for t in off:
                    routing_repo.set_template_test(session, t, False)
                for t in novelty_off:
                    routing_repo.set_novelty_test(session, t, False)
        unsplit = {t: v for t, v in problem.unsplit.items() if t in novelty_off and t not in thresholds}
        return FitResult({names[t]: v for t, v in thresholds.items()}, before,
                         res.accuracy_after, not dry_run, sorted(names[t] for t in off),
                         sorted(names[t] for t in novelty_off),
                         {names[t]: float(problem.held_to.get(t, self.default)) for t in [*thresholds, *unsplit]},
                         {names[t]: v for t, v in unsplit.items()},
                         {names[t]: n for t, n in res.held_by_cap.items() if t in names})

    async def _route_examples(self, prompts: list[str], space_ref: str | None) -> list[Any]:
        """The answers users get for ``fit``'s prompts (the default candidate pool, as for any k up to
        ``ROUTE_POOL``), routed ``FIT_BATCH`` at a time; a bad prompt's error names its example."""
        answers: list[Any] = []
        for start in range(0, len(prompts), FIT_BATCH):
            try:
                part, _ = await self.queries.route(prompts[start: start + FIT_BATCH], k=ROUTE_POOL, threshold=None,
                                                   space_ref=space_ref)
            except (InvalidInput, PayloadTooLarge) as e:
                raise _example_error(e, start) from e
            answers += part
        return answers

    def _rates_and_tested(self, space_id: int, task_ids: Sequence[int]) -> tuple[dict[int, float], frozenset[int]]:
        """The tasks' false-reject rates and those of them with a novelty test at their rate."""
        with self.store.read() as session:
            rates = routing_repo.false_reject_rates(session, task_ids)
        return rates, self.queries.novelty_tested(space_id, {t: rates.get(t, FALSE_REJECT_RATE) for t in task_ids})


@dataclass(frozen=True)
class _FitProblem:
    """What :func:`atlas.route_fit.fit_thresholds` is given for one ``fit`` (see :func:`_fit_problem`)."""

    items: list[FitItem]
    current: dict[int, float]
    """Each task's threshold as its labelled prompts were judged: its half-rate one while its novelty test stays."""
    rates: dict[int, float]
    """Each task's false-reject rate for its whole prompts (half its rate while its novelty test stays)."""
    full_rates: dict[int, float]
    short_views: dict[int, Any]
    held_to: dict[int, float]
    """The threshold each task's prompts were held to before (``FitResult.previous``)."""
    template_off: set[int]
    novelty_off: set[int]
    unsplit: dict[int, float]
    """Each task's threshold once its novelty test is off, where it was held to another, half-rate one: its full-rate
    calibrated threshold."""


def _fit_problem(session: Any, labels: list[int | None], answers: list[Any], matched: list[int],
                 rates: dict[int, float], tested: frozenset[int]) -> _FitProblem:
    """The labelled prompts as :class:`atlas.route_fit.FitItem` s, with the thresholds and rates they were judged by,
    and the tasks whose template or novelty test ``fit`` turns off."""
    answered = [a.matches[0].task_id if a.matches else None for a in answers]
    off = templates_to_turn_off(labels, answered, [a.template_rejects for a in answers])
    novelty_off = novelty_to_turn_off(labels, answered, [a.novelty_rejects for a in answers], rates)
    routes = routing_repo.get_task_routes(session, matched)  # the tasks the items score

    # A short prompt's drop is measured from the threshold whole prompts are held to without an override (the
    # half-rate one while the novelty test applies): a task whose test fit turns off is measured from its
    # calibrated one once stored, so its short prompts' drops move by the difference.
    def whole(t: int, r: Any, after: bool) -> float | None:  # whole_threshold, before or after this fit
        applies = t in tested and r.novelty_test and not (after and t in novelty_off)
        return None if r.calibrated is None else whole_threshold(r.calibrated, r.split_threshold, applies)

    moved = {t: w1 - w0 for t, r in routes.items() if t in novelty_off
             and (w0 := whole(t, r, False)) is not None and (w1 := whole(t, r, True)) is not None}
    items = [FitItem(lab, {m.task_id: m.score for m in a.matches}, top,
                     forced_none=a.nearest_rejects
                     or (a.novelty_rejects and top not in novelty_off)
                     or (a.template_rejects and top not in off),
                     length_drops={m.task_id: m.length_drop + moved.get(m.task_id, 0.0) for m in a.matches
                                   if m.length_drop is not None})
             for lab, a, top in zip(labels, answers, answered, strict=True)]
    current = {t: r.threshold for t, r in routes.items() if r.threshold is not None}
    # A task that keeps its novelty test spends half its rate on it: the threshold the answers were held to is its
    # half-rate one (unless overridden: then the override), and fit's cap is at half its rate, overridden or not (so
    # both tests stay within the rate; a second fit of a task the first had raised capped it at the full rate).
    keeps_novelty = {t for t, r in routes.items() if t in tested and r.novelty_test and t not in novelty_off}
    split = {t: r.split_threshold for t, r in routes.items()
             if t in tested and r.novelty_test and not r.overridden and r.split_threshold is not None}
    held_to = {**current, **split}
    # A raise moves short prompts' thresholds too: the cap also keeps the task's held-out prefix views (short
    # for it, on the whole prompts' scale) within its full rate (a short prompt meets no novelty test).
    concerned = {t for t in [*labels, *answered] if t is not None}
    short_views = {t: short_view_scores(r.length_views, r.calibrated, whole(t, r, True), r.false_reject_rate)
                   for t, r in routes.items() if t in concerned}
    full_rates = dict(rates)
    whole_rates = {**rates, **{t: split_rates(rates.get(t, FALSE_REJECT_RATE))[0] for t in keeps_novelty}}
    current.update({t: thr for t, thr in split.items() if t not in novelty_off})
    # held to its half-rate threshold before, its whole-rate one once the test is off (an override holds: no move)
    unsplit = {t: r.threshold for t, r in routes.items()
               if t in novelty_off and t in split and r.threshold is not None and r.threshold != split[t]}
    return _FitProblem(items, current, whole_rates, full_rates, short_views, held_to, set(off), set(novelty_off),
                       unsplit)


FIT_BATCH = 64
"""Labelled prompts routed per call of ``fit``."""


def _example_error(error: InvalidInput | PayloadTooLarge, start: int) -> InvalidInput | PayloadTooLarge:
    """``error`` of a ``fit`` batch starting at example ``start``, naming the example by its index in the whole
    request (the router numbers the prompts of its batch)."""
    detail = error.detail
    if not isinstance(detail, dict) or not isinstance(detail.get("prompt"), int):
        return error
    index = start + int(detail["prompt"])
    message = re.sub(rf"^prompt {int(detail['prompt'])}\b", f"example {index}", error.message)
    return type(error)(message, {**detail, "prompt": index, "example": index})


def _label(session: Any, space_id: int, label: str | int) -> int | None:
    """The task id of one ``fit`` label (see :meth:`ThresholdService._labels`)."""
    if isinstance(label, str) and label.strip().lower() == "none":
        return None
    if isinstance(label, int) and not 1 <= label <= MAX_TASK_ID:
        raise NotFound(f"task {label} does not exist", {"task_id": label})
    task = (repository.get_task(session, int(label)) if isinstance(label, int)
            else repository.get_task_by_name(session, space_id, label))
    if task.space_id != space_id:
        raise IncompatibleSpace(f"label {label!r}: task {task.id} ({task.name}) belongs to space {task.space_id}, "
                                f"the prompts are routed in space {space_id}",
                                {"task_id": int(task.id), "space_ids": [int(task.space_id), space_id]})
    if task.status != TASK_READY:
        raise NotReady(f"label {label!r}: task {task.id} ({task.name}) is not ready (status {task.status})",
                       {"task_id": int(task.id), "status": task.status})
    return int(task.id)
