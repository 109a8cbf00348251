"""Space whitening of the route ranking (atlas.whitening, docs/SCORES.md "Ranking").

Properties of the transform and its fast path, a synthetic space where a dominant common direction
defeats the plain cosine and whitening recovers the tasks, and the service path: a library space of
``WHITEN_MIN_TASKS`` tasks ranks by ``rank_score``, which follows deletes (the fit is re-done when the
index moves) and disappears below the minimum.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas import routing
from atlas.whitening import WHITEN_MIN_TASKS, fit_whitening
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
    big = [routing.Candidate(i, f"t{i}", _State(1000), 0.0, views[i]) for i in range(len(x))]
    small = [routing.Candidate(i, f"t{i}", _State(1), 0.0, views[i]) for i in range(len(x))]
    dots = x @ x[0]  # ⟨p̂, μ_t⟩ as the re-rank computes them
    r_big = routing.rank_scores(x[0], big, views, dots, w)
    r_small = routing.rank_scores(x[0], small, views, dots, w)
    assert int(np.argmax(r_big)) == 0 and r_big[0] > 0.99
    np.testing.assert_allclose(r_small, r_big * np.sqrt(1 / (1 + routing.PRIOR_SAMPLES)) /
                               np.sqrt(1000 / (1000 + routing.PRIOR_SAMPLES)), rtol=1e-9)


def _texts(topic: int, n: int, seed: int) -> list[str]:
    rng = random.Random(seed * 1000 + topic)
    words = [f"w{topic}x{j}" for j in range(6)] + ["the", "a", "of"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(n)]


def test_library_space_ranks_by_rank_score_from_the_minimum_and_refits_after_deletes(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=128, device="cpu") as atlas:
        for t in range(WHITEN_MIN_TASKS):
            atlas.add(f"topic{t}", _texts(t, 6, seed=1), progress=False)
        prompts = [_texts(t, 1, seed=2)[0] for t in range(0, WHITEN_MIN_TASKS, 4)]
        answers = atlas.route(prompts, k=5, threshold=-1.0)
        for a in answers:
            ranks = [m.rank_score for m in a.matches]
            assert all(r is not None and -1.0 <= r <= 1.0 for r in ranks), ranks
            assert ranks == sorted(ranks, reverse=True)  # ordered by the ranking score
        atlas.delete("topic1")  # the index moves on: the next route re-fits, now below the minimum
        after = atlas.route(prompts, k=5, threshold=-1.0)
        for a in after:
            assert all(m.rank_score is None for m in a.matches)
            scores = [m.score for m in a.matches]
            assert scores == sorted(scores, reverse=True)
            assert "topic1" not in {m.name for m in a.matches}
