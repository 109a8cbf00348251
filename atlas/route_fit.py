"""``fit``: tune per-task route thresholds from labelled prompts (docs/SCORES.md).

semantic-router's ``RouteLayer.fit`` searches thresholds that maximise accuracy on labelled
utterances; here the search is closed-form per task and bounded so that the documented
false-reject rate holds (see :func:`fit_thresholds`). The checks of ``route``'s and ``fit``'s inputs that the
Python client and the library share are here too (:func:`prompt_batch`, :func:`fit_examples`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from atlas.routing import FALSE_REJECT_RATE, MIN_CALIBRATION
from atlas.task_names import RESERVED_NAME
from atlas.template import TEMPLATE_FALSE_REJECT

NOVELTY_FALSE_REJECT = 0.10
"""``fit`` turns a task's novelty test off (:mod:`atlas.novelty`) when it rejected more than this share of the
prompts labelled with the task and answered by it — four times the test's own budget at the default rate (half of
5 %) — or, for a task calibrated at a false-reject rate above it, more than that rate (twice the test's half)."""

NOVELTY_MIN_REJECTS = 3
"""...and at least this many of them: a novelty "none" or two among a few labelled prompts is what the test's own
budget gives by chance (with the test holding its default 2.5 %, ``fit`` turns it off by chance for at most 3.5 %
of label sets of any size, about 1 % typically)."""

FIT_EXAMPLE_FORM = ('a labelled prompt is a (prompt, label) pair or an object {"prompt": ..., "label": ...}; a label '
                    'is a task name or id, or "none" (or None)')
"""What :func:`as_fit_example` accepts, for error messages."""


def as_fit_example(example: object) -> tuple[str, str | int] | None:
    """One labelled prompt of ``fit`` as ``(prompt, label)``, from a pair or a mapping with ``prompt`` and
    ``label`` (a line of the labels file; other keys ignored); ``None`` when it is neither, or its prompt is not a
    string or its label neither a string nor an integer (a bool is no label). A label ``None`` (JSON ``null``) is
    ``"none"``, as semantic-router's ``fit`` reads a route of ``None``."""
    if isinstance(example, Mapping):
        if "prompt" not in example or "label" not in example:
            return None
        prompt, label = example["prompt"], example["label"]
    elif isinstance(example, tuple | list) and len(example) == 2:
        prompt, label = example
    else:
        return None
    if label is None:
        label = RESERVED_NAME
    if not isinstance(prompt, str) or isinstance(label, bool) or not isinstance(label, str | int):
        return None
    return prompt, label


def prompt_batch(prompts: object) -> list[str]:
    """A batch of prompts given to ``route`` as a list of ``str``: any iterable of strings (a list, a tuple, a NumPy
    array or a pandas column of strings, a generator).

    Raises
    ------
    TypeError
        A string, bytes, a mapping (a dict was routed by its keys, bytes by their integers), ``None`` or anything
        not iterable, or an element that is not a string; the message names it.
    """
    if isinstance(prompts, str | bytes | bytearray | Mapping) or not isinstance(prompts, Iterable):
        raise TypeError(f"prompts are a string or a list of strings, not {type(prompts).__name__}")
    out = list(prompts)
    bad = next((i for i, p in enumerate(out) if not isinstance(p, str)), None)
    if bad is not None:
        raise TypeError(f"prompt {bad} is a {type(out[bad]).__name__}, not a string")
    return [str(p) for p in out]


def fit_examples(examples: object) -> tuple[list[tuple[str, str | int]], int | None]:
    """``fit``'s labelled prompts as ``(prompt, label)`` pairs (:func:`as_fit_example`), and the index of the first
    example of neither form (``None``: all are good; the caller raises its own error naming it).

    Raises
    ------
    TypeError
        ``examples`` is not a collection of examples (``None``, a string, a mapping: say what it is).
    """
    if isinstance(examples, str | bytes | Mapping) or not isinstance(examples, Iterable):
        raise TypeError(f"examples are a list of labelled prompts, not {type(examples).__name__}")
    pairs: list[tuple[str, str | int]] = []
    for i, e in enumerate(examples):
        pair = as_fit_example(e)
        if pair is None:
            return pairs, i
        pairs.append(pair)
    return pairs, None


# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitItem:
    """One labelled prompt: its label (task id, or ``None`` for "none"), its scores per task, the task
    the router ranks first (``best``; default: the highest score), whether the answer is "none"
    whatever the best task's threshold (``forced_none``: the nearest task rejects it, see
    :func:`atlas.routing.rerank_route`) and, for the tasks the prompt is short for, how far below a task's
    threshold its length holds it (``length_drops``: a task's threshold ``c`` holds it to ``c − drop``,
    :func:`atlas.routing.prompt_threshold`)."""

    label: int | None
    scores: Mapping[int, float]
    best: int | None = None
    forced_none: bool = False
    length_drops: Mapping[int, float] = field(default_factory=dict)

    def threshold(self, task: int, threshold: float) -> float:
        """What task ``task`` at ``threshold`` (its threshold for prompts as long as its samples) holds this prompt
        to."""
        return threshold - self.length_drops.get(task, 0.0)

    def whole_score(self, task: int) -> float:
        """The prompt's score against ``task`` on the scale of prompts as long as its samples: accepted at a
        threshold ``c`` exactly when this is at least ``c`` (a short prompt's score plus its drop)."""
        return float(self.scores[task]) + self.length_drops.get(task, 0.0)

    def top(self) -> int:
        """The task the router answers before any threshold."""
        if self.best is not None and self.best in self.scores:
            return self.best
        return max(self.scores, key=lambda t: (self.scores[t], -t))


@dataclass(frozen=True)
class FitResult:
    """New per-task thresholds and the accuracy before and after on the labelled prompts."""

    thresholds: dict[int, float]
    accuracy_before: float
    accuracy_after: float
    held_by_cap: dict[int, int] = field(default_factory=dict)
    """Per task: the prompts labelled otherwise that it still answers because refusing them would take its
    threshold past its cap (its false-reject rate on its own positives)."""


def _predict(item: FitItem, thr: Mapping[int, float], default: float) -> int | None:
    if not item.scores or item.forced_none:
        return None
    best = item.top()
    return best if item.scores[best] >= item.threshold(best, thr.get(best, default)) else None


def _right_answers(answered: Sequence[FitItem], task: int, threshold: float) -> int:
    """How many of the prompts ``task`` answers (before its threshold) are right at ``threshold``: its own
    accepted, or those labelled "none" rejected (a prompt of another task is wrong either way)."""
    return sum((it.scores[task] >= it.threshold(task, threshold)) == (it.label == task)
               if it.label in (task, None) else 0 for it in answered)


def _just_above(item: FitItem, task: int) -> float:
    """A threshold of ``task`` just above ``item``'s whole-scale score that rejects it: the next float above it, or —
    where the short prompt's own threshold, that minus its drop, rounds back to its score — stepped on by the
    spacing of the largest of the three numbers (a step of the next float alone took billions of steps near 0)."""
    score, whole = float(item.scores[task]), item.whole_score(task)
    threshold = float(np.nextafter(whole, np.inf))
    step = float(np.spacing(max(abs(score), abs(whole), abs(item.length_drops.get(task, 0.0)))))
    while score >= item.threshold(task, threshold):
        threshold += step
    return threshold


def _highest_accepting(item: FitItem, task: int) -> float:
    """The highest threshold of ``task`` that still accepts ``item`` (a short prompt): its whole-scale score, or —
    where that minus its drop rounds above its score — stepped down as :func:`_just_above` steps up (a cap at the
    whole-scale score itself rejected the very prompt it was set from, by one rounding)."""
    score, threshold = float(item.scores[task]), item.whole_score(task)
    step = float(np.spacing(max(abs(score), abs(threshold), abs(item.length_drops.get(task, 0.0)))))
    while score < item.threshold(task, threshold):
        threshold -= step
    return threshold


def _rate_of(rate: float | Mapping[int, float], task: int) -> float:
    """One rate, or each task's own by id (the default for a task not named)."""
    return float(rate.get(task, FALSE_REJECT_RATE)) if isinstance(rate, Mapping) else float(rate)


def _quantile(scores: Sequence[float], rate: float) -> float:
    """The ``rate`` quantile of ``scores`` (the lower one: at most ``rate`` of them below it); +inf without any."""
    return float(np.quantile(np.asarray(scores), rate, method="lower")) if scores else math.inf


def accuracy(items: Sequence[FitItem], thr: Mapping[int, float], default: float) -> float:
    """Share of labelled prompts answered right (the best task, or none) under thresholds ``thr``."""
    if not items:
        return 0.0
    return sum(_predict(it, thr, default) == it.label for it in items) / len(items)


def accuracy_of(labels: Sequence[int | None], answers: Sequence[int | None]) -> float:
    """Share of labelled prompts whose answer (a task id, ``None`` for "none") is their label."""
    return sum(a == lab for lab, a in zip(labels, answers, strict=True)) / len(labels) if labels else 0.0


def fit_thresholds(
    items: Sequence[FitItem], current: Mapping[int, float], held_out: Mapping[int, Sequence[float]],
    *, default: float, false_reject_rate: float | Mapping[int, float] = FALSE_REJECT_RATE,
    short_held_out: Mapping[int, Sequence[float]] | None = None,
    short_rate: float | Mapping[int, float] = FALSE_REJECT_RATE,
) -> FitResult:
    """Tune per-task thresholds from labelled prompts (semantic-router's ``fit``, made monotone and safe).

    For each task that is the best match of some prompt labelled otherwise (another task or "none"), the
    threshold is searched, as semantic-router does, for the highest accuracy on the prompts that task
    answers — among its current threshold and the values just above each such wrong prompt's score (ties: the
    highest, towards the wrong prompts' region) — but never above the cap: the ``false_reject_rate``
    quantile of the task's positives (its labelled prompts' scores and its own held-out calibration scores;
    one rate, or each task's own by id, the default for tasks not named), so false rejects stay within the
    task's stated rate. A prompt short for a task is held below the task's threshold by its length's drop
    (``FitItem.length_drops``, the same at any threshold ``fit`` sets), so a raise raises it too: it is scored on the
    whole prompts' scale (:meth:`FitItem.whole_score`) among the answers at each candidate threshold, and the
    threshold is also capped at the ``short_rate`` quantile (the task's full rate: a short prompt meets no novelty
    test) of its short positives on that scale — its labelled short prompts and ``short_held_out``, its held-out
    prefix views (:func:`atlas.route_candidates.short_view_scores`) — so false rejects stay within the rate at every
    length (until 2026-12-01 a short prompt was held to the lower of the threshold and its length's bound, which no
    threshold ``fit`` set could raise). A threshold above the cap is lowered to it (the only step that can lower the
    accuracy on the labelled prompts; the current threshold is always a candidate, so a raise never does: raising to
    just above the highest wrong prompt's score lost more right answers than wrong ones when those were few). Tasks
    with fewer than ``MIN_CALIBRATION`` positives, or not touched by the labelled prompts, keep theirs. Returns only
    the thresholds that changed.
    """
    thr = {int(k): float(v) for k, v in current.items()}
    before = accuracy(items, thr, default)
    held: dict[int, int] = {}
    # the tasks the labelled prompts concern: those a prompt is labelled with or answered by (the others keep
    # theirs, an override included: every task a prompt scores against is no reason to move its threshold)
    tasks = {it.label for it in items if it.label is not None} | {it.top() for it in items if it.scores}
    for t in sorted(tasks):
        own = [it for it in items if it.label == t and t in it.scores]
        pos = [float(it.scores[t]) for it in own if t not in it.length_drops]
        pos += [float(s) for s in held_out.get(t, ())]
        short = [_highest_accepting(it, t) for it in own if t in it.length_drops]
        short += [float(s) for s in (short_held_out or {}).get(t, ())]
        if len(pos) + len(short) < MIN_CALIBRATION:
            continue
        # too few whole positives to cap on their own: with the short ones, on one scale (as before 2026-12-01)
        cap = _quantile(pos if len(pos) >= MIN_CALIBRATION else pos + short, _rate_of(false_reject_rate, t))
        if len(short) >= MIN_CALIBRATION:
            cap = min(cap, _quantile(short, _rate_of(short_rate, t)))
        answered = [it for it in items if it.scores and not it.forced_none and it.top() == t]  # "none" already
        negs = [(it, it.whole_score(t)) for it in answered if it.label != t]
        old = thr.get(t, default)
        new = min(old, cap)
        if negs and old < cap:
            choices = sorted({old, *(min(cap, _just_above(it, t)) for it, x in negs if x >= old)})
            new = max(choices, key=lambda c: (_right_answers(answered, t, c), c))
        if new != old:
            thr[t] = new
        kept = sum(1 for it, x in negs if x >= new and _just_above(it, t) > cap)  # only the cap keeps them
        if kept:
            held[t] = kept
    after = accuracy(items, thr, default)
    changed = {t: v for t, v in thr.items() if current.get(t) != v}
    return FitResult(thresholds=changed, accuracy_before=before, accuracy_after=after, held_by_cap=held)


# --------------------------------------------------------------------------------------------------
# the per-task tests fit turns off


def _own_rejections(labels: Sequence[int | None], answered: Sequence[int | None], rejected: Sequence[bool]
                    ) -> tuple[Counter[int], Counter[int]]:
    """Per task: the prompts labelled with it, and those of them it answered (``answered``: each prompt's first
    match, ``None`` without one) and its test rejected (``rejected``)."""
    positives = Counter(lab for lab in labels if lab is not None)
    own = Counter(lab for lab, task, no in zip(labels, answered, rejected, strict=True)
                  if lab is not None and no and task == lab)
    return positives, own


def templates_to_turn_off(labels: Sequence[int | None], answered: Sequence[int | None],
                          lacking: Sequence[bool]) -> set[int]:
    """Tasks whose template rejected (``lacking``: the answer's ``template_rejects``) more than
    ``TEMPLATE_FALSE_REJECT`` of the prompts labelled with them and answered by them: their real prompts do not
    follow their samples' wording, so ``fit`` turns the test off (docs/SCORES.md, "fit")."""
    positives, lacked = _own_rejections(labels, answered, lacking)
    return {t for t, n in lacked.items() if n / positives[t] > TEMPLATE_FALSE_REJECT}


def novelty_to_turn_off(labels: Sequence[int | None], answered: Sequence[int | None], novel: Sequence[bool],
                        rates: Mapping[int, float] | None = None) -> set[int]:
    """Tasks whose novelty test rejected (``novel``: the answer's ``novelty_rejects``) at least
    ``NOVELTY_MIN_REJECTS`` and more than ``NOVELTY_FALSE_REJECT`` (or, when larger, the task's false-reject rate
    in ``rates``: twice the test's half of it; the default rate for a task not named) of the prompts labelled with
    them and answered by them: their real prompts are another kind of text than their samples, so ``fit`` turns
    the test off (docs/SCORES.md, "fit")."""
    rates = rates or {}
    positives, rejected = _own_rejections(labels, answered, novel)
    return {t for t, n in rejected.items() if n >= NOVELTY_MIN_REJECTS
            and n / positives[t] > max(NOVELTY_FALSE_REJECT, float(rates.get(t, FALSE_REJECT_RATE)))}
