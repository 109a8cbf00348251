"""Experiment 4f's prompt cut (``bench.quality.prompt_length.cut``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.quality.prompt_length import MIN_WORDS, cut


@given(st.text(alphabet="ab \n\t", max_size=200), st.sampled_from([1.0, 0.5, 0.25, 0.1]))
def test_a_cut_prompt_is_a_prefix_holding_its_first_words(text: str, fraction: float) -> None:
    out = cut(text, fraction)
    words = text.split()
    assert text.startswith(out)  # its own whitespace kept
    assert out.split() == words[:min(len(words), max(MIN_WORDS, round(len(words) * fraction)))]
    if fraction == 1.0:
        assert out == text
