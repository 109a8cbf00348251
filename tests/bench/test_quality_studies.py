"""The offline studies' own helpers: lexical profiles (:mod:`bench.quality.lexical_profiles`) and layer means
(:mod:`bench.quality.novelty`, ``--layers``), on real term hashing and a real tiny model saved to disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas.lexical import TaskTerms, TermCounts, term_hashes
from bench.quality.lexical_profiles import PROFILES, TermStats, profile
from bench.quality.novelty import layer_means, layer_representations
from tests.tiny_models import save_tiny_gpt2

WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "question", "answer"])
TEXTS = st.lists(st.lists(WORDS, min_size=1, max_size=12).map(" ".join), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(TEXTS)
def test_the_product_profile_is_the_shipped_task_terms(texts: list[str]) -> None:
    ours = profile(TermStats.of(texts), PROFILES["1 + ln tf (product)"])
    shipped = TaskTerms.of(TermCounts.from_texts(texts))
    assert np.array_equal(ours.keys, shipped.keys)
    np.testing.assert_allclose(ours.weights, shipped.weights, rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(TEXTS)
def test_a_document_frequency_profile_counts_samples_not_repeats(texts: list[str]) -> None:
    share = profile(TermStats.of(texts), PROFILES["df / n"])
    # the share of samples holding each term, from the texts' term sets directly
    sets = [set(term_hashes(t).tolist()) for t in texts]
    expected = np.array([sum(int(k) in s for s in sets) / len(texts) for k in share.keys])
    np.testing.assert_allclose(share.weights, expected / np.linalg.norm(expected), rtol=1e-6)
    for weigh in PROFILES.values():
        w = profile(TermStats.of(texts), weigh).weights
        assert np.all(w > 0) and abs(float(np.linalg.norm(w)) - 1.0) < 1e-5


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from workers.model_loading import load_causal_lm

    return load_causal_lm(str(save_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2")), device="cpu")


def test_layer_means_ignore_padding_and_cover_every_layer(tiny_lm) -> None:  # type: ignore[no-untyped-def]
    short, long = "ab ba", "ab ba ab ba ab ba ab ba ab"
    together = layer_means(tiny_lm, [short, long], max_tokens=64)
    alone = layer_means(tiny_lm, [short], max_tokens=64)
    n_layers = int(tiny_lm.model.config.num_hidden_layers)
    assert together.shape == (2, n_layers + 1, tiny_lm.hidden_size)
    np.testing.assert_allclose(together[0], alone[0], atol=1e-5)  # the padded batch gives the text's own means
    assert not np.allclose(together[0], together[1])
    views = layer_representations(n_layers)
    assert list(views) == [f"h{k}" for k in range(n_layers + 1)] + ["blocks concatenated"]
    np.testing.assert_array_equal(views[f"h{n_layers}"](together), together[:, n_layers])
    assert views["blocks concatenated"](together).shape == (2, n_layers * tiny_lm.hidden_size)


def test_layer_means_truncate_at_max_tokens(tiny_lm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text = " ".join(["ab ba"] * 40)
    ids = tiny_lm.tokenizer(text)["input_ids"]
    assert len(ids) > 8
    cut = tiny_lm.tokenizer.decode(ids[:8])
    np.testing.assert_allclose(layer_means(tiny_lm, [text], max_tokens=8), layer_means(tiny_lm, [cut], max_tokens=64),
                               atol=1e-5)


def test_completion_pairs_keep_the_held_out_prompts_whatever_the_pairs() -> None:
    from bench.quality.completion_families import HELD_PROMPTS, completion_pairs
    from tests.shared_data import require_shared_data

    require_shared_data()
    few, held = completion_pairs("cb", seed=3, n_pairs=16)
    many, held_again = completion_pairs("cb", seed=3, n_pairs=150)
    assert held == held_again and len(held) == HELD_PROMPTS
    assert [p["prompt"] for p in many[:16]] == [p["prompt"] for p in few]
    assert not {p["prompt"] for p in many} & set(held)  # no held-out prompt is a pair of the task
    assert all(p["prompt"].endswith("\nAnswer:") and p["completion"] in {" yes", " no"} for p in many)
    with pytest.raises(SystemExit, match="at most 200 pairs"):
        completion_pairs("cb", seed=3, n_pairs=201)


def test_tally_counts_tops_answers_and_text_top1() -> None:
    from bench.quality.completion_families import tally

    truth = ["boolq"] * 4 + ["rte"] * 2 + ["cb"] * 2 + ["news"] * 4
    top = ["boolq", "boolq", "rte", "wiki", "rte", "rte", "cb", "rte", "news", "news", "news", "wiki"]
    none = [False, True, False, False, False, False, False, False, False, False, True, False]
    out = tally(truth, top, none)
    assert out["boolq"] == {"top1": 0.5, "right": 0.25, "none": 0.25, "elsewhere": [("rte", 1), ("wiki", 1)]}
    assert out["rte"]["top1"] == 1.0 and out["rte"]["right"] == 1.0
    assert out["cb"]["top1"] == 0.5 and out["cb"]["elsewhere"] == [("rte", 1)]
    assert out["text_top1"] == 0.75  # the open set does not count in the text tasks' top-1


def test_a_suffix_state_holds_exactly_the_last_positions(tiny_lm) -> None:  # type: ignore[no-untyped-def]
    from bench.quality.common import make_extractor, make_parser, make_sketcher
    from bench.quality.completion_suffix import prompt_states

    args = make_parser("test", m=64, max_tokens=64, seeds=[0]).parse_args([])
    extractor = make_extractor(tiny_lm, make_sketcher(tiny_lm, args.m, 0), args)
    texts = ["ab ba ab ba ab ba ab\nQuestion: ba ab?\nAnswer:", "ba ba ba ab ab ab ba\nQuestion: ba ab?\nAnswer:"]
    states = prompt_states(extractor, texts, (3, 5))
    for i in range(len(texts)):
        whole = states["whole"][i]
        for k in (3, 5):
            tail = states[k][i]
            assert int(tail.n_tokens) == k  # the cut is counted in positions
            np.testing.assert_allclose(tail.merge(_cut_state(extractor, texts[i], k)).sums, whole.sums, atol=1e-4)
    # the same last tokens in another context: another state (the model is causal, the positions see the passage)
    assert not np.allclose(states[3][0].sums, states[3][1].sums)


def _cut_state(extractor, text: str, k: int):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from atlas.samples import Sample
    from workers.prompt_batcher import PromptBatcher

    (prepared,), _ = extractor.sample_tokenizer.prepare([Sample(text=text)], "text")
    cut = replace(prepared, input_ids=prepared.input_ids[:len(prepared.input_ids) - k])
    return PromptBatcher(extractor, token_budget=8192).sketch_prepared([cut])[0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-500, 500).map(lambda i: i / 1000), min_size=8, max_size=40, unique=True),  # sd > 2e-3
       st.lists(st.tuples(st.floats(-0.3, 0.3), st.floats(0.5, 2.0)), min_size=2, max_size=6),
       st.sampled_from([0.025, 0.05, 0.1]))
def test_a_pooled_shape_threshold_moves_with_each_task_s_location_and_scale(
        base: list[float], affine: list[tuple[float, float]], rate: float) -> None:
    """Tasks whose held-out scores are one shape, shifted and scaled, share one standardized quantile: each task's
    pooled-shape threshold is that quantile put back on the task's own location and scale (bench 4d's study)."""
    from bench.quality.pooled_shape import thresholds

    x = np.asarray(base)
    cal = {f"t{i}": (shift + scale * x).tolist() for i, (shift, scale) in enumerate(affine)}
    thr = thresholds(cal, "shape-sd", rate)
    z = (x - x.mean()) / x.std(ddof=1)
    expected = float(np.quantile(np.tile(z, len(affine)), rate))
    base_threshold = x.mean() + x.std(ddof=1) * expected  # the base shape's own threshold
    for i, (shift, scale) in enumerate(affine):
        assert thr[f"t{i}"] == pytest.approx(shift + scale * base_threshold, abs=1e-9)
    if len(x) * len(affine) * rate >= 1:  # a quantile inside the pool: between the task's own extremes
        for name, scores in cal.items():
            assert min(scores) - 1e-9 <= thr[name] <= max(scores) + 1e-9


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abc d", min_size=0, max_size=30), min_size=1, max_size=6),
       st.text(alphabet="abc d", max_size=8), st.integers(1, 4))
def test_the_character_language_model_is_a_distribution(texts: list[str], history: str, order: int) -> None:
    """The char-LM study's Witten–Bell model: the next character's probabilities over the 256 byte values sum to 1
    after any history, and a model's own training text is more typical of it than an unrelated one."""
    import math

    from bench.quality.char_lm_openset import CharLM

    model = CharLM(texts, order)
    padded = "\x02" * (order - 1) + history

    def prob(char: str) -> float:  # one step of cross_entropy, from its definition
        p = 1.0 / 256
        hist = padded[len(padded) - (order - 1):] if order > 1 else ""
        for k in range(1, order + 1):
            context = hist[len(hist) - (k - 1):] if k > 1 else ""
            seen = model.contexts[k].get(context, 0)
            if seen:
                keep = seen / (seen + len(model.followers[k][context]))
                p = keep * model.grams[k].get(context + char, 0) / seen + (1 - keep) * p
        return p

    assert math.isclose(sum(prob(chr(c)) for c in range(256)), 1.0, rel_tol=1e-9)
    own = max(texts, key=len)
    assert model.cross_entropy(own) < model.cross_entropy("ZQXJ" * 8)
