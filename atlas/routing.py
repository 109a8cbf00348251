"""Route scores with a meaning, per-task calibrated thresholds and ``fit`` (docs/SCORES.md).

Pure numpy over :class:`fishersketch.SketchState` objects, plus two helpers that read the routing
rows through :mod:`atlas.routing_repo` (no SQL here).

Route score
    ``score(p, t) = ⟨p̂, μ_t⟩ / √(max(Ŝ_t, 0) (1 + κ / n_s) + n₀ σ̄²_t / n_t)`` on the ``ae`` feature: ``p̂`` the
    prompt's unit signature, ``μ_t`` the task's mean feature over its ``n_t`` draws, ``Ŝ_t`` its
    unbiased (U-statistic) self-similarity, ``σ̄²_t`` the mean squared norm of one draw and
    ``n₀ = PRIOR_DRAWS`` pseudo-draws of noise (a minimum-evidence prior). The denominator is never
    below ``‖μ_t‖`` (``‖μ‖² = Ŝ (n − 1)/n + σ̄²/n``), so by Cauchy–Schwarz the score is a cosine in
    ``[−1, 1]``; for a large task it tends to the unbiased cosine ``⟨p̂, μ⟩ / √Ŝ``, for a task of a
    few draws the noise term dominates and the score shrinks towards the cosine with its (noisy)
    mean — a small or noisy task cannot inflate it. The signal term is further multiplied by
    ``1 + κ / n_s`` (``κ = PRIOR_SAMPLES`` pseudo-samples, ``n_s`` the task's samples): the cosine is
    shrunk by ``√(n_s / (n_s + κ))`` at most, 0.58 for 2 samples, 0.93 for 24, 0.99 for 150.
Threshold
    Per task: ``threshold_override`` (PATCH, ``/v1/route/fit``) else ``threshold_auto`` — the
    ``FALSE_REJECT_RATE`` quantile of the task's leave-one-out scores (each calibration sample's prompt
    scored against the task's routing state with that sample removed, i.e. held out) — else the
    global default ``settings.route_threshold``. A request's explicit ``threshold`` overrides all.
Ranking
    In a space of ``atlas.whitening.WHITEN_MIN_TASKS`` tasks or more, matches are ordered by
    :func:`rank_scores` — the mean of the whitened ``ae`` and error cosines, shrunk like the score, less
    half the task's typical held-out score — in a smaller one by :func:`unwhitened_rank` — fused with the
    lexical score where tasks have terms (:mod:`atlas.lexical`); the open-set decision stays on the score
    and its threshold (docs/SCORES.md, "Ranking", "Lexical evidence").
Confidence
    ``sigmoid((score − threshold) / scale)``, ``scale`` the spread (standard deviation) of the task's
    leave-one-out scores (``DEFAULT_SCALE`` without calibration): 0.5 on the threshold, towards 1
    when the prompt scores like the task's own samples; for a ``none`` answer the confidence that
    the prompt fits no task, ``1 − sigmoid(...)`` of the best match.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from atlas import lexical
from atlas.novelty import SpaceNovelty
from atlas.route_answer import Rejection as Rejection
from atlas.route_answer import RouteAnswer as RouteAnswer
from atlas.route_answer import RouteMatch as RouteMatch
from atlas.route_calibration import CALIBRATION_CONFIDENCE as CALIBRATION_CONFIDENCE
from atlas.route_calibration import CALIBRATION_SAMPLES as CALIBRATION_SAMPLES
from atlas.route_calibration import FALSE_REJECT_RATE as FALSE_REJECT_RATE
from atlas.route_calibration import MAX_CAL_SCORES, split_rates
from atlas.route_calibration import MIN_CALIBRATION as MIN_CALIBRATION
from atlas.route_calibration import Calibration as Calibration
from atlas.route_calibration import calibrate as calibrate
from atlas.route_calibration import calibration_pick as calibration_pick
from atlas.route_candidates import Candidate as Candidate
from atlas.route_candidates import PromptThreshold as PromptThreshold
from atlas.route_candidates import TaskRoute as TaskRoute
from atlas.route_candidates import prompt_threshold as prompt_threshold
from atlas.route_candidates import resolve as resolve
from atlas.whitening import SpaceWhitening, Whitening

PRIOR_DRAWS = 1.0
"""Pseudo-draws of noise ``n₀`` in the route score's denominator (``≥ 1`` keeps the score in [−1, 1])."""
PRIOR_SAMPLES = 4.0
"""Minimum-evidence prior ``κ`` in samples: the signal term is inflated by ``κ / n_samples`` (draws are
tokens, which are correlated within a sample, so evidence is counted in samples)."""
RANK_TYPICAL_WEIGHT = 0.5
"""Weight ``λ`` of the task's typical held-out score subtracted in the ranking (see :func:`rank_scores`)."""
TYPICAL_PRIOR = 1.0
"""Typical score a task's held-out scores are shrunk towards (weight ``PRIOR_SAMPLES``), and that of a task
of one sample (none can be held out): as tight as a task can be, so it must win on its cosine alone."""
DEFAULT_SCALE = 0.05
"""Confidence scale when a task has no calibration."""
MAX_ROUTE_K = 100
"""Most matches a route query returns per prompt (``k``)."""
_EPS = 1e-10


def _f(x: Any) -> float:
    """A finite Python float (NaN/inf become 0.0 so that answers stay valid JSON)."""
    v = float(x)
    return v if math.isfinite(v) else 0.0


def totals(state: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Sums over both splits ``(3, m)``, squared norms ``(3,)`` and draws of a state."""
    return (np.asarray(state.sums, dtype=np.float64).sum(axis=0),
            np.asarray(state.sq_norms, dtype=np.float64).sum(axis=0), int(state.n_draws))


def denominator(sums: np.ndarray, sq: np.ndarray, n: int, n_samples: int | None = None,
                prior_draws: float = PRIOR_DRAWS, prior_samples: float = PRIOR_SAMPLES) -> float:
    """``√(max(Ŝ, 0) (1 + κ / n_s) + n₀ σ̄² / n)`` of one feature (0 when empty; see the module notes).

    ``sums`` (m,): the feature's sum over the task's ``n`` draws; ``sq`` (): the sum of the draws' squared norms;
    ``n_samples``: samples (default ``n``), for the evidence prior κ / n_s.
    """
    if n <= 0:
        return 0.0
    u = max((float(sums @ sums) - float(sq)) / (n * (n - 1.0)) if n >= 2 else 0.0, 0.0)
    ns = max(int(n_samples if n_samples is not None else n), 1)
    d2 = u * (1.0 + prior_samples / ns) + prior_draws * float(sq) / (n * n)
    return math.sqrt(d2) if d2 > _EPS else 0.0


def unit_signature(state: Any) -> np.ndarray:
    """The prompt's unit ``ae`` mean, shape (m,) (zeros when it has no norm)."""
    s, _, n = totals(state)
    mu = s[0] / max(n, 1)
    norm = float(np.linalg.norm(mu))
    return mu / norm if norm > 0 and math.isfinite(norm) else np.zeros_like(mu)


def unit_means(state: Any) -> np.ndarray:
    """The state's unit ``ae`` and error means, shape (2, m): what the ranking compares (zeros if empty)."""
    sums = totals(state)[0][[0, 2]]
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return np.asarray(np.where(norms > 0, sums / np.where(norms > 0, norms, 1.0), 0.0))


def clipped_scores(dots: Any, dens: Any) -> np.ndarray:
    """Route scores from their parts, the one place of the formula: ``dots / dens`` clipped to [−1, 1], 0 where a
    denominator is not positive. ``dots`` (T,) or (): ``⟨p̂, μ_t⟩``, the prompt's unit ``ae`` mean against each task's
    ``ae`` mean; ``dens`` (T,) or (): each task's :func:`denominator`. Returns shape (T,) or ()."""
    dots, dens = np.asarray(dots, dtype=np.float64), np.asarray(dens, dtype=np.float64)
    ok = dens > 0
    return np.asarray(np.clip(np.where(ok, dots / np.where(ok, dens, 1.0), 0.0), -1.0, 1.0))


def score(unit: np.ndarray, sums_ae: np.ndarray, sq_ae: float, n: int, n_samples: int | None = None) -> float:
    """Route score of a task given by its ``ae`` sums (see the module notes), clipped to [−1, 1]: ``unit`` (m,) the
    prompt's :func:`unit_signature`; ``sums_ae`` (m,), ``sq_ae``, ``n``, ``n_samples`` as in :func:`denominator`."""
    den = denominator(sums_ae, np.asarray(sq_ae, dtype=np.float64), n, n_samples)
    return float(clipped_scores(float(unit @ (sums_ae / n)) if n > 0 else 0.0, den))


def leave_one_out_scores(task_state: Any, sample_states: Sequence[Any]) -> list[float]:
    """Held-out scores: each sample's prompt state against the task's routing state without it (the whole views of
    :func:`leave_one_out_views`).

    ``task_state`` must contain the samples' contributions (states are sums, so removing one is
    exact up to float32 rounding of the stored sums).
    """
    return [score_ for _, score_, _ in leave_one_out_views(task_state, [(st, ()) for st in sample_states])]


def leave_one_out_views(task_state: Any, samples: Sequence[tuple[Any, Sequence[Any]]]
                        ) -> list[tuple[int, float, bool]]:
    """Held-out views of calibration samples, as ``[tokens, score, whole]`` records (``task_routing.cal_views``).

    Parameters
    ----------
    task_state
        The task's routing state; it must contain each sample's contribution (its whole prompt state).
    samples
        Per calibration sample: its whole prompt state, and the prompt states of its prefixes
        (:data:`atlas.route_calibration.PREFIX_FRACTIONS` of its tokens).

    Returns
    -------
    list of (int, float, bool)
        For every view with tokens: its token positions, its route score against the task's routing state with the
        *whole* sample removed (so a prefix is held out too), and whether it is the whole sample.
    """
    s, q, n = totals(task_state)
    ns = int(task_state.n_samples)
    out: list[tuple[int, float, bool]] = []
    for whole, prefixes in samples:
        si, qi, ni = totals(whole)
        if ni <= 0 or n - ni <= 0:
            continue
        rest = (s[0] - si[0], float(q[0] - qi[0]), n - ni, max(ns - int(whole.n_samples), 1))
        for view, is_whole in [(whole, True), *((p, False) for p in prefixes)]:
            if int(view.n_draws) > 0:
                out.append((int(view.n_tokens), score(unit_signature(view), *rest), is_whole))
    return out


def typical_score(cal_scores: Iterable[float]) -> float:
    """A task's typical held-out route score: the mean of its leave-one-out scores shrunk towards
    ``TYPICAL_PRIOR`` by ``PRIOR_SAMPLES`` pseudo-scores, in [−1, 1] (``TYPICAL_PRIOR`` with none)."""
    xs = [float(x) for x in cal_scores if -1.0 <= float(x) <= 1.0][-MAX_CAL_SCORES:]  # cosines; NaN fails too
    return max(-1.0, min(1.0, (sum(xs) + PRIOR_SAMPLES * TYPICAL_PRIOR) / (len(xs) + PRIOR_SAMPLES)))


def confidence(score_: float, threshold: float, scale: float | None) -> float:
    """``sigmoid((score − threshold) / scale)`` in [0, 1] (see the module notes)."""
    z = (score_ - threshold) / (scale if scale and scale > 0 else DEFAULT_SCALE)
    return float(1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0))))


def self_similarity(state: Any, feature: str = "ae") -> float:
    """Unbiased self-similarity Ŝ_f(t, t) of a state (U-statistic; V-statistic for a single draw).

    ``(‖Σψ_f‖² − Σ‖ψ_f‖²) / (n (n − 1))`` over both splits, as in ``fishersketch.align``; 0.0 when
    the state has no draws.
    """
    return float(state_view(state)[1][_FEATURE_INDEX[feature]])


_FEATURE_INDEX = {"ae": 0, "a": 1, "e": 2}


def state_view(state: Any) -> tuple[np.ndarray, np.ndarray, float]:
    """Pooled means ``μ_f`` (3, m), unbiased self-similarities (3,) and the shrunk route denominator.

    Features (ae, a, e); the denominator is :func:`atlas.routing.denominator` of ``ae``. What the
    route re-rank reads from a task's state; callers may cache it next to the state.
    """
    sums, sq, n = totals(state)
    if n == 0:
        return np.zeros_like(sums), np.zeros(3), 0.0
    norms2 = np.einsum("fm,fm->f", sums, sums)
    self_terms = sq.copy() if n == 1 else (norms2 - sq) / (n * (n - 1.0))
    return sums / n, self_terms, denominator(sums[0], sq[0], n, int(state.n_samples))


def route_score(prompt_unit: np.ndarray, task_state: Any) -> float:
    """Route score of a task for a prompt, a cosine in [−1, 1] (see :mod:`atlas.routing`): ``prompt_unit`` (m,),
    :func:`unit_signature` of the prompt's state; ``task_state`` the task's routing state."""
    mu, _, den = state_view(task_state)
    return float(clipped_scores(float(prompt_unit @ mu[0]), den))


def _unit(x: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(x))
    return np.asarray(x / n) if n > 0 and math.isfinite(n) else np.zeros_like(x)


def _whitened_cosines(w: Whitening, prompt_unit: np.ndarray, candidates: Sequence[Candidate],
                      views: Sequence[Any], feature: int, dots: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``(cos(f(p̂), f(μ̂_t)), ‖μ_t‖)`` of one feature for each candidate, shapes (T,), (T,); ``dots`` (T,),
    the ``⟨p̂, μ_t⟩`` when the caller has them already."""
    terms = [w.task_terms(c.task_id, v[0], v[0][feature]) for c, v in zip(candidates, views, strict=True)]
    norms = np.array([t[3] for t in terms])
    if dots is None:
        dots = np.array([float(v[0][feature] @ prompt_unit) for v in views])
    return w.cosines(prompt_unit, dots / np.where(norms > 0, norms, 1.0), terms), norms


def evidence_prior(n_samples: Any) -> np.ndarray:
    """``√(n_s / (n_s + κ))`` per task (``n_s`` at least 1), the ranking's minimum-evidence prior: ×0.93 at 24
    samples, ×0.45 for one."""
    ns = np.maximum(np.asarray(n_samples, dtype=np.float64), 1.0)
    return np.asarray(np.sqrt(ns / (ns + PRIOR_SAMPLES)))


def lexical_prior(n_samples: Any) -> np.ndarray:
    """``n_s / (n_s + κ)`` per task, the weight of its lexical score (:func:`atlas.lexical.hybrid_key`): the
    :func:`evidence_prior` squared, as much as the Fisher ranking is shrunk in all (its denominator's prior and the
    ranking's, each ``√(n_s / (n_s + κ))``): ×0.43 at three samples, ×0.91 at 40. A profile of a few short samples
    has so few terms that each shared word weighs more in its cosine than in a large task's; shrunk by
    :func:`evidence_prior` alone, three questions of one class took other classes' questions on a word or two (a
    generalisation audit, 2026-12-07; docs/SCORES.md, "Lexical evidence")."""
    return np.asarray(evidence_prior(n_samples) ** 2)


def _n_samples(candidates: Sequence[Candidate]) -> np.ndarray:
    """The candidates' sample counts (at least 1), shape (T,)."""
    return np.array([max(int(getattr(c.state, "n_samples", 1) or 1), 1) for c in candidates], dtype=np.float64)


def size_shrink(norms: np.ndarray, dens: np.ndarray, n_samples: np.ndarray) -> np.ndarray:
    """``min(‖μ_t‖ / den_t, 1) · √(n_s / (n_s + κ))`` per task, shape (T,): the ranking's shrink for a task's
    size and noise (0 where the task has no norm or denominator)."""
    norms, dens = np.asarray(norms, dtype=np.float64), np.asarray(dens, dtype=np.float64)
    ok = (norms > 0) & (dens > 0)
    shrink = np.minimum(norms / np.where(ok, dens, 1.0), 1.0) * evidence_prior(n_samples)
    return np.asarray(np.where(ok, shrink, 0.0))


def rank_scores(prompt_means: np.ndarray, candidates: Sequence[Candidate], views: Sequence[Any],
                whitening: SpaceWhitening) -> np.ndarray:
    """Ranking scores in [−1, 1], shape (len(candidates),): whitened cosines shrunk for the task's size
    and noise, as a margin over the task's typical held-out score.

    ``(c_t · ‖μ_t‖ / den_t · √(n_s / (n_s + κ)) − λ g_t) / (1 + λ)`` with
    ``c_t = ½ (cos(f_ae(p̂_ae), f_ae(μ̂_ae,t)) + cos(f_e(p̂_e), f_e(μ̂_e,t)))``, ``f_ae``, ``f_e`` the space's
    :class:`atlas.whitening.SpaceWhitening` of the ``ae`` signature and of the error feature (the ``ae``
    term alone when the space has no error transform). ``‖μ_t‖ / den_t`` is the route score's own
    shrink (its minimum-evidence prior and noise term), and whitening, which amplifies the quiet
    directions where a small task's noise lives, takes the prior ``κ = PRIOR_SAMPLES`` once more, so a
    task of a few samples cannot take other tasks' prompts by its noise. ``g_t`` is the task's
    :func:`typical_score` and ``λ = RANK_TYPICAL_WEIGHT``: a task whose own prompts score high against
    it (a tight, templated task) must be matched closer than a loose one. A task with no held-out score
    is held to ``TYPICAL_PRIOR`` if it has one sample (none could be held out), else to the space's
    ``typical`` (its calibration is missing: a task stored before calibration existed).
    ``prompt_means`` (3, m) are the prompt's pooled feature means; a task's norms and whitened terms are
    memoised on the transforms.
    """
    return rank_parts(prompt_means, candidates, views, whitening)[1]


def rank_parts(prompt_means: np.ndarray, candidates: Sequence[Candidate], views: Sequence[Any],
               whitening: SpaceWhitening, ae_dots: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(shrunk cosine c_t · ‖μ_t‖ / den_t · √(n_s / (n_s + κ)), rank score)`` of :func:`rank_scores`,
    shapes (T,), (T,); both −1 where the task has no norm. ``ae_dots`` (T,): the re-rank's ``⟨p̂, μ_t⟩``
    (computed here when not given)."""
    cos, norms = _whitened_cosines(whitening.ae, _unit(prompt_means[0]), candidates, views, 0, ae_dots)
    if whitening.error is not None:
        cos_e, _ = _whitened_cosines(whitening.error, _unit(prompt_means[2]), candidates, views, 2)
        cos = (cos + cos_e) / 2.0
    dens = np.array([float(v[2]) for v in views])
    ns = _n_samples(candidates)
    ok = (norms > 0) & (dens > 0)
    shrunk = cos * size_shrink(norms, dens, ns)
    typical = np.array([float(c.typical) if c.typical is not None else
                        (whitening.typical if n > 1 else TYPICAL_PRIOR) for c, n in zip(candidates, ns, strict=True)])
    rank = (shrunk - RANK_TYPICAL_WEIGHT * typical) / (1.0 + RANK_TYPICAL_WEIGHT)
    return np.asarray(np.where(ok, shrunk, -1.0)), np.asarray(np.where(ok, rank, -1.0))


def unwhitened_rank(scores: np.ndarray, candidates: Sequence[Candidate]) -> np.ndarray:
    """Ranking scores of a space too small to whiten, shape (T,): route ``scores`` (T,) times the ranking's
    evidence prior ``√(n_s / (n_s + κ))`` (×0.93 at 24 samples, ×0.45 for one sample, whose score is a raw
    cosine to that sample), so a task of a few samples cannot take other tasks' prompts at noise level."""
    return np.asarray(np.asarray(scores, dtype=np.float64) * evidence_prior(_n_samples(candidates)))


def rerank_route(
    prompt_state: Any, candidates: Sequence[Candidate], *, k: int, threshold: float, per_task: bool = False,
    whitening: SpaceWhitening | None = None, prompt_terms: lexical.TermCounts | None = None,
    novelty: SpaceNovelty | None = None, prompt_vector: np.ndarray | None = None,
) -> RouteAnswer:
    """Exact re-rank of ANN candidates for one prompt.

    Parameters
    ----------
    prompt_state : fishersketch.SketchState
        State of the prompt (all its next-token positions).
    candidates
        Candidate tasks with their stored states (same space as the prompt).
    k
        Matches to return.
    threshold
        Open-set threshold: ``none`` is true when there is no candidate or the best score is below it.
    per_task
        When true, ``threshold`` is only the default: a candidate's own ``threshold`` wins.
    whitening : atlas.whitening.SpaceWhitening, optional
        The space's ranking transforms: matches are then ordered by :func:`rank_scores` (reported as
        ``rank_score``); without them (a space too small to whiten) by :func:`unwhitened_rank`. The
        open-set decision compares the best match's route ``score`` with its calibrated threshold.
        The typical-score term can move the answer from the task nearest to the prompt to a looser one
        (a lower threshold): the prompt must then also pass the nearest task's threshold (the task with
        the highest shrunk whitened cosine, :func:`rank_parts`, when its route score is at least the answered
        task's: nearer by both scores), else ``none``, with ``nearest_rejects`` set and at least that task's
        confidence in the rejection. (A task nearest by the whitened cosine alone — a sports text "nearest" a
        SMILES task it scored 0.003 against — rejected prompts its answered task held well above threshold.)
    prompt_terms : atlas.lexical.TermCounts, optional
        The prompt's terms: when given and every candidate has ``terms``, matches are ordered by the hybrid
        :func:`atlas.lexical.fuse` of the ranking score and the lexical score (reported as ``lexical``); and
        when the answered task's template is active and the prompt lacks one of its terms, ``none``, with
        ``template_rejects`` set and at least the template's confidence (:mod:`atlas.template`).
    novelty, prompt_vector : atlas.novelty.SpaceNovelty and ndarray of shape (r,), optional
        The space's novelty model and the prompt's novelty vector: with ``per_task``, when the prompt's mean
        hidden state lies farther from the answered task's samples than its threshold (the ``1 − rate``
        quantile of the task's own cross-fitted distances), ``none``, with ``novelty_rejects`` set and the
        share of the task's own samples nearer than the prompt as the confidence (:mod:`atlas.novelty`). A task
        with a novelty test spends half its false-reject rate on it and half on its route threshold (calibrated
        at half the rate: ``split_threshold``, reported as the match's ``threshold``); an override is kept. A
        task whose ``novelty_test`` is off is routed as one without a test (its full-rate threshold).

    A prompt *short* for the answered task (under three quarters of the token positions of three in four of its
    samples: ``Candidate.length_views``) is judged by neither the novelty nor the template test — a prefix of a
    sample lacks its closing frame and its mean hidden state is atypical — but by the route threshold of the task's
    held-out views nearest its length, at the task's full rate, when that is lower than the threshold it holds whole
    prompts to — moved by the task's override as far as the override moves the threshold of its whole prompts
    (:func:`prompt_threshold`, ``RouteMatch.length_matched``, ``Rejection.length_matched``); the nearest task's
    threshold is matched to the prompt's length the same way.

    Returns
    -------
    RouteAnswer
        Matches sorted by the hybrid score when lexical evidence is used, else by ``rank_score`` (descending); ties
        by ``rank_score``, route score, FAISS score, then task name (unique in a space, so a space and its imported
        copy answer alike). Each
        match carries the prompt-task ``activation`` and ``error`` cosines, computed exactly as the
        pooled point estimates of ``fishersketch.align`` (cross kernel mean clamped at 1e-10 over the
        root of both unbiased self-similarities — an absolute floor here, where ``align``'s is relative to each
        task's feature scale: the extractor's own features, softmax-minus-one-hot errors and hidden states, are far
        above it; 0 when a self-similarity is not positive — a short
        prompt's own error self-similarity is often too noisy to estimate, then ``error`` is 0).
    """
    if not candidates:
        return RouteAnswer(matches=[], none=True, best_score=None, threshold=threshold)
    mu_p, self_p, _ = state_view(prompt_state)
    unit = _unit(mu_p[0])
    views = [c.view if c.view is not None and len(c.view) == 3 else state_view(c.state) for c in candidates]
    den = np.array([v[2] for v in views])
    dots = np.array([float(v[0][0] @ unit) for v in views])
    score = clipped_scores(dots, den)
    faiss = np.array([_f(c.faiss_score) for c in candidates])
    if whitening is not None:
        near, rank = rank_parts(mu_p, candidates, views, whitening, dots)
    else:  # the route score, taken at the ranking's evidence prior once more (see unwhitened_rank)
        near, rank = None, unwhitened_rank(score, candidates)
    lex, key = None, rank
    if prompt_terms is not None and all(c.terms is not None for c in candidates):
        key, lex = lexical.hybrid_key(rank, prompt_terms, [c.terms for c in candidates],
                                      lexical_prior(_n_samples(candidates)))
    order = sorted(range(len(candidates)),
                   key=lambda i: (-round(_f(key[i]), 9), -round(_f(rank[i]), 9), -round(_f(score[i]), 9),
                                  -round(float(faiss[i]), 6), candidates[i].name))[:k]
    first = candidates[order[0]]
    n_prompt = int(prompt_state.n_tokens)
    _, novelty_rate = split_rates(first.false_reject_rate if first.false_reject_rate is not None
                                  else FALSE_REJECT_RATE)
    # The thresholds' promises hold for prompts like the task's samples. A prompt short for the task (a prefix of a
    # sample lacks its closing frame; its mean hidden state lies farther from the samples: bench 4f) is held to the
    # route threshold of the task's held-out views nearest its length, at the full rate, and to neither the novelty
    # nor the template test.
    short_first = first.length_views is not None and first.length_views.short(n_prompt)
    novel, dist, dist_thr = (novelty.rejects(prompt_vector, first.task_id, novelty_rate)
                             if novelty is not None and per_task and first.novelty_test and not short_first
                             else (False, None, None))
    # A task with a novelty test spends NOVELTY_SHARE (half) of its false-reject budget on it and the rest on its
    # route threshold (split_threshold, calibrated at that rest); an override (a user's or fit's) is kept as it is.
    split = dist is not None and not first.overridden and first.split_threshold is not None

    def tested(c: Candidate) -> Callable[[], bool]:
        """Whether the task's novelty test applies to its whole prompts, asked only for a prompt short for it (an
        override of a short prompt's threshold is measured from what whole prompts are held to:
        :func:`prompt_threshold`); the novelty model may load the task's vectors to tell."""
        return lambda: bool(per_task and novelty is not None and c.novelty_test and c.split_threshold is not None
                            and novelty.tested(c.task_id, split_rates(c.false_reject_rate if c.false_reject_rate
                                                                      is not None else FALSE_REJECT_RATE)[1]))

    top = []
    for i in order:
        mu_t, self_t, _ = views[i]
        diag = []
        for f in (1, 2):  # activation, error: the pooled cosines of fishersketch.align
            if self_t[f] > _EPS and self_p[f] > _EPS:
                diag.append(max(float(mu_t[f] @ mu_p[f]), _EPS) / math.sqrt(self_t[f] * self_p[f]))
            else:
                diag.append(0.0)
        c = candidates[i]
        thr, drop = prompt_threshold(c, n_prompt, threshold, per_task, split=split and i == order[0],
                                     tested=tested(c))
        sc = _f(score[i])
        top.append(RouteMatch(task_id=c.task_id, name=c.name, score=sc, faiss_score=_f(faiss[i]),
                              activation=min(_f(diag[0]), 1.0), error=min(_f(diag[1]), 1.0),
                              threshold=float(thr), confidence=confidence(sc, thr, c.scale),
                              rank_score=_f(rank[i]), lexical=None if lex is None else _f(lex[i]),
                              length_drop=drop))
    best = top[0]
    none = best.score < best.threshold
    conf = 1.0 - best.confidence if none else best.confidence

    def rejection(c: Candidate, score: float, thr: float, reason: str, by_length: bool = False) -> Rejection:
        n = int(c.state.n_samples)
        return Rejection(c.task_id, c.name, score, thr, reason, n_prompt, c.state.n_tokens / n if n else None,
                         length_matched=by_length, overridden=c.overridden and per_task)

    by = rejection(candidates[order[0]], best.score, best.threshold, "threshold", best.length_matched) if none else None
    rejects = False
    if near is not None:
        rounded = np.round(near, 9)  # a tie with the answered task is the answered task (identical twins)
        j = order[0] if rounded[order[0]] >= rounded.max() else int(np.argmax(rounded))
        held_j = prompt_threshold(candidates[j], n_prompt, threshold, per_task, tested=tested(candidates[j]))
        thr_j = held_j.threshold
        rejects = (candidates[j].task_id != best.task_id and _f(score[j]) >= best.score  # nearer by both scores
                   and _f(score[j]) < thr_j)
        if rejects:
            conf = max(conf if none else 0.0, 1.0 - confidence(_f(score[j]), thr_j, candidates[j].scale))
            none = True
            by = by or rejection(candidates[j], _f(score[j]), thr_j, "nearest", held_j.length_matched)
    fired = ["nearest"] if rejects else []  # the rules besides the threshold that reject the prompt
    if novel and novelty is not None and dist is not None and dist_thr is not None:
        conf, none = max(conf if none else 0.0, novelty.nearer_share(first.task_id, dist)), True
        by = by or rejection(first, dist, dist_thr, "novelty")
        fired.append("novelty")
    tpl = candidates[order[0]].template
    lacks = prompt_terms is not None and tpl is not None and tpl.missing(prompt_terms) > 0 and not short_first
    if lacks and tpl is not None:
        conf, none = max(conf if none else 0.0, 1.0 - tpl.false_reject), True
        by = by or rejection(candidates[order[0]], best.score, best.threshold, "template")
        fired.append("template")
    if by is not None:  # the deciding rule alone does not make "none": name the others that reject it too
        by = dataclasses.replace(by, also=tuple(r for r in fired if r != by.reason))
    return RouteAnswer(matches=top, none=none, best_score=best.score, threshold=best.threshold, confidence=conf,
                       nearest_rejects=rejects, template_rejects=lacks, novelty_rejects=novel, rejected_by=by)


