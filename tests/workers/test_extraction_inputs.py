"""Tokenisation policy, bad inputs, batching and the background tokeniser thread."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import processors
from transformers import AutoTokenizer

from atlas.errors import InvalidInput
from atlas.samples import Sample, sample_id
from tests.tiny_models import build_tokenizer
from workers.batching import Prefetcher, PreparedSample, SampleTokenizer, make_batches
from workers.extraction import Extractor
from workers.model_loading import LoadedModel, load_causal_lm


def _st(lm: LoadedModel, max_tokens: int = 64) -> SampleTokenizer:
    return SampleTokenizer(lm.tokenizer, max_tokens, lm.K)


def test_bad_samples_are_skipped_with_reasons(gpt2_lm: LoadedModel) -> None:
    samples = [
        Sample(text="The quick brown fox"),  # ok
        Sample(text=""),  # empty
        Sample(text="   \n\t"),  # whitespace only
        Sample(text="a"),  # one token
        Sample(text="bad \ud800 surrogate"),  # not valid Unicode
        Sample(prompt="no text field", completion="x"),  # text mode needs text
    ]
    kept, skipped = _st(gpt2_lm).prepare(samples, "text")
    assert [p.index for p in kept] == [0]
    assert [(s.index, s.reason) for s in skipped] == [
        (1, "empty"), (2, "empty"), (3, "too_short"), (4, "invalid_text"), (5, "missing_field")]
    assert kept[0].sample_id == sample_id(samples[0])


def test_completion_mode_skips(gpt2_lm: LoadedModel) -> None:
    samples = [
        Sample(prompt="Question: is the sky blue? Answer:", completion=" yes."),
        Sample(prompt="Question:", completion=""),
        Sample(text="only text"),
        Sample(prompt="", completion="a"),  # one completion token and nothing before it
        Sample(prompt="Q \udfff", completion="yes"),
    ]
    kept, skipped = _st(gpt2_lm).prepare(samples, "completion")
    assert [p.index for p in kept] == [0]
    assert {(s.index, s.reason) for s in skipped} == {
        (1, "empty"), (2, "missing_field"), (3, "no_completion_tokens"), (4, "invalid_text")}


def test_text_truncation_keeps_the_first_tokens(gpt2_lm: LoadedModel) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 20
    full = list(gpt2_lm.tokenizer(text)["input_ids"])
    (p,), _ = _st(gpt2_lm, max_tokens=10).prepare([Sample(text=text)], "text")
    assert p.truncated and list(p.input_ids) == full[:10] and p.first_target == 0


def test_completion_truncation_cuts_prompt_from_the_left_then_completion(gpt2_lm: LoadedModel) -> None:
    tok = gpt2_lm.tokenizer
    prompt, completion = "Question: is the sky blue? " * 5, " yes." * 3
    p_ids, c_ids = list(tok(prompt)["input_ids"]), list(tok(completion, add_special_tokens=False)["input_ids"])
    budget = len(c_ids) + 4
    (p,), _ = _st(gpt2_lm, max_tokens=budget).prepare([Sample(prompt=prompt, completion=completion)], "completion")
    assert p.truncated and list(p.input_ids) == p_ids[-4:] + c_ids and p.first_target == 3
    # completion longer than the budget: one prompt token survives, the completion is cut on the right
    (q,), _ = _st(gpt2_lm, max_tokens=5).prepare([Sample(prompt=prompt, completion=completion)], "completion")
    assert list(q.input_ids) == p_ids[-1:] + c_ids[:4] and q.n_counted == 4


_WORDS = st.lists(st.sampled_from(["Question:", "sky", "blue?", "Answer:", "fox", "def", "(a, b)", "x\ny"]),
                  min_size=1, max_size=400).map(" ".join)


@settings(max_examples=40, deadline=None)
@given(prompt=_WORDS, completion=_WORDS, max_tokens=st.integers(2, 24), max_chars=st.integers(8, 200))
def test_completion_keeps_the_prompt_tail_whatever_the_character_cut(prompt: str, completion: str, max_tokens: int,
                                                                      max_chars: int) -> None:
    # Very long strings are cut by characters before tokenising; a prompt must keep its *last* tokens
    # (those next to the completion), never the tail of a character prefix. Old code: prefix cut.
    tok = build_tokenizer()
    st_ = SampleTokenizer(tok, max_tokens, len(tok))
    st_.max_chars = max_chars  # force the cut path on short strings
    p_ids, c_ids = list(tok(prompt)["input_ids"]), list(tok(completion, add_special_tokens=False)["input_ids"])
    (got,), _ = st_.prepare([Sample(prompt=prompt, completion=completion)], "completion")
    n_p = got.first_target + 1
    assert list(got.input_ids[:n_p]) == p_ids[len(p_ids) - n_p:]
    assert list(got.input_ids[n_p:]) == c_ids[: got.length - n_p]


def test_completion_prompt_drops_an_appended_eos() -> None:
    # A tokenizer that appends EOS to every text (add_eos_token=True) must not put it between prompt and
    # completion: the first completion token is predicted from the prompt's last token.
    tok = build_tokenizer()
    eos = tok.eos_token_id
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eos)])
    prompt, completion = "Question: is the sky blue? Answer:", " yes."
    p_ids = list(tok(prompt, add_special_tokens=False)["input_ids"])
    c_ids = list(tok(completion, add_special_tokens=False)["input_ids"])
    assert list(tok(prompt)["input_ids"]) == [*p_ids, eos]
    (got,), _ = SampleTokenizer(tok, 64, len(tok)).prepare([Sample(prompt=prompt, completion=completion)], "completion")
    assert list(got.input_ids) == p_ids + c_ids and got.first_target == len(p_ids) - 1
    (empty,), _ = SampleTokenizer(tok, 64, len(tok)).prepare([Sample(prompt="", completion=completion)], "completion")
    assert list(empty.input_ids) == c_ids and empty.first_target == 0


def test_absurdly_long_sample_is_cheap_and_truncated(gpt2_lm: LoadedModel) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 40_000  # 1.8 M characters
    t0 = time.perf_counter()
    (p,), _ = _st(gpt2_lm, max_tokens=32).prepare([Sample(text=text)], "text")
    assert time.perf_counter() - t0 < 2.0
    assert p.truncated and p.length == 32
    assert list(p.input_ids) == list(gpt2_lm.tokenizer(text[:2000])["input_ids"])[:32]


def test_extractor_rejects_absurd_settings(gpt2_lm: LoadedModel) -> None:
    for kwargs in ({"max_tokens_per_sample": 1}, {"token_budget": 0}, {"logits_chunk": 0},
                   {"padding_side": "middle"}):
        with pytest.raises(InvalidInput):
            Extractor(gpt2_lm, None, **kwargs)  # type: ignore[arg-type]
    # a huge max length is lowered to the model's maximum sequence length (256)
    assert Extractor(gpt2_lm, None, max_tokens_per_sample=10**9).max_tokens_per_sample == 256


def test_prompt_errors(gpt2_lm: LoadedModel) -> None:
    ex = Extractor(gpt2_lm, None)
    for text, match in (("", "empty"), ("  ", "empty"), ("a", "fewer than 2 tokens"), ("x\ud800y", "Unicode")):
        with pytest.raises(InvalidInput, match=match):
            ex.prompt(text)


def _ps(i: int, n: int) -> PreparedSample:
    return PreparedSample(i, i, tuple(range(1, n + 1)), 0, False)


def test_token_budget_batches_are_length_sorted_and_bounded() -> None:
    lengths = [5, 30, 12, 12, 3, 40, 7, 100]
    batches = make_batches([_ps(i, n) for i, n in enumerate(lengths)], token_budget=48)
    flat = [p for b in batches for p in b]
    assert [p.length for p in flat] == sorted(lengths, reverse=True)
    assert sorted(p.index for p in flat) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * b[0].length <= 48  # over-long samples go alone
    assert [len(b) for b in batches] == [1, 1, 1, 4, 1]  # 100 | 40 | 30 | 12 12 7 5 (4·12 = 48) | 3


def test_prefetcher_propagates_producer_errors() -> None:
    def boom() -> Iterator[int]:
        yield 1
        raise RuntimeError("tokenizer exploded")

    got = []
    with pytest.raises(RuntimeError, match="tokenizer exploded"), Prefetcher(boom) as pf:
        got.extend(pf)
    assert got == [1]


def test_prefetcher_is_bounded_and_stops_on_close() -> None:
    produced: list[int] = []

    def endless() -> Iterator[int]:
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    pf = Prefetcher(endless, maxsize=2)
    it = iter(pf)
    assert next(it) == 0
    time.sleep(0.3)
    assert len(produced) <= 4  # item in hand + 2 queued + 1 waiting to be put
    pf.close()
    assert not pf.alive


def test_pad_token_outside_the_model_vocabulary_is_not_fed_to_the_model(gpt2_dir: Path, tmp_path: Path) -> None:
    # A pad token added to the tokenizer without resizing the model has id K: padding with it made every
    # batch of two lengths fail with "IndexError: index out of range in self" in the embedding.
    target = tmp_path / "added-pad"
    shutil.copytree(gpt2_dir, target)
    tok = AutoTokenizer.from_pretrained(target)
    tok.add_special_tokens({"pad_token": "[PAD]"})
    tok.save_pretrained(target)
    lm = load_causal_lm(str(target), device="cpu")
    assert lm.tokenizer.pad_token_id >= lm.K
    ex = Extractor(lm, lm.make_sketcher(lm.make_spec(m=64)))
    assert 0 <= ex.pad_id < lm.K
    samples = [Sample(text="The quick brown fox jumps over the lazy dog."), Sample(text="Hi there")]
    together = ex.extract(samples).state
    alone = ex.extract(samples[:1]).state.merge(ex.extract(samples[1:]).state)
    assert together.n_tokens == alone.n_tokens
    np.testing.assert_allclose(together.sums, alone.sums, rtol=1e-4, atol=1e-6)
