"""Space whitening of the route ranking (atlas.whitening, docs/SCORES.md "Ranking").

Properties of the transform and its fast path, a synthetic space where a dominant common direction
defeats the plain cosine and whitening recovers the tasks, and the service path: a library space of
``WHITEN_MIN_TASKS`` tasks ranks by ``rank_score``, which follows deletes (the fit is re-done when the
index moves) and disappears below the minimum.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas import routing
from atlas.whitening import WHITEN_MIN_TASKS, SpaceWhitening, fit_space_whitening, fit_whitening
from fisher_atlas import Atlas


def _unit(x: np.ndarray) -> np.ndarray:
    return np.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True))


def _space(seed: int, tasks: int, m: int, common: float) -> tuple[np.ndarray, np.ndarray]:
    """Unit task means (T, m) sharing a common direction of weight ``common``, and their distinct parts."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=m)
    own = rng.normal(size=(tasks, m))
    return _unit(common * _unit(shared) + _unit(own) * 0.3), own


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), tasks=st.integers(WHITEN_MIN_TASKS, 48), m=st.sampled_from([64, 128]),
       common=st.floats(0.0, 10.0))
def test_fast_cosines_equal_the_direct_transform_and_stay_in_range(seed: int, tasks: int, m: int,
                                                                   common: float) -> None:
    x, _ = _space(seed, tasks, m, common)
    w = fit_whitening(x)
    assert w is not None
    rng = np.random.default_rng(seed + 1)
    p = _unit(rng.normal(size=m) + x[rng.integers(tasks)] * rng.uniform(0, 3))
    scale = rng.uniform(0.1, 5.0, size=tasks)  # the memoised terms take un-normalised means
    terms = [w.task_terms(i, object(), x[i] * scale[i]) for i in range(tasks)]
    fast = w.cosines(p, x @ p, terms)
    direct = w.apply(x) @ w.apply(p)
    np.testing.assert_allclose(fast, direct, atol=1e-9)
    assert np.all(np.abs(fast) <= 1.0)
    # whitened signatures of the fitted tasks are centred: their mean maps to ~0 before normalising
    assert np.allclose(((x - w.center) @ w.basis.T).mean(axis=0), 0.0, atol=1e-9)


def test_no_transform_below_the_minimum_number_of_tasks() -> None:
    x, _ = _space(0, WHITEN_MIN_TASKS - 1, 64, 1.0)
    assert fit_whitening(x) is None
    assert fit_whitening(np.vstack([x, x[:1] * 0.5 + 0.1])) is not None


def test_whitening_recovers_tasks_a_common_direction_hides() -> None:
    """A dominant shared direction and a few loud directions of between-task spread, in which prompts
    also vary; each task's own (quiet) direction is what identifies it."""
    rng = np.random.default_rng(3)
    m, tasks = 256, 40
    shared = _unit(rng.normal(size=m))
    loud = _unit(rng.normal(size=(4, m)))
    own = _unit(rng.normal(size=(tasks, m)))
    coef = rng.normal(size=(tasks, 4)) * 2.0
    means = _unit(6.0 * shared + coef @ loud + 0.4 * own)
    y = np.repeat(np.arange(tasks), 10)
    prompts = _unit(6.0 * shared + (coef[y] + rng.normal(size=(len(y), 4))) @ loud + 0.4 * own[y]
                    + 0.3 * _unit(rng.normal(size=(len(y), m))))
    plain = (prompts @ means.T).argmax(1)
    w = fit_whitening(means)
    assert w is not None
    whitened = (w.apply(prompts) @ w.apply(means).T).argmax(1)
    plain_acc, white_acc = float(np.mean(plain == y)), float(np.mean(whitened == y))
    assert white_acc >= 0.95 and white_acc > plain_acc + 0.2, (plain_acc, white_acc)  # measured 0.65 -> 0.99


def test_rank_scores_shrink_small_tasks() -> None:
    x, _ = _space(5, WHITEN_MIN_TASKS, 64, 1.0)
    w = fit_whitening(x)
    assert w is not None

    class _State:
        def __init__(self, n: int) -> None:
            self.n_samples = n

    views = [(np.stack([v, v, v]), np.ones(3), 1.0) for v in x]
    big = [routing.Candidate(i, f"t{i}", _State(1000), 0.0, views[i], typical=0.0) for i in range(len(x))]
    small = [routing.Candidate(i, f"t{i}", _State(1), 0.0, views[i], typical=0.0) for i in range(len(x))]
    space = SpaceWhitening(ae=w, error=w)
    prompt = np.stack([x[0], x[0], x[0]])
    r_big = routing.rank_scores(prompt, big, views, space)
    r_small = routing.rank_scores(prompt, small, views, space)
    assert int(np.argmax(r_big)) == 0 and r_big[0] * (1 + routing.RANK_TYPICAL_WEIGHT) > 0.99
    np.testing.assert_allclose(r_small, r_big * np.sqrt(1 / (1 + routing.PRIOR_SAMPLES)) /
                               np.sqrt(1000 / (1000 + routing.PRIOR_SAMPLES)), rtol=1e-9)


def test_rank_scores_average_the_whitened_ae_and_error_cosines() -> None:
    """The memoised per-task terms give what applying both transforms to whole vectors gives."""
    rng = np.random.default_rng(3)
    ae, _ = _space(6, WHITEN_MIN_TASKS + 8, 96, 1.0)
    err = rng.normal(size=ae.shape) + 2.0 * rng.normal(size=(1, ae.shape[1]))  # error means: a common direction
    err /= np.linalg.norm(err, axis=1, keepdims=True)
    space = fit_space_whitening(ae, err)
    assert space is not None and space.error is not None
    scale = rng.uniform(0.5, 3.0, size=len(ae))  # task means are not unit: only their directions count

    class _State:
        n_samples = 10_000

    views = [(np.stack([a * c, a * c, e * c]), np.ones(3), float(c)) for a, e, c in zip(ae, err, scale, strict=True)]
    typical = rng.uniform(-0.2, 0.8, size=len(ae))
    cands = [routing.Candidate(i, f"t{i}", _State(), 0.0, views[i], typical=float(typical[i])) for i in range(len(ae))]
    p_ae, p_err = ae[3] + 0.02 * rng.normal(size=ae.shape[1]), err[3] + 0.02 * rng.normal(size=ae.shape[1])
    got = routing.rank_scores(np.stack([p_ae * 2.0, p_ae, p_err * 5.0]), cands, views, space)
    want = (space.ae.apply(_unit(p_ae)) @ space.ae.apply(ae).T
            + space.error.apply(_unit(p_err)) @ space.error.apply(err).T) / 2
    lam = routing.RANK_TYPICAL_WEIGHT
    shrunk = want * np.sqrt(10_000 / (10_000 + routing.PRIOR_SAMPLES))
    np.testing.assert_allclose(got, (shrunk - lam * typical) / (1 + lam), atol=1e-9)
    assert np.all(np.abs(got) <= 1.0)
    tight = [replace(c, typical=1.0) if c.task_id == 3 else c for c in cands]  # its own prompts score ~1
    assert routing.rank_scores(np.stack([p_ae, p_ae, p_err]), tight, views, space)[3] < got[3]


def test_a_task_without_calibration_is_held_to_the_prior_or_to_the_space_median() -> None:
    """One sample (nothing could be held out): ``TYPICAL_PRIOR``; more (calibration missing, e.g. a task
    stored before calibration existed): the median typical score of the space's calibrated tasks."""
    x, _ = _space(7, WHITEN_MIN_TASKS + 4, 64, 1.0)
    typicals = np.linspace(0.1, 0.5, len(x))
    typicals[:3] = np.nan
    space = fit_space_whitening(x, x[::-1].copy(), typicals=typicals)
    assert space is not None and space.typical == pytest.approx(float(np.median(typicals[3:])))
    assert fit_space_whitening(x, x[::-1].copy()).typical == 0.0  # nothing calibrated: no offset

    class _State:
        def __init__(self, n: int) -> None:
            self.n_samples = n

    views = [(np.stack([v, v, w]), np.ones(3), 1.0) for v, w in zip(x, x[::-1], strict=True)]
    prompt = np.stack([x[0], x[0], x[-1]])
    lam = routing.RANK_TYPICAL_WEIGHT

    def rank(n: int, typical: float | None) -> float:
        return float(routing.rank_scores(prompt, [routing.Candidate(0, "t", _State(n), 0.0, views[0], typical=typical)],
                                         [views[0]], space)[0])

    assert rank(1, None) == pytest.approx(rank(1, routing.TYPICAL_PRIOR))
    assert rank(50, None) == pytest.approx(rank(50, space.typical))
    assert rank(50, 0.2) - rank(50, 0.4) == pytest.approx(0.2 * lam / (1 + lam))


@settings(max_examples=100, deadline=None)
@given(scores=st.lists(st.floats(-1.0, 1.0), max_size=300))
def test_typical_score_is_a_shrunk_mean_in_range(scores: list[float]) -> None:
    g = routing.typical_score(scores)
    assert -1.0 <= g <= 1.0
    kept = scores[-routing.MAX_CAL_SCORES:]
    k = routing.PRIOR_SAMPLES
    assert g == pytest.approx((sum(kept) + k * routing.TYPICAL_PRIOR) / (len(kept) + k), abs=1e-9)
    if kept:  # between the scores' mean and the prior: evidence moves it, never past the mean
        lo, hi = sorted((float(np.mean(kept)), routing.TYPICAL_PRIOR))
        assert lo - 1e-9 <= g <= hi + 1e-9
    else:
        assert g == routing.TYPICAL_PRIOR


def _texts(topic: int, n: int, seed: int) -> list[str]:
    rng = random.Random(seed * 1000 + topic)
    words = [f"w{topic}x{j}" for j in range(6)] + ["the", "a", "of"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(n)]


def _legacy_task_stays_routable(atlas: Atlas, prompt: str, before: routing.RouteAnswer) -> None:
    """A task whose calibration is missing (its routing row gone, as for a task stored before calibration
    existed) is held to the space's median typical score, not to the 1-sample prior."""
    from sqlalchemy import delete

    from atlas.models import TaskRouting

    best = before.matches[0]
    task_id = best.task_id
    g_old = atlas._c.thresholds.info(task_id)["typical_score"]
    with atlas._c.store.session() as session:
        session.execute(delete(TaskRouting).where(TaskRouting.task_id == task_id))
    after = atlas.route(prompt, k=5, threshold=-1.0)
    assert isinstance(after, routing.RouteAnswer)
    moved = next(m for m in after.matches if m.task_id == task_id)
    lam = routing.RANK_TYPICAL_WEIGHT
    held_to_prior = best.rank_score - lam * (routing.TYPICAL_PRIOR - g_old) / (1 + lam)
    assert moved.rank_score > held_to_prior + 1e-9
    assert after.matches[0].task_id == task_id  # still the answer


def test_library_space_ranks_by_rank_score_from_the_minimum_and_refits_after_deletes(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    # the Fisher ranking alone (route_lexical=False); its fusion with lexical evidence: the next test
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=128, device="cpu",
               route_lexical=False) as atlas:
        for t in range(WHITEN_MIN_TASKS):
            atlas.add(f"topic{t}", _texts(t, 6, seed=1), progress=False)
        prompts = [_texts(t, 1, seed=2)[0] for t in range(0, WHITEN_MIN_TASKS, 4)]
        answers = atlas.route(prompts, k=5, threshold=-1.0)
        for a in answers:
            ranks = [m.rank_score for m in a.matches]
            assert all(r is not None and -1.0 <= r <= 1.0 for r in ranks), ranks
            assert ranks == sorted(ranks, reverse=True)  # ordered by the ranking score
        _legacy_task_stays_routable(atlas, prompts[0], answers[0])
        atlas.delete("topic1")  # the index moves on: the next route re-fits, now below the minimum
        after = atlas.route(prompts, k=5, threshold=-1.0)
        shrink = math.sqrt(6 / (6 + routing.PRIOR_SAMPLES))  # every task has 6 samples
        for a in after:  # unwhitened: the route score at the evidence prior, the same order as the score
            assert all(m.rank_score == pytest.approx(m.score * shrink, abs=1e-9) for m in a.matches)
            scores = [m.score for m in a.matches]
            assert scores == sorted(scores, reverse=True)
            assert "topic1" not in {m.name for m in a.matches}


def test_library_routes_by_the_hybrid_of_ranking_and_stored_terms(tmp_path: Path, tiny_model_dir: Path) -> None:
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=128, device="cpu") as atlas:
        for t in range(WHITEN_MIN_TASKS):
            atlas.add(f"topic{t}", _texts(t, 6, seed=1), progress=False)
        prompts = [_texts(t, 1, seed=2)[0] for t in range(WHITEN_MIN_TASKS)]
        answers = atlas.route(prompts, k=3, threshold=-1.0)
        for t, a in enumerate(answers):
            assert all(m.lexical is not None and 0.0 <= m.lexical <= 1.0 for m in a.matches)
            assert a.matches[0].name == f"topic{t}"  # (route_lexical=False: 15 of 16 on this run)
            assert a.matches[0].lexical == max(m.lexical for m in a.matches)


def test_a_large_space_is_refitted_in_the_background_after_a_change(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A space at the cache's size limit (lowered here to 1 task) is answered with its fit of before right after a
    change, and with the re-fit once the background re-fit has read the store (a scale review found the route that
    found the fit stale waiting 0.4–1.2 s for the re-fit with 2,000 tasks)."""
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=128, device="cpu",
               route_lexical=False) as atlas:
        for t in range(WHITEN_MIN_TASKS + 1):
            atlas.add(f"topic{t}", _texts(t, 6, seed=1), progress=False)
        queries = atlas._container.queries
        assert queries is not None
        queries.whitenings.max_tasks, queries.whitenings.refit_s = 1, 0.0
        prompt = _texts(0, 1, seed=2)[0]

        def ranks() -> dict[str, float]:
            answer = atlas.route(prompt, k=WHITEN_MIN_TASKS + 1, threshold=-1.0)
            assert isinstance(answer, routing.RouteAnswer)
            return {m.name: float(m.rank_score) for m in answer.matches if m.rank_score is not None}

        before = ranks()
        atlas.delete(f"topic{WHITEN_MIN_TASKS}")
        stale = ranks()  # served at once by the fit of before; the re-fit starts in the background
        assert f"topic{WHITEN_MIN_TASKS}" not in stale
        assert all(stale[n] == pytest.approx(before[n], abs=1e-12) for n in stale)
        queries.wait_refits(30)
        fresh = ranks()
        assert set(fresh) == set(stale)
        assert max(abs(fresh[n] - stale[n]) for n in fresh) > 1e-6  # the transform of the 16 tasks left
