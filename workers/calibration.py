"""The routing side of a job's end: prompt-side state and held-out threshold calibration.

:func:`prompt_side` runs outside the final transaction (model forwards, prompt mode of the
extractor); :func:`store_routing_side` runs inside it, after the task's merged state is known.
Semantics (docs/SCORES.md):

* **Completion-mode tasks** route on a prompt-side state: the sum of the prompt-mode states of
  every sample's ``prompt`` (a prompt has no answer tokens, so the completion signature is not what
  a prompt resembles). It is merged on append like the task state.
  Its prompts' novelty vectors (:mod:`atlas.novelty`) are kept in its baseline blob, so the open set's novelty test
  applies to it as to a text task (whose vectors come from its samples' extraction).
* **Text-mode tasks** route on their own state (prompt mode of a text is text mode of it).
* **Calibration**: up to ``CALIBRATION_SAMPLES`` samples of the job are scored leave-one-out against
  the routing state (their own contribution removed, so each is held out); the task's threshold is
  the lower tolerance bound at its false-reject rate (``FALSE_REJECT_RATE`` unless set for the task) of all
  its held-out scores (appends add theirs).
* **Views by length**: the first half, quarter and eighth of tokens (``PREFIX_FRACTIONS``) of up to
  ``VIEW_SAMPLES`` of the calibration samples (evenly spaced among them) are sketched too and scored against the
  routing state without the whole sample; with the whole samples' scores they are the task's held-out views
  (``task_routing.cal_views``), on which a prompt shorter than the samples has its threshold calibrated
  (:class:`atlas.route_calibration.LengthViews`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from atlas import routing, routing_repo
from atlas.baselines import BaselineSums
from atlas.lexicon_repo import routing_text
from atlas.route_calibration import MIN_VIEW_TOKENS, PREFIX_FRACTIONS, view_pick
from atlas.samples import Sample, sample_id

if TYPE_CHECKING:
    from workers.batching import PreparedSample

log = logging.getLogger(__name__)


@dataclass
class PromptSide:
    """What the job computed for routing: the prompt-side sum (completion mode) and the held-out states; in
    completion mode also each prompt's novelty vector (:mod:`atlas.novelty`: a completion task is tested on its
    prompts, as a text task on its samples), by the sample's content id."""

    prompt_sum: Any = None
    cal_states: list[Any] = field(default_factory=list)
    cal_prefixes: list[list[Any]] = field(default_factory=list)
    """Per entry of ``cal_states``: the states of its prefixes (:func:`prefixes`)."""
    novelty_keys: list[int] = field(default_factory=list)
    novelty_vectors: list[np.ndarray] = field(default_factory=list)

    def add_vectors(self, baselines: BaselineSums) -> BaselineSums:
        """``baselines`` with this pass's prompt vectors added to the kept ones (bottom-k by content id)."""
        if not self.novelty_keys:
            return baselines
        return baselines.with_sample_vectors(np.asarray(self.novelty_keys, dtype=np.int64),
                                             np.stack(self.novelty_vectors))


def prefixes(ps: PreparedSample) -> list[PreparedSample]:
    """A tokenised calibration prompt's prefix views: its first ``PREFIX_FRACTIONS`` of counted positions (at least
    ``MIN_VIEW_TOKENS``, fewer than the whole; one per distinct length), as a shorter prompt is tokenised."""
    out: list[PreparedSample] = []
    for fraction in PREFIX_FRACTIONS:
        counted = round(ps.n_counted * fraction)
        if MIN_VIEW_TOKENS <= counted < ps.n_counted and all(p.n_counted != counted for p in out):
            out.append(replace(ps, input_ids=ps.input_ids[:ps.first_target + counted + 1]))
    return out


PROMPT_WINDOW = 256
"""Prompts tokenised and sketched per batched call of :func:`prompt_side` (bounds its memory)."""


class _Stopped(Exception):
    """Raised out of a window's sketch when ``should_stop()`` turns true between its length buckets."""


def prompt_side(extractor: Any, samples: Sequence[Sample], mode: str, *,
                progress: Callable[[int, int], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> PromptSide | None:
    """Prompt-mode states of the job's samples (all of them in completion mode, the calibration pick else).

    ``progress(done, total)`` is called before the first window, after each batched sketch within a window (its
    share of the window's prompts and prefixes done, so a job of one window reports more than its start and end) and
    after each window (prompts sketched); ``None`` is returned when ``should_stop()`` turns true between windows or
    between the length buckets of one (the job was cancelled or its runner stops: a pass of up to 256 prompts, one
    window, ran to its end after a cancel, ~10 s of a 60-pair completion task on 2 cores).

    The prompts are sketched in batches as routing prompts are (:meth:`PromptBatcher.sketch_prepared`: length
    buckets, one forward each, every prompt its own state, equal to sketching it alone up to float32 rounding),
    not one forward per prompt. In completion mode every prompt token is sketched, so this pass costs more than
    the job's extraction, which sketches only the completion tokens (bench/results/extraction.md, 2b: ~3x on 2 CPU
    cores; batching gains ~10 % there). A prompt that cannot be sketched (empty, under 2 tokens) is left out.
    """
    from workers.prompt_batcher import PromptBatcher

    pick = set(routing.calibration_pick(len(samples)))
    with_views = set(view_pick(sorted(pick)))
    wanted = [(i, routing_text(s, mode)) for i, s in enumerate(samples) if mode == "completion" or i in pick]
    texts = [(i, t) for i, t in wanted if t]
    # Logits of a whole length bucket are held at once: bound them to ~512 MiB of float32 (1,024 positions at a
    # 128k vocabulary), never below one prompt of the longest kind.
    budget = max(extractor.sample_tokenizer.max_tokens, min(8192, (1 << 27) // max(int(extractor.lm.K), 1)))
    batcher = PromptBatcher(extractor, token_budget=budget)
    out = PromptSide()
    for lo in range(0, len(texts), PROMPT_WINDOW):
        if progress is not None:
            progress(lo, len(texts))
        if should_stop is not None and should_stop():
            return None
        window = texts[lo: lo + PROMPT_WINDOW]
        prepared, _skipped = extractor.sample_tokenizer.prepare([Sample(text=t) for _, t in window], "text")
        if not prepared:
            continue
        views = {ps.index: prefixes(ps) for ps in prepared if window[ps.index][0] in with_views}
        extra = [v for ps in prepared for v in views.get(ps.index, [])]  # sketched in the same batches
        batch = [*prepared, *extra]
        report = None if progress is None else _window_progress(progress, lo, len(window), len(batch), len(texts))

        def sketched(n: int, report: Callable[[int], None] | None = report) -> None:
            if report is not None:
                report(n)
            if should_stop is not None and should_stop():
                raise _Stopped

        try:
            every = batcher.sketch_prepared(batch, sketched)
        except _Stopped:
            return None
        states, view_states = every[:len(prepared)], iter(every[len(prepared):])
        vectors = getattr(every, "novelty", None)
        for j, (ps, st) in enumerate(zip(prepared, states, strict=True)):
            own_views = [next(view_states) for _ in views.get(ps.index, [])]
            if st.n_draws == 0:
                continue
            if mode == "completion":
                out.prompt_sum = st.copy() if out.prompt_sum is None else out.prompt_sum.merge(st)
                if vectors is not None:
                    out.novelty_keys.append(sample_id(samples[window[ps.index][0]]))
                    out.novelty_vectors.append(np.asarray(vectors[j], dtype=np.float32))
            if window[ps.index][0] in pick:
                out.cal_states.append(st)
                out.cal_prefixes.append(own_views)
    if progress is not None:
        progress(len(texts), len(texts))
    return out


def _window_progress(progress: Callable[[int, int], None], lo: int, size: int, batch: int, total: int
                     ) -> Callable[[int], None]:
    """``progress`` within the window of ``size`` prompts from ``lo`` (of ``total``), whose sketch holds ``batch``
    prompts and prefixes: ``n`` of them sketched counts as that share of the window's prompts."""
    return lambda n: progress(lo + size * n // max(batch, 1), total)


def prompt_side_or_none(extractor: Any, samples: Sequence[Sample], mode: str, **hooks: Any) -> PromptSide | None:
    """:func:`prompt_side` (``hooks``: its ``progress`` and ``should_stop``), or ``None`` (logged) when it fails:
    routing data is derived, never fatal."""
    try:
        return prompt_side(extractor, samples, mode, **hooks)
    except Exception:
        log.exception("prompt-side routing data could not be computed; the task keeps its previous calibration")
        return None


def store_routing_side(session: Any, task_id: int, mode: str, merged_state: Any, side: PromptSide) -> None:
    """Merge the prompt-side state, score the calibration samples held out, store the calibration."""
    from fishersketch import SketchState

    row = routing_repo.get_routing(session, task_id)
    prompt_blob = None
    route_state = merged_state
    if mode == "completion":
        old = None if row is None or row.prompt_state is None else SketchState.from_bytes(
            row.prompt_state, spec=merged_state.spec)
        parts = [p for p in (old, side.prompt_sum) if p is not None]
        if parts:
            route_state = parts[0] if len(parts) == 1 else parts[0].merge(parts[1])
            prompt_blob = route_state.to_bytes()
    prefixes_of = side.cal_prefixes or [[] for _ in side.cal_states]
    views = routing.leave_one_out_views(route_state, list(zip(side.cal_states, prefixes_of, strict=True)))
    scores = [score for _, score, whole in views if whole]  # the whole samples' (leave_one_out_scores)
    previous, previous_views, stored_rate = (([], [], None) if row is None else
                                             (list(row.cal_scores or []), list(row.cal_views or []),
                                              row.false_reject_rate))
    calibration = routing.calibrate(previous + scores, routing_repo.calibration_rate(stored_rate))
    routing_repo.store_routing(session, task_id, prompt_state=prompt_blob, calibration=calibration,
                               views=[*previous_views, *views])
    log.info("task %s: routing calibrated on %s held-out scores, threshold %s", task_id,
             len(calibration.scores), calibration.threshold)
