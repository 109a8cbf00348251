"""The template test (atlas.template): the terms every sample has, its leave-one-out checks, storage, and the
re-rank's "none" when a prompt lacks them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas import routing
from atlas.lexical import TaskTerms, TermCounts
from atlas.lexicon_repo import LexicalDelta, LexicalRecord
from atlas.template import TEMPLATE_FALSE_REJECT, TaskTemplate, presence
from tests.atlas.test_lexical import _state

WORDS = st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "omega", "kappa"]), min_size=1, max_size=5)
JOB = st.lists(WORDS.map(" ".join) | st.sampled_from(["x = 1", "?", "", "  "]), min_size=1, max_size=6)
"""Samples of a job: words, a few texts without any term (counted) and blank ones (not counted)."""


def _every(sets: list[set[int]]) -> set[int]:
    return set.intersection(*sets) if sets else set()


def _brute(jobs: list[list[str]]) -> tuple[set[int], int, int]:
    """Template keys, checks and misses by definition: each sample of job g checked against every other sample of
    jobs 0..g."""
    seen: list[set[int]] = []
    checks = misses = 0
    for job in jobs:
        new = [set(p.tolist()) for p in map(presence, job) if p is not None]
        for j, own in enumerate(new):
            others = seen + new[:j] + new[j + 1:]
            if others:
                checks += 1
                misses += not _every(others) <= own
        seen += new
    return _every(seen), checks, misses


@settings(max_examples=80, deadline=None)
@given(st.lists(JOB, min_size=1, max_size=4))
def test_keys_checks_and_misses_match_their_definition_over_appends(jobs: list[list[str]]) -> None:
    tpl = TaskTemplate.empty()
    for job in jobs:
        tpl = tpl.add(job)
    keys, checks, misses = _brute(jobs)
    assert set(tpl.keys.tolist()) == keys
    assert (tpl.docs, tpl.checks, tpl.misses) == (sum(bool(t.strip()) for job in jobs for t in job), checks, misses)
    assert tpl.keys.tolist() == sorted(tpl.keys.tolist())


@given(st.lists(WORDS.map(" ".join), min_size=1, max_size=6), WORDS.map(" ".join))
def test_a_prompt_with_every_template_term_is_never_missing_any(job: list[str], extra: str) -> None:
    tpl = TaskTemplate(np.unique(np.concatenate([presence(t) for t in job])), docs=100, checks=100)
    assert tpl.active
    prompt = TermCounts.from_texts([" ".join(job) + " " + extra])
    assert tpl.missing(prompt) == 0


def test_the_test_activates_only_on_enough_clean_checks() -> None:
    frame = [f"The native language of {n} is ___ ." for n in ("Ada", "Bo", "Cy", "Di", "Ed", "Fay", "Gus")]
    few = TaskTemplate.of_texts(frame)
    assert few.misses == 0 and few.checks == 7 and not few.active  # (0 + 1) / 9 > 2 %
    many = TaskTemplate.of_texts(frame * 8)
    assert many.active and many.false_reject <= TEMPLATE_FALSE_REJECT
    born = TermCounts.from_texts(["Dante was born in ___ ."])
    assert many.missing(born) > 0
    assert many.missing(TermCounts.from_texts(["The native language of Dante is ___ ."])) == 0
    free = TaskTemplate.of_texts([f"{a} {b}" for a in ("red", "green", "blue") for b in ("sky", "sea", "sand")] * 8)
    assert free.keys.size == 0 and not free.active and free.missing(born) == 0  # no term in every sample


def test_empty_and_missing_texts_are_not_counted() -> None:
    tpl = TaskTemplate.of_texts(["alpha beta", None, "", " \n", "alpha gamma"])
    assert tpl.docs == 2 and set(tpl.keys.tolist()) == set(presence("alpha").tolist())


def test_a_sample_without_terms_counts_and_empties_the_template() -> None:
    """A task whose samples include texts without any term ("a + b = c") has no term in every sample: its own
    such prompts must not be rejected, so the template is empty and the test off."""
    frame = [f"Define the word: w{i:02d}" for i in range(60)]
    clean = TaskTemplate.of_texts(frame)
    assert clean.active
    mixed = TaskTemplate.of_texts([*frame, "a + b = c", "?", "x"])
    assert mixed.docs == 63 and mixed.keys.size == 0 and not mixed.active
    assert mixed.missing(TermCounts.from_texts(["a + b = c"])) == 0
    appended = clean.add(["a + b = c"])  # an append: the stored keys meet a sample without terms
    assert appended.keys.size == 0 and not appended.active and appended.misses == clean.misses + 1
    delta = LexicalDelta.of_texts(["Define the word: w99", "x = 1", "", None])
    assert [p is None for p in delta.presences] == [False, False, True, True]
    assert LexicalRecord(TermCounts.empty(), clean).add(delta).template.keys.size == 0


@given(st.lists(JOB, min_size=1, max_size=3))
def test_records_round_trip_and_read_bare_counts(jobs: list[list[str]]) -> None:
    rec = LexicalRecord(TermCounts.empty(), TaskTemplate.empty())
    for job in jobs:
        rec = rec.add(LexicalDelta.of_texts(job))
    back = LexicalRecord.from_bytes(rec.to_bytes())
    assert back.counts.keys.tolist() == rec.counts.keys.tolist()
    assert back.counts.counts.tolist() == rec.counts.counts.tolist()
    assert back.template is not None and rec.template is not None
    assert back.template.keys.tolist() == rec.template.keys.tolist()
    assert (back.template.docs, back.template.checks, back.template.misses) == (
        rec.template.docs, rec.template.checks, rec.template.misses)
    bare = LexicalRecord.from_bytes(rec.counts.to_bytes())  # stored before templates: no template, and none later
    assert bare.template is None and bare.add(LexicalDelta.of_texts(["alpha"])).template is None


@pytest.mark.parametrize("blob", [b"", b"FAT1", b"FAT1" + bytes(16) + b"x", b"XXXX" + bytes(16),
                                  b"FAT1" + (2).to_bytes(4, "little") * 3 + (2).to_bytes(4, "little") + bytes(8)])
def test_corrupt_template_blobs_are_refused(blob: bytes) -> None:
    with pytest.raises(ValueError):
        TaskTemplate.from_bytes(blob)


def test_the_rerank_answers_none_when_the_prompt_lacks_the_answered_tasks_template() -> None:
    frame = [f"The native language of {n} is ___ ." for n in ("Ada", "Bo", "Cy", "Di", "Ed", "Fay", "Gus", "Hal")] * 8
    tpl = TaskTemplate.of_texts(frame)
    state = _state(1, 0.8)
    cand = routing.Candidate(1, "native", state, 0.0, routing.state_view(state),
                             terms=TaskTerms.of(TermCounts.from_texts(frame)), template=tpl)
    prompt = _state(2, 0.8, n_samples=1)
    kw = {"k": 1, "threshold": -1.0}
    own = TermCounts.from_texts(["The native language of Ivo is ___ ."])
    inside = routing.rerank_route(prompt, [cand], prompt_terms=own, **kw)
    assert not inside.none and not inside.template_rejects
    outside = routing.rerank_route(prompt, [cand], prompt_terms=TermCounts.from_texts(["Ivo was born in ___ ."]), **kw)
    assert outside.none and outside.template_rejects and outside.matches[0].task_id == 1
    assert outside.rejected_by is not None and (outside.rejected_by.task_id, outside.rejected_by.reason) == (
        1, "template")
    assert inside.rejected_by is None
    assert outside.confidence == pytest.approx(1.0 - tpl.false_reject)
    assert not routing.rerank_route(prompt, [cand], **kw).none  # no prompt terms (lexical evidence off): no test


def test_a_pair_brings_its_prompt_to_the_template_not_its_completion() -> None:
    from atlas.samples import Sample

    pairs = [Sample(prompt=f"Translate {w} into French:", completion=f" The answer is {w}-fr.") for w in
             ("cat", "dog", "bird", "fish", "tree", "house", "river", "stone")] * 7
    for mode in ("text", "completion"):
        delta = LexicalDelta.of_samples(pairs, mode)
        tpl = LexicalRecord(TermCounts.empty(), TaskTemplate.empty()).add(delta).template
        assert tpl is not None and tpl.active
        assert tpl.missing(TermCounts.from_texts(["Translate moon into French:"])) == 0  # a prompt has no answer
        assert tpl.missing(TermCounts.from_texts(["Translate moon into German:"])) > 0
    text = LexicalDelta.of_samples(pairs, "text").counts  # the counts still cover the completions in text mode
    assert set(TermCounts.from_texts(["answer"]).keys.tolist()) <= set(text.keys.tolist())


def test_the_false_reject_estimate_and_its_activation_bound() -> None:
    """Laplace's rule ``(misses + 1) / (checks + 2)``, active at most ``TEMPLATE_FALSE_REJECT``: 48 checks without
    a miss reach 0.02 exactly and activate the test, 47 do not (neither the rule nor the bound was held by a test:
    a test-suite audit, 2026-12-07)."""
    import numpy as np

    keys = np.array([7, 11], dtype=np.uint32)
    assert TaskTemplate(keys, 50, 10, 3).false_reject == 4 / 12
    at_bound = TaskTemplate(keys, 50, 48, 0)
    assert at_bound.false_reject == TEMPLATE_FALSE_REJECT == 1 / 50 and at_bound.active
    assert not TaskTemplate(keys, 50, 47, 0).active
    assert not TaskTemplate(np.array([], dtype=np.uint32), 50, 480, 0).active  # no term: nothing to test
