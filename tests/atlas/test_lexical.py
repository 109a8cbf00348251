"""Lexical evidence (atlas.lexical): term counts, their storage format, the lexical score and the fusion."""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas import lexical, routing
from atlas.lexical import TaskTerms, TermCounts, fuse, lexical_scores, standardised
from fishersketch import Sketcher, SketchSpec

TEXTS = st.lists(st.text(max_size=80), max_size=8)


def _as_dict(c: TermCounts) -> dict[int, int]:
    return {int(k): int(v) for k, v in zip(c.keys, c.counts, strict=True)}


def test_terms_are_lowercased_words_and_bigrams() -> None:
    assert lexical.terms("The CAT sat, on a mat\u2028Ünïcode wörds") == [
        "the", "cat", "sat", "on", "mat", "ünïcode", "wörds",
        "the cat", "cat sat", "sat on", "on mat", "mat ünïcode", "ünïcode wörds"]


@settings(max_examples=300)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=200))
def test_ascii_text_keeps_the_word_tokens_of_before(text: str) -> None:
    """Stored term counts of ASCII tasks stay valid: ``\\w\\w+`` on the lower-cased text, as before."""
    assert lexical.tokens(text) == re.findall(r"\w\w+", text.lower())


@settings(max_examples=300)
@given(st.text(max_size=120))
def test_tokens_do_not_depend_on_the_unicode_normal_form(text: str) -> None:
    nfc, nfd = unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)
    assert lexical.tokens(nfc) == lexical.tokens(nfd)
    assert all(tok and not any(ch.isspace() for ch in tok) for tok in lexical.tokens(text))


@given(st.text(alphabet=st.sampled_from("中文字符北京大学のカタコーヒーกินข้าว"), min_size=2, max_size=40))
def test_a_run_of_an_unspaced_script_gives_its_character_bigrams(run: str) -> None:
    toks = lexical.tokens(run)
    assert toks == [run[i:i + 2] for i in range(len(run) - 1)]


def test_scripts_without_spaces_and_combining_marks_are_not_one_term_per_clause() -> None:
    assert lexical.tokens("我今天去北京。猫") == ["我今", "今天", "天去", "去北", "北京", "猫"]
    # a Devanagari vowel sign or a decomposed accent no longer splits the word
    assert lexical.tokens("नमस्ते दुनिया") == ["नमस्ते", "दुनिया"]
    assert lexical.tokens("cafe\u0301 café") == ["café", "café"]
    # a Chinese prompt now shares terms with a Chinese task of other sentences on its topic
    task = TaskTerms.of(TermCounts.from_texts(["北京大学的学生在图书馆学习中文。", "北京的天气今天很好。"]))
    other = TaskTerms.of(TermCounts.from_texts(["上海的咖啡馆很多。", "东京的地铁很方便。"]))
    scores = lexical_scores(TermCounts.from_texts(["我在北京大学学习。"]), [task, other])
    assert scores[0] > 0.2 and scores[0] > 3 * scores[1]


@given(TEXTS, TEXTS)
def test_merge_is_the_counts_of_the_concatenation(a: list[str], b: list[str]) -> None:
    merged = TermCounts.from_texts(a).merge(TermCounts.from_texts(b))
    assert _as_dict(merged) == _as_dict(TermCounts.from_texts(a + b))
    assert np.all(np.diff(merged.keys.astype(np.int64)) > 0)  # sorted, unique


@given(TEXTS)
def test_bytes_round_trip(texts: list[str]) -> None:
    c = TermCounts.from_texts(texts)
    back = TermCounts.from_bytes(c.to_bytes())
    assert _as_dict(back) == _as_dict(c)


@pytest.mark.parametrize("blob", [b"", b"nope", b"FALX1\x02\x00\x00\x00garbage",
                                  TermCounts.from_texts(["a b c d"]).to_bytes()[:-3]])
def test_corrupt_blobs_are_refused(blob: bytes) -> None:
    with pytest.raises(ValueError):
        TermCounts.from_bytes(blob)


def test_a_zlib_bomb_is_refused_without_inflating_it() -> None:
    """An imported term-count blob is inflated only to the length its header states (a 1.7 MB import inflated
    1 GiB before the length check; near the 64 MB body limit it would have been ~45 GB)."""
    import zlib

    from atlas.lexical import _MAGIC, MAX_TERMS

    bomb = zlib.compress(b"\0" * (64 << 20), 9)  # 64 MiB of zeros in ~65 KB
    for n in (1, MAX_TERMS):
        with pytest.raises(ValueError, match="length"):
            TermCounts.from_bytes(_MAGIC + n.to_bytes(4, "little") + bomb)
    with pytest.raises(ValueError, match="at most"):
        TermCounts.from_bytes(_MAGIC + (MAX_TERMS + 1).to_bytes(4, "little") + bomb)


def test_the_cap_keeps_the_most_frequent_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lexical, "MAX_TERMS", 3)
    c = TermCounts.from_texts(["aa aa aa bb bb cc dd ee"]).merge(TermCounts.from_texts(["aa ff"]))
    assert len(c) == 3
    kept = _as_dict(c)
    top = _as_dict(TermCounts._of(lexical.term_hashes("aa")))
    assert kept[next(iter(top))] == 4  # "aa": 3 + 1


@settings(max_examples=50)
@given(st.text(max_size=60), st.lists(st.lists(st.text(max_size=40), max_size=4), min_size=1, max_size=6))
def test_lexical_scores_are_cosines_in_0_1(prompt: str, tasks: list[list[str]]) -> None:
    out = lexical_scores(TermCounts.from_texts([prompt]), [TaskTerms.of(TermCounts.from_texts(t)) for t in tasks])
    assert out.shape == (len(tasks),)
    assert np.all((out >= 0.0) & (out <= 1.0))


def test_identical_text_scores_one_and_disjoint_text_zero() -> None:
    prompt = TermCounts.from_texts(["photosynthesis converts light energy"])
    same = TaskTerms.of(TermCounts.from_texts(["photosynthesis converts light energy"]))
    other = TaskTerms.of(TermCounts.from_texts(["the stock market fell sharply"]))
    assert lexical_scores(prompt, [same])[0] == pytest.approx(1.0)
    s = lexical_scores(prompt, [same, other])
    assert s[1] == 0.0 and s[0] > 0.99
    assert np.all(lexical_scores(TermCounts.from_texts(["!"]), [same, other]) == 0.0)


def test_rare_terms_weigh_more_than_shared_ones() -> None:
    # "biology" appears in one candidate only, "question" in all: the prompt is nearer the biology task
    tasks = [TaskTerms.of(TermCounts.from_texts(["question about biology cells"])),
             TaskTerms.of(TermCounts.from_texts(["question about law courts"])),
             TaskTerms.of(TermCounts.from_texts(["question about music notes"]))]
    s = lexical_scores(TermCounts.from_texts(["question question question biology"]), tasks)
    assert s[0] > s[1] == s[2]


@given(st.lists(st.floats(-1, 1), min_size=1, max_size=20), st.floats(0, 1))
def test_fusion_with_a_constant_lexical_score_keeps_the_fisher_order(rank: list[float], c: float) -> None:
    r = np.array(rank)
    key = fuse(r, np.full(len(r), c))
    assert np.all(np.argsort(-key, kind="stable") == np.argsort(-standardised(r), kind="stable"))
    assert np.allclose(standardised(np.full(3, c)), 0.0)


_SK = Sketcher(SketchSpec(d=6, K=9, m=256, seed=4), chunk_rows=64)


def _state(seed: int, e_offset: float, n_samples: int = 12, tokens: int = 4) -> object:
    rng = np.random.default_rng(seed)
    n = n_samples * tokens
    return _SK.sketch(rng.standard_normal((n, 6)) + 0.8, rng.standard_normal((n, 9)) + e_offset,
                      np.repeat(np.arange(n_samples) + 1000 * seed, tokens))


def _cand(i: int, state: object, terms: TaskTerms | None) -> routing.Candidate:
    return routing.Candidate(i, f"t{i}", state, 0.0, routing.state_view(state), terms=terms)


def test_lexical_evidence_decides_between_near_twins_in_fisher_geometry() -> None:
    # tasks 0 and 1 have the same head-gradient distribution (twins: same format, other topics), task 2 another
    states = [_state(1, 0.8), _state(2, 0.8), _state(3, -0.8)]
    prompt = _state(4, 0.8, n_samples=1)
    words = ["court ruling appeal judge", "enzyme protein cell membrane", "guitar chord melody tempo"]
    terms = [TaskTerms.of(TermCounts.from_texts([w] * 6)) for w in words]
    pt = TermCounts.from_texts(["which enzyme crosses the cell membrane"])
    plain = routing.rerank_route(prompt, [_cand(i, s, t) for i, (s, t) in enumerate(zip(states, terms, strict=True))],
                                 k=3, threshold=-1.0)
    assert plain.matches[-1].task_id == 2 and all(m.lexical is None for m in plain.matches)
    for first in (0, 1):  # whichever twin Fisher prefers, the lexical evidence picks task 1
        order = [first, 1 - first, 2]
        hybrid = routing.rerank_route(prompt, [_cand(i, states[i], terms[i]) for i in order], k=3, threshold=-1.0,
                                      prompt_terms=pt)
        assert hybrid.matches[0].task_id == 1
        lex = {m.task_id: m.lexical for m in hybrid.matches}
        assert lex[1] > 0.3 and lex[0] == lex[2] == 0.0
        assert hybrid.matches[-1].task_id == 2  # far in Fisher geometry and no shared word: last
    missing = routing.rerank_route(prompt, [_cand(0, states[0], terms[0]), _cand(1, states[1], None),
                                            _cand(2, states[2], terms[2])], k=3, threshold=-1.0, prompt_terms=pt)
    assert all(m.lexical is None for m in missing.matches)
    assert [m.task_id for m in missing.matches] == [m.task_id for m in plain.matches]


def test_the_terms_cache_is_bounded_by_the_terms_it_holds() -> None:
    from atlas import lexicon_repo
    from atlas.lru import ContentLru

    cache: ContentLru[lexicon_repo.TaskLexical] = ContentLru(10, weigh=lexicon_repo._LEXICAL._weigh)  # its weight
    for i in range(5):
        terms = TaskTerms.of(TermCounts.from_texts([f"aa{i} bb{i} cc{i}"]))  # 5 terms each
        cache.put(bytes([i]), lexicon_repo.TaskLexical(terms, None))
    assert cache.get(bytes([4])) is not None and cache.get(bytes([3])) is not None
    assert cache.get(bytes([0])) is None and cache.held <= 10


_WORDS = st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"]),
                  min_size=0, max_size=6).map(" ".join)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.floats(-1.5, 1.5), st.integers(1, 12), _WORDS),
                min_size=1, max_size=7), _WORDS, st.integers(1, 7))
def test_rerank_orders_by_the_fused_score_of_every_candidate(tasks: list, prompt_words: str, k: int) -> None:
    cands = [_cand(i, _state(seed, off, n_samples=n), TaskTerms.of(TermCounts.from_texts([w] * n)))
             for i, (seed, off, n, w) in enumerate(tasks)]
    pt = TermCounts.from_texts([prompt_words])
    ans = routing.rerank_route(_state(99, 0.5, n_samples=1), cands, k=k, threshold=-1.0, prompt_terms=pt)
    lex = lexical_scores(pt, [c.terms for c in cands])
    ranks = routing.unwhitened_rank([routing.route_score(routing.unit_signature(_state(99, 0.5, n_samples=1)), c.state)
                                     for c in cands], cands)
    key = fuse(ranks, lex * routing.lexical_prior([c.state.n_samples for c in cands]))
    got = [m.task_id for m in ans.matches]
    assert len(got) == min(k, len(cands))
    assert all(0.0 <= m.lexical <= 1.0 for m in ans.matches)
    assert [round(float(key[i]), 6) for i in got] == sorted((round(float(x), 6) for x in key), reverse=True)[:len(got)]
