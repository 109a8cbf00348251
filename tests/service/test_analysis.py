"""``atlas.analysis``: the pure query logic, on real FisherSketch states of synthetic tasks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas import analysis
from fishersketch import Sketcher, SketchSpec, SketchState, align, align_matrix
from fishersketch.synthetic import make_tasks

D, K, M = 12, 40, 512


@pytest.fixture(scope="module")
def tasks() -> list[analysis.TaskState]:
    spec = SketchSpec(d=D, K=K, m=M, seed=3)
    sk = Sketcher(spec)
    out = []
    for i, t in enumerate(make_tasks(6, 600, D, K, seed=5)):
        st = SketchState.empty(spec)
        sk.update(st, t.a, t.e, t.sample_ids)
        out.append(analysis.TaskState(i + 1, f"task{i + 1}", st))
    return out


def _sub(state: SketchState, n: int, seed: int) -> SketchState:
    """A small state from the same distribution (first n tokens of a re-drawn task)."""
    spec = state.spec
    t = make_tasks(6, 600, D, K, seed=5)[seed]
    st = SketchState.empty(spec)
    Sketcher(spec).update(st, t.a[:n], t.e[:n], t.sample_ids[:n])
    return st


def test_self_similarity_matches_the_estimator(tasks) -> None:
    a, b = tasks[0].state, tasks[1].state
    mr = align_matrix([a, b])
    assert analysis.self_similarity(a) == pytest.approx(mr.s_ae[0, 0], rel=1e-9)
    assert analysis.self_similarity(b, "a") == pytest.approx(mr.s_a[1, 1], rel=1e-9)
    assert analysis.self_similarity(SketchState.empty(a.spec)) == 0.0


def test_route_ranks_like_fisher_alignment_and_finds_the_source(tasks) -> None:
    prompt = _sub(tasks[2].state, 60, 2)
    cands = [analysis.Candidate(t.task_id, t.name, t.state, float(prompt.signature() @ t.state.signature()))
             for t in tasks]
    ans = analysis.rerank_route(prompt, cands, k=3, threshold=0.0)
    assert ans.matches[0].task_id == 3 and len(ans.matches) == 3 and not ans.none
    fisher = {t.task_id: align(prompt, t.state).fisher for t in tasks}
    by_fisher = sorted(fisher, key=lambda i: -fisher[i])[:3]
    if all(fisher[i] > 0 for i in by_fisher):
        assert [m.task_id for m in ans.matches] == by_fisher
    assert analysis.rerank_route(prompt, cands, k=3, threshold=ans.best_score + 1e-6).none
    empty = analysis.rerank_route(prompt, [], k=3, threshold=0.0)
    assert empty.none and empty.matches == [] and empty.best_score is None


def test_recommendation_is_sorted_by_shrunk_alignment_and_excludes_the_target(tasks) -> None:
    out = analysis.recommend_sources(tasks[0], tasks, k=4)
    assert len(out) == 4 and all(s.task_id != 1 for s in out)
    shrunk = [s.factors.fisher_shrunk for s in out]
    assert shrunk == sorted(shrunk, reverse=True)
    mr = align_matrix([t.state for t in tasks])
    j = out[0].task_id - 1
    assert out[0].factors.fisher == pytest.approx(mr.fisher[0, j])
    assert out[0].factors.fisher_shrunk == pytest.approx(mr.fisher_eb[0, j])
    assert analysis.recommend_sources(tasks[0], [tasks[0]], k=3) == []


def test_pair_factors_match_align(tasks) -> None:
    f = analysis.pair_factors(tasks[0], tasks[1], tasks[2:])
    r = align(tasks[0].state, tasks[1].state)
    assert (f.fisher, f.activation, f.error, f.rho, f.se, f.chi) == pytest.approx(
        (r.fisher, r.activation, r.error, r.rho, r.se, r.chi))
    assert f.activation_dark == analysis.is_activation_dark(r.activation, r.fisher)


def _orthogonal_error_pair() -> tuple[analysis.TaskState, analysis.TaskState]:
    """Two tasks with alike activations whose error gradients live on different vocabulary rows: the error
    factor, hence the proxy, is near 0 and ρ = fisher / proxy hits its bound."""
    rng = np.random.default_rng(0)
    n = 40
    spec = SketchSpec(d=6, K=9, m=512, seed=5, error_projection="dense")
    out = []
    for task_id, row in ((1, 0), (2, 1)):
        e = np.zeros((n, 9))
        e[:, row] = 1.0 + 0.1 * rng.standard_normal(n)
        st = SketchState.empty(spec)
        Sketcher(spec).update(st, rng.standard_normal((n, 6)) + 1.0, e, np.arange(n) + task_id * n)
        out.append(analysis.TaskState(task_id, f"t{task_id}", st))
    return out[0], out[1]


def test_pair_flags_reach_the_factors(tasks) -> None:
    a, b = _orthogonal_error_pair()
    f = analysis.pair_factors(a, b)
    assert f.flags == align(a.state, b.state).flags and "rho_bounded" in f.flags
    assert np.isfinite(f.rho) and f.rho in (100.0, 0.01)
    (src,) = analysis.recommend_sources(a, [b], k=1)
    assert "rho_bounded" in src.factors.flags
    same = analysis.pair_factors(tasks[0], tasks[0])
    assert "identical" in same.flags and same.rho == 1.0
    plain = analysis.pair_factors(tasks[0], tasks[1], tasks[2:])
    assert plain.flags == align(tasks[0].state, tasks[1].state).flags
    assert "rho_bounded" not in plain.flags
    assert plain.se is not None and plain.se >= 0


def test_se_is_null_where_the_split_half_is_unavailable(tasks) -> None:
    """A task too small for two split halves has no standard error: ``se`` is null (the schema's "null if not
    estimable"), not 0, on the pair factors and on its recommendation rows."""
    small = analysis.TaskState(99, "small", _sub(tasks[0].state, 3, 0))
    f = analysis.pair_factors(tasks[1], small, tasks[2:])
    assert "split_half_unavailable" in f.flags and f.se is None
    rows = analysis.recommend_sources(tasks[1], [small, *tasks[2:]], k=6)
    for r in rows:
        assert (r.factors.se is None) == ("split_half_unavailable" in r.factors.flags), r


def test_activation_dark_rule() -> None:
    assert analysis.is_activation_dark(0.9, 0.1)
    assert analysis.is_activation_dark(0.8, 0.3)
    assert not analysis.is_activation_dark(0.79, 0.1)
    assert not analysis.is_activation_dark(0.95, 0.31)


def test_atlas_is_deterministic_and_sign_fixed(tasks) -> None:
    m1 = analysis.atlas_layout(tasks)
    m2 = analysis.atlas_layout(list(tasks))
    assert m1 == m2 and len(m1.points) == 6
    assert m1.n_clusters == analysis.cluster_count(1.0 - analysis.alignment_matrix(tasks).fisher) >= 1
    xs = np.array([p.x for p in m1.points])
    assert xs[np.argmax(np.abs(xs))] > 0  # sign convention
    # distances in the plane follow the alignment: the most aligned pair is closer than the least
    mats = analysis.alignment_matrix(tasks)
    a = mats.fisher + np.eye(6) * -10
    i, j = np.unravel_index(np.argmax(a), a.shape)
    b = mats.fisher + np.eye(6) * 10
    p, q = np.unravel_index(np.argmin(b), b.shape)
    xy = np.array([[pt.x, pt.y] for pt in m1.points])
    assert np.linalg.norm(xy[i] - xy[j]) < np.linalg.norm(xy[p] - xy[q])
    assert analysis.atlas_layout([]).points == []
    assert analysis.atlas_layout(tasks[:1]).points[0].x == 0.0


def test_mds_recovers_a_line() -> None:
    pos = np.array([0.0, 1.0, 3.0, 7.0])
    d = np.abs(pos[:, None] - pos[None, :])
    xy = analysis.classical_mds(d)
    assert np.allclose(np.abs(xy[:, 0] - xy[0, 0]), pos, atol=1e-9)
    assert np.allclose(xy[:, 1], 0.0, atol=1e-9)


def test_even_sample() -> None:
    assert analysis.even_sample([1, 2, 3], 5) == [1, 2, 3]
    s = analysis.even_sample(list(range(100)), 10)
    assert len(s) == 10 and s[0] == 0 and s[-1] == 99


def test_route_diagnostics_equal_align(tasks) -> None:
    prompt = _sub(tasks[1].state, 80, 1)
    cands = [analysis.Candidate(t.task_id, t.name, t.state, 0.0) for t in tasks]
    ans = analysis.rerank_route(prompt, cands, k=6, threshold=0.0)
    for m in ans.matches:
        r = align(prompt, tasks[m.task_id - 1].state)
        assert (m.activation, m.error) == pytest.approx((r.activation, r.error), rel=1e-9, abs=1e-12)
        assert m.score == pytest.approx(analysis.route_score(
            prompt.signature().astype(np.float64) / np.linalg.norm(prompt.signature()),
            tasks[m.task_id - 1].state), rel=1e-5)


def test_a_pair_whose_fisher_alignment_is_a_placeholder_is_not_activation_dark() -> None:
    """A task without usable error draws (its joint self term is 0: ``zero_norm_ae``) has ``fisher`` = 0 as a
    placeholder, not as a measured low alignment; with alike activations the pair was reported activation-dark."""
    rng = np.random.default_rng(1)
    n = 40
    spec = SketchSpec(d=6, K=9, m=512, seed=5, error_projection="dense")
    acts = rng.standard_normal((n, 6)) + 3.0
    states = []
    for task_id, err in ((1, rng.standard_normal((n, 9))), (2, np.zeros((n, 9)))):
        st = SketchState.empty(spec)
        Sketcher(spec).update(st, acts + 0.01 * rng.standard_normal((n, 6)), err, np.arange(n) + task_id * n)
        states.append(analysis.TaskState(task_id, f"t{task_id}", st))
    f = analysis.pair_factors(states[0], states[1])
    assert "zero_norm_ae" in f.flags and f.fisher == 0.0 and f.activation >= analysis.ACTIVATION_DARK_MIN_ACTIVATION
    assert not f.activation_dark
    (src,) = analysis.recommend_sources(states[0], states[1:], k=1)
    assert "zero_norm_ae" in src.factors.flags and not src.factors.activation_dark


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from([0.0, 0.3, 0.6, 1.0]), min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2),
    st.integers(1, 12), st.just(n))))
def test_clusters_are_exactly_as_many_as_asked(case: tuple[list[float], int, int]) -> None:
    """Cut by height, ties of the top merges (unrelated tasks' clamped alignments of 0 all give dissimilarity 1)
    gave fewer clusters than the documented k."""
    upper, k, n = case
    d = np.zeros((n, n))
    d[np.triu_indices(n, 1)] = upper
    d = d + d.T
    labels = analysis.agglomerative_clusters(d, k)
    assert sorted(set(labels)) == list(range(min(k, n)))
    assert labels == analysis.agglomerative_clusters(d, k)  # deterministic
    assert [labels.index(c) for c in range(min(k, n))] == sorted(labels.index(c) for c in range(min(k, n)))
