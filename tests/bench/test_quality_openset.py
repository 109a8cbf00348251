"""The open-set and small-task protocols of experiment 4b (``bench.quality.openset``) on synthetic score matrices."""

from __future__ import annotations

import numpy as np

from atlas import routing
from bench.quality import openset_completion
from bench.quality.openset_small_tasks import small_tasks
from bench.quality.openset_unseen import _fit_global, open_set


def _world(separation: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[routing.Calibration]]:
    """20 tasks × 10 prompts; own-task score ``0.3 + separation``, others ~0.3 (noise 0.02)."""
    rng = np.random.default_rng(seed)
    T, per = 20, 10
    truth = np.repeat(np.arange(T), per)
    S = 0.3 + 0.02 * rng.standard_normal((T * per, T))
    S[np.arange(T * per), truth] += separation
    cal = [routing.calibrate(0.3 + separation + 0.02 * rng.standard_normal(32)) for _ in range(T)]
    return S, truth, np.tile(np.arange(per), T), cal


def test_a_separable_world_answers_none_for_unseen_and_keeps_indexed() -> None:
    S, truth, rank, cal = _world(separation=0.3)
    res = open_set(S, S.copy(), truth, rank, cal, repeats=2, seed=0)
    auto = res["fs_auto"]
    assert auto["none_unseen"] == 1.0 and auto["auroc"] == 1.0
    assert auto["none_indexed"] <= 0.1 and auto["right_indexed"] >= 0.9
    assert res["fs_auto"]["runs"] == 4  # 2 draws × 2 cross-fitted halves


def test_a_ranking_answers_its_best_task_held_to_that_tasks_threshold() -> None:
    S, truth, rank, cal = _world(separation=0.3, seed=2)
    same = open_set(S, S.copy(), truth, rank, cal, repeats=2, seed=0, rank=lambda cols: (S, S))
    assert {k: v for k, v in same["fsw_auto"].items() if k != "auroc"} == \
        {k: v for k, v in same["fs_auto"].items() if k != "auroc"}  # ranking by the route score changes nothing
    flipped = -S  # a ranking that always answers the worst task: right answers vanish
    res = open_set(S, S.copy(), truth, rank, cal, repeats=2, seed=0, rank=lambda cols: (flipped, flipped))
    assert res["fsw_auto"]["right_indexed"] == 0.0 and res["fs_auto"]["right_indexed"] >= 0.9


def test_the_oracle_ceiling_holds_the_goal_false_none_rate_on_the_test_prompts() -> None:
    for separation, none_unseen in ((0.3, 1.0), (0.0, None)):
        S, truth, rank, cal = _world(separation=separation, seed=3)
        res = open_set(S, S.copy(), truth, rank, cal, repeats=2, seed=0, rank=lambda cols, S=S: (S, S))
        for key in ("fsw_oracle", "minilm_oracle"):
            assert abs(res[key]["none_indexed"] - 0.05) <= 0.02, res[key]  # its threshold is that quantile
            if none_unseen is not None:
                assert res[key]["none_unseen"] == none_unseen
            else:  # no separation: no single threshold rejects much more unseen than indexed
                assert res[key]["none_unseen"] <= 0.2


def test_a_template_the_unseen_prompts_lack_answers_them_none() -> None:
    S, truth, rank, cal = _world(separation=0.0, seed=4)  # scores cannot tell unseen prompts apart
    lacks = np.ones((len(truth), S.shape[1]), bool)
    lacks[np.arange(len(truth)), truth] = False  # each prompt has its own task's template only
    res = open_set(S, S.copy(), truth, rank, cal, repeats=2, seed=0, rank=lambda cols: (S, S),
                   hybrid=lambda ranked, cols: cols[np.argmax(ranked[:, cols], axis=1)], lacks=lacks)
    assert res["fsw_auto"]["none_unseen"] == 1.0 and res["fsw_fit"]["none_unseen"] == 1.0
    assert res["fsw_no_template"]["none_unseen"] <= 0.2
    assert res["fsw_auto"]["none_indexed"] > res["fsw_no_template"]["none_indexed"]  # wrong answers become none
    assert res["fsw_auto"]["right_indexed"] == res["fsw_no_template"]["right_indexed"]


def test_an_inseparable_world_has_chance_auroc() -> None:
    S, truth, rank, cal = _world(separation=0.0)
    res = open_set(S, S.copy(), truth, rank, cal, repeats=3, seed=1)
    assert 0.3 <= res["fs_auto"]["auroc"] <= 0.7


def test_fit_global_maximises_accuracy() -> None:
    best_score = np.array([0.9, 0.8, 0.2, 0.1])
    best = np.array([1, 2, 3, 4])
    labels = np.array([1, 2, -1, -1])  # the low-scoring two are "none"
    t = _fit_global(best_score, best, labels)
    assert 0.2 < t <= 0.8


def test_small_tasks_take_a_whole_refitted_ranking_matrix() -> None:
    truth = np.array([0, 0, 1, 1])
    S = np.array([[0.9, 0.1], [0.8, 0.2], [0.1, 0.9], [0.2, 0.7]])
    refit = {(1, 1): np.array([[0.1, 0.9], [0.9, 0.2], [0.1, 0.9], [0.2, 0.7]])}  # column 0 moved too
    rows = small_tasks(S, S, truth, {(1, 1): S[:, 1]}, {(1, 1): S[:, 1]}, S, refit)
    k1 = {r["score"]: r for r in rows if r["k"] == 1}
    assert k1["whitened ranking alone"]["taken"] == 1 and k1["route score"]["taken"] == 0


def test_small_tasks_count_captures_of_other_tasks_prompts() -> None:
    truth = np.array([0, 0, 1, 1])
    S = np.array([[0.9, 0.1], [0.8, 0.2], [0.1, 0.9], [0.2, 0.7]])
    strong = {(1, 1): np.array([0.95, 0.1, 0.9, 0.9])}  # takes one prompt of task 0
    weak = {(1, 1): np.array([0.0, 0.0, 0.9, 0.9])}
    rows = small_tasks(S, S, truth, weak, strong)
    k1 = {r["score"]: r for r in rows if r["k"] == 1}
    assert k1["route score"]["taken"] == 0 and k1["route score"]["own"] == 2
    assert k1["old score (no prior)"]["taken"] == 1 and k1["old score (no prior)"]["total"] == 2


def test_rank_matrix_is_the_products_ranking() -> None:
    """The benchmark's matrix form gives the ``rank_score`` that ``atlas.routing.rerank_route`` returns."""
    from atlas.whitening import WHITEN_MIN_TASKS, fit_space_whitening
    from bench.quality.route_matrices import rank_matrix
    from fishersketch import Sketcher, SketchSpec

    sk = Sketcher(SketchSpec(d=6, K=9, m=128, seed=4), chunk_rows=64)
    rng = np.random.default_rng(5)

    def state(n_samples: int, centre: np.ndarray) -> object:
        n = n_samples * 4
        return sk.sketch(centre[:6] + rng.standard_normal((n, 6)), centre[6:] + rng.standard_normal((n, 9)),
                         np.repeat(np.arange(n_samples), 4))

    centres = rng.standard_normal((WHITEN_MIN_TASKS + 3, 15))
    tasks = [state(int(rng.integers(1, 30)), c) for c in centres]
    prompts = [state(1, centres[i]) for i in range(0, len(centres), 5)]
    typical = rng.uniform(-0.5, 1.0, size=len(tasks))
    R = rank_matrix(prompts, tasks, np.arange(len(tasks)), typical)
    means = np.stack([routing.unit_means(s) for s in tasks])
    space = fit_space_whitening(means[:, 0], means[:, 1])
    cands = [routing.Candidate(i, f"t{i:03d}", s, typical=float(typical[i])) for i, s in enumerate(tasks)]
    for p, row in zip(prompts, R, strict=True):
        ans = routing.rerank_route(p, cands, k=len(cands), threshold=0.0, whitening=space)
        got = {m.task_id: m.rank_score for m in ans.matches}
        np.testing.assert_allclose([got[i] for i in range(len(tasks))], row, atol=1e-9)
        assert ans.matches[0].task_id == int(np.argmax(row))


def test_the_nearest_tasks_threshold_also_holds_the_answer() -> None:
    """When the ranking answers another task than the nearest one, the nearest task's threshold applies too."""
    S, truth, rank, cal = _world(separation=0.3, seed=3)
    res = open_set(S, S.copy(), truth, rank, cal, repeats=1, seed=0, rank=lambda cols: (S, S - 1.0))
    assert res["fsw_auto"]["none_unseen"] == res["fsw_alone"]["none_unseen"] == res["fs_auto"]["none_unseen"]
    loose = set(range(5))  # five loose tasks (threshold ~0): at least one of them is indexed in every draw
    cal = [routing.calibrate(0.02 * np.random.default_rng(t).standard_normal(32)) if t in loose else c
           for t, c in enumerate(cal)]

    def to_a_loose_task(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lifted = S.copy()
        lifted[:, next(c for c in cols if c in loose)] += 1.0  # the ranking answers it for every prompt
        return S, lifted

    res = open_set(S, S.copy(), truth, rank, cal, repeats=2, seed=0, rank=to_a_loose_task)
    alone, both = res["fsw_alone"], res["fsw_auto"]
    assert alone["none_unseen"] == 0.0  # the loose task accepts every prompt of the unseen tasks
    assert both["none_unseen"] >= 0.5  # their nearest indexed task rejects them unless it is a loose one too


def test_hybrid_best_is_the_products_rerank_with_terms() -> None:
    from atlas.lexical import TaskTerms, TermCounts
    from bench.quality.route_matrices import hybrid_best

    rng = np.random.default_rng(3)
    P, T = 12, 40
    rank = rng.uniform(-0.3, 0.3, (P, T))
    sig = rng.uniform(0, 1, (P, T))
    words = [f"topic{j} word{j} extra{j}" for j in range(T)]
    terms = [TaskTerms.of(TermCounts.from_texts([w] * 5)) for w in words]
    n = np.full(T, 50)
    cols = np.arange(T)
    no_words = [TermCounts.from_texts(["!"])] * P  # no lexical evidence: the ranking's best FAISS candidate
    cand = [cols[np.argsort(-sig[i], kind="stable")[:32]] for i in range(P)]
    want = [c[np.argmax(rank[i, c])] for i, c in enumerate(cand)]
    assert hybrid_best(rank, sig, no_words, terms, n, cols).tolist() == want
    # each prompt names one candidate's words: among 32 candidates that one wins
    target = [c[5] for c in cand]
    named = [TermCounts.from_texts([words[t]]) for t in target]
    got = hybrid_best(rank, sig, named, terms, n, cols)
    assert got.tolist() == target  # a lexical z-score of ~6 against a uniform ranking
    # a column outside the FAISS candidates is reached only through ``always``
    outside = [int(np.argsort(-sig[i], kind="stable")[-1]) for i in range(P)]
    named = [TermCounts.from_texts([words[t]]) for t in outside]
    assert not np.any(hybrid_best(rank, sig, named, terms, n, cols) == np.array(outside))
    got = hybrid_best(rank, sig, named, terms, n, cols, always=np.array(sorted(set(outside))))
    assert got.tolist() == outside


def test_landing_counts_the_most_frequent_wrong_answers_in_order() -> None:
    names = ["a", "b", "c", "d"]
    answered = np.array([2, 1, 2, 3, 2, 1])
    assert openset_completion.landing(answered, names) == [("c", 3), ("b", 2), ("d", 1)]
    assert openset_completion.landing(answered, names, top=1) == [("c", 3)]
    assert openset_completion.landing(np.array([], dtype=int), names) == []
    assert openset_completion.landing(np.array([3, 0]), names) == [("a", 1), ("d", 1)]  # ties by task order


def _novelty_world(seed: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """20 tasks' stored vectors (40 each, 6-d, apart by 4 σ along their own axis pair) and each prompt's vector
    (10 per task, drawn like its task's samples)."""
    rng = np.random.default_rng(seed)
    T, per, r = 20, 10, 6
    centres = 4.0 * rng.standard_normal((T, r))
    tasks = [c + rng.standard_normal((40, r)) for c in centres]
    truth = np.repeat(np.arange(T), per)
    prompts = centres[truth] + rng.standard_normal((T * per, r))
    return tasks, prompts, truth


def test_the_novelty_replay_rejects_unseen_prompts_and_keeps_each_tasks_rate() -> None:
    from atlas.route_calibration import FALSE_REJECT_RATE
    from bench.quality.novelty_vectors import novelty_rejects
    from bench.quality.openset_unseen import Novelty

    rng = np.random.default_rng(5)
    T, per = 20, 10
    truth, rank = np.repeat(np.arange(T), per), np.tile(np.arange(per), T)
    S = 0.3 + 0.005 * rng.standard_normal((T * per, T))
    S[np.arange(T * per), truth] = 0.62 + 0.005 * rng.standard_normal(T * per)
    # a sibling task scores each prompt a little below its own: above that sibling's threshold (0.57–0.59), so an
    # unseen task's prompts pass the route scores; only the vectors tell them apart
    S[np.arange(T * per), (truth + 1) % T] = 0.6
    cal = [routing.calibrate(0.62 + 0.02 * rng.standard_normal(32)) for _ in range(T)]
    tasks, prompts, vtruth = _novelty_world(seed=5)
    assert (vtruth == truth).all()
    half = FALSE_REJECT_RATE / 2
    split = np.array([routing.calibrate(c.scores, half).threshold for c in cal])

    def novelty(indexed: np.ndarray) -> Novelty:
        rejects, tested = novelty_rejects(tasks, prompts, indexed, half)
        assert tested[indexed].all() and not tested[np.setdiff1d(np.arange(len(tasks)), indexed)].any()
        return Novelty(rejects, tested, split)

    kw = {"rank": lambda cols: (S, S), "hybrid": lambda ranked, cols: cols[np.argmax(ranked[:, cols], axis=1)]}
    res = open_set(S, S.copy(), truth, rank, cal, repeats=3, seed=0, novelty=novelty, **kw)
    assert res["fsw_no_novelty"]["none_unseen"] <= 0.2  # without it: unseen prompts pass
    assert res["fsw_auto"]["none_unseen"] >= 0.9  # with it: far vectors are novel for whichever task answers
    assert res["fsw_auto"]["right_indexed"] >= 0.9 and res["fsw_no_novelty"]["right_indexed"] >= 0.95
    assert res["fsw_auto"]["none_indexed"] <= res["fsw_no_novelty"]["none_indexed"] + 0.1  # its 2.5 %, and noise
    assert res["fsw_fit"]["none_indexed"] <= res["fsw_auto"]["none_indexed"] + 0.05  # fit at half the rate
    assert res["fsw_fit"]["none_unseen"] >= res["fsw_auto"]["none_unseen"] - 0.05


def test_novelty_rejects_are_the_products_test() -> None:
    from atlas.novelty import SpaceNovelty
    from bench.quality.novelty_vectors import novelty_rejects

    tasks, prompts, _ = _novelty_world(seed=6)
    indexed = np.arange(0, 20, 2)
    rejects, tested = novelty_rejects(tasks, prompts, indexed, 0.05)
    model = SpaceNovelty.fit({int(t): tasks[int(t)] for t in indexed})
    assert model is not None
    for p in range(0, len(prompts), 7):
        for t in range(len(tasks)):
            assert rejects[p, t] == model.rejects(prompts[p], t, 0.05)[0]
    assert tested.sum() == len(indexed)


def test_fit_turns_off_the_tests_that_reject_a_tasks_own_prompts_as_the_product_does() -> None:
    """A template or novelty test that rejects every prompt of its task makes those prompts "none"; the replayed
    ``fit`` switches those tests off (the product's rules, atlas.route_fit), so they are answered again."""
    from atlas.route_calibration import FALSE_REJECT_RATE
    from bench.quality.openset_unseen import Novelty

    S, truth, rank, cal = _world(separation=0.3, seed=6)
    T = S.shape[1]
    broken_template, broken_novelty = np.arange(T) % 4 == 0, np.arange(T) % 4 == 1
    lacks = np.zeros((len(truth), T), bool)
    lacks[:, broken_template] = True
    split = np.array([routing.calibrate(c.scores, FALSE_REJECT_RATE / 2).threshold for c in cal])

    def novelty(indexed: np.ndarray) -> Novelty:
        rejects = np.zeros((len(truth), T), bool)
        rejects[:, broken_novelty] = True
        return Novelty(rejects, np.isin(np.arange(T), indexed), split)

    res = open_set(S, S.copy(), truth, rank, cal, repeats=2, seed=0, rank=lambda cols: (S, S),
                   hybrid=lambda ranked, cols: cols[np.argmax(ranked[:, cols], axis=1)], lacks=lacks, novelty=novelty)
    assert res["fsw_auto"]["none_indexed"] >= 0.4  # half the tasks answer none to all their own prompts
    assert res["fsw_fit"]["none_indexed"] <= 0.1 and res["fsw_fit"]["right_indexed"] >= 0.9  # switched off
    assert res["fsw_fit"]["none_unseen"] == res["fsw_auto"]["none_unseen"] == 1.0  # unseen still below thresholds
