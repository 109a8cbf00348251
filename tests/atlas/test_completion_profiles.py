"""A completion-mode task's lexical profile (``atlas.lexical``, "Completion-mode tasks"): per-term sample counts,
kept by every job, merged exactly, stored in the record blob, and weighing the profile by ``min(1, s / 2)``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atlas.lexical import RECURRING_SAMPLES, TaskTerms, TermCounts, term_hashes
from atlas.lexical_record import LexicalDelta, LexicalRecord
from atlas.samples import Sample
from atlas.template import TaskTemplate

WORDS = ["passage", "question", "answer", "river", "court", "law", "film", "cell", "is", "the"]
_TEXTS = st.lists(st.lists(st.sampled_from(WORDS), min_size=0, max_size=8).map(" ".join), min_size=1, max_size=8)


def _held(texts: list[str]) -> dict[int, int]:
    """How many texts hold each hashed term (brute force)."""
    out: dict[int, int] = {}
    for t in texts:
        for k in set(term_hashes(t).tolist()):
            out[k] = out.get(k, 0) + 1
    return out


def _as_dict(c: TermCounts) -> dict[int, int]:
    return dict(zip(c.keys.tolist(), c.counts.tolist(), strict=True))


@given(_TEXTS, _TEXTS)
def test_sample_counts_count_samples_and_merge_exactly(first: list[str], second: list[str]) -> None:
    pairs = [[Sample(prompt=t, completion=" yes") for t in texts] for texts in (first, second)]
    one = LexicalRecord.empty().add(LexicalDelta.of_samples(pairs[0], "completion"))
    assert one.sample_counts is not None and _as_dict(one.sample_counts) == _held(first)
    both = one.add(LexicalDelta.of_samples(pairs[1], "completion"))  # an append
    at_once = LexicalRecord.empty().add(LexicalDelta.of_samples(pairs[0] + pairs[1], "completion"))
    assert both.sample_counts is not None and _as_dict(both.sample_counts) == _held(first + second)
    for part in ("counts", "sample_counts"):  # an append counts as all the samples at once (the template's checks
        assert getattr(both, part).to_bytes() == getattr(at_once, part).to_bytes()  # are per job, by design)
    assert LexicalRecord.from_bytes(both.to_bytes()).to_bytes() == both.to_bytes()


@given(_TEXTS)
def test_the_profile_weighs_a_term_of_one_sample_half(texts: list[str]) -> None:
    record = LexicalRecord.empty().add(LexicalDelta.of_samples([Sample(prompt=t, completion=" no") for t in texts],
                                                               "completion"))
    terms = record.terms()
    tf, held = _as_dict(record.counts), _held(texts)
    expect = np.array([(1 + np.log(tf[k])) * min(1.0, held[k] / RECURRING_SAMPLES)
                       for k in record.counts.keys.tolist()])
    if expect.size:
        np.testing.assert_allclose(terms.weights, expect / np.linalg.norm(expect), rtol=1e-5)
        assert abs(float(np.linalg.norm(terms.weights)) - 1.0) < 1e-5
    plain = TaskTerms.of(record.counts)  # a text task's profile: the counts alone
    assert np.array_equal(plain.keys, terms.keys)


def test_a_text_task_keeps_no_sample_counts_and_its_profile_is_unchanged() -> None:
    samples = [Sample(text="the river court"), Sample(text="the law")]
    record = LexicalRecord.empty().add(LexicalDelta.of_samples(samples, "text"))
    assert record.sample_counts is None
    assert LexicalRecord.has_template(record.to_bytes()) and record.to_bytes().startswith(b"FALR1")
    w = 1 + np.log(record.counts.counts.astype(np.float64))
    np.testing.assert_allclose(record.terms().weights, w / np.linalg.norm(w), rtol=1e-6)


def test_a_record_stored_before_sample_counts_stays_without_them() -> None:
    """Its earlier samples are not at hand: an append cannot count them, so the task keeps the plain profile (until
    migration 0011 re-derives it from its uploads)."""
    old = LexicalRecord(TermCounts.from_texts(["river court law"]), TaskTemplate.of_texts(["river court law"]))
    back = LexicalRecord.from_bytes(old.to_bytes())  # FALR1 read as before
    assert back.sample_counts is None and back.to_bytes() == old.to_bytes()
    appended = old.add(LexicalDelta.of_samples([Sample(prompt="film cell", completion=" yes")], "completion"))
    assert appended.sample_counts is None
    assert LexicalRecord.from_bytes(TermCounts.from_texts(["a b"]).to_bytes()).template is None  # bare counts


@given(st.integers(0, 200))
def test_a_cut_record_is_refused_not_misread(cut: int) -> None:
    record = LexicalRecord.empty().add(LexicalDelta.of_samples(
        [Sample(prompt=f"passage {w} question", completion=" yes") for w in WORDS], "completion"))
    blob = record.to_bytes()
    short = blob[:min(cut, len(blob) - 1)]
    with pytest.raises(ValueError):
        LexicalRecord.from_bytes(short)
