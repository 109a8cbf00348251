"""Lexical evidence for routing: a task's term counts and the hybrid (Fisher + lexical) ranking.

FisherSketch compares a prompt with a task through the model's head-gradient geometry; it is best
where tasks differ by *format* (a question type, a label set, a template) and weakest where they
differ by *topic* only (49 MMLU subjects: the same question format, different vocabulary). A sparse
lexical score is strong exactly there and weak on format. The hybrid of a dense and a sparse score
is the standard answer of retrieval systems (semantic-router's ``HybridRouter``, Elasticsearch and
Weaviate hybrid search); here the two are fused per prompt over the re-ranked candidates.

Terms
    The text is NFC-normalised and lower-cased. Tokens are words of two or more characters (word
    characters with their combining marks, so Devanagari, Thai or decomposed accents are not split at a
    vowel sign; ``\\w\\w+``, the scikit-learn default, for text without marks) and, in scripts written
    without spaces between words (Han, kana, Thai, Lao, Khmer, Myanmar), the overlapping character bigrams of
    each run (a single character alone): a whole Chinese clause is not one term. Terms are the tokens and
    the pairs of adjacent tokens, each hashed to 32 bits (CRC-32 of its UTF-8 bytes).
    A task keeps the counts of its samples' terms, summed over every job (appends add theirs), up to
    ``MAX_TERMS`` distinct terms (the most frequent; a task that outgrows the cap keeps its most
    frequent terms, so an append can change which of the rare ones are kept).
Completion-mode tasks
    Their samples' prompts are *instances* of one task — a passage and a question, a premise and a
    hypothesis — whose topic words change from sample to sample, so a task's profile must not be the topics of
    the passages it happened to see. Such a task also keeps, per term, how many of its samples hold it
    (``s_k``, summed over jobs like the counts), and its profile weighs a term by ``min(1, s_k / 2)``:
    a term of a single sample counts half, one that recurs counts fully (``RECURRING_SAMPLES``).
    A text-mode task's samples *are* its domain: every word counts (measured on 105 instruction tasks
    and three SuperGLUE completion tasks, bench/results/quality.md, 4b).
Lexical score
    ``lex(p, t) = ⟨q̂_p, t̂⟩ ∈ [0, 1]``: the cosine between the prompt's tf-idf vector
    ``q_k = (1 + ln tf_p,k) · idf_k`` and the task's log-tf vector ``t_k = 1 + ln tf_t,k`` (for a completion
    task ``(1 + ln tf_t,k) · min(1, s_k / 2)``), with
    ``idf_k = ln((1 + C) / (1 + df_k)) + 1`` over the ``C`` candidates being ranked (``df_k``: how many
    of them contain term ``k``). The idf is local to the candidates: a term every candidate shares
    carries little weight, and no space-wide statistics need maintaining. It is taken at the
    ranking's evidence prior ``√(n_s / (n_s + κ))`` like the Fisher ranking, so a task of a few
    samples cannot take prompts by a few shared words.
Fusion
    ``fused = z(rank) + z(lex · prior)``: each score standardised over the prompt's candidates (mean 0,
    unit standard deviation; 0 where a score does not vary), equal weights. Standardising makes the
    two scales comparable without a tuned weight; ties keep the Fisher order. The open-set decision
    does not use it (docs/SCORES.md, "Lexical evidence").
"""

from __future__ import annotations

import itertools
import re
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import regex

MAX_TERMS = 65_536
"""Distinct terms kept per task (the most frequent)."""
RECURRING_SAMPLES = 2
"""Samples a term must appear in to weigh fully in a completion task's profile (fewer: in proportion)."""
_ASCII_WORD = re.compile(r"\w\w+")
_UNSPACED = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\u30fc"
_TOKEN = regex.compile(rf"(?V1)([{_UNSPACED}][{_UNSPACED}\p{{M}}]*)|([[\w\p{{M}}\p{{N}}]--[{_UNSPACED}]]+)")
"""A run of a script written without spaces (group 1), or a word: letters, marks, digits, ``_`` (group 2)."""
_MAGIC = b"FALX1"


_LONG_MARK_RUN = regex.compile(r"\p{M}{31,}")
"""A run of more than 30 combining marks (Unicode's stream-safe bound, UAX #15)."""


def nfc(text: str) -> str:
    """``unicodedata.normalize("NFC", text)``, in time linear in a run of combining marks. NFC puts each run of
    non-starters in canonical order with an insertion sort: a run in descending class is quadratic (one route prompt
    of 20,000 marks took 0.9 s against 0.04 s for plain text), a run already in order linear. A long run is put in
    canonical order first — each mark decomposed, and each stretch of non-starters sorted stably by combining class,
    which is canonical ordering itself — so NFC finds it in order; the result is NFC's, for every text."""
    if unicodedata.is_normalized("NFC", text):
        return text
    return unicodedata.normalize("NFC", _LONG_MARK_RUN.sub(_canonical_order, text))


def _canonical_order(run: regex.Match[str]) -> str:
    """A run of marks decomposed and put in canonical order (stable by combining class between starters)."""
    marks = "".join(unicodedata.normalize("NFD", mark) for mark in run.group())
    out: list[str] = []
    stretch: list[str] = []
    for mark in marks:
        if unicodedata.combining(mark):
            stretch.append(mark)
            continue
        out.extend(sorted(stretch, key=unicodedata.combining))
        stretch = []
        out.append(mark)
    out.extend(sorted(stretch, key=unicodedata.combining))
    return "".join(out)


def tokens(text: str) -> list[str]:
    """The tokens of ``text`` in order (see the module notes): words of two or more characters, and the
    character bigrams of each run of a script written without spaces."""
    if text.isascii():  # the common case, and the same tokens as below: no marks, no unspaced script
        return _ASCII_WORD.findall(text.lower())
    out: list[str] = []
    for run, word in _TOKEN.findall(nfc(text).lower()):
        if word:
            if len(word) > 1:
                out.append(word)
        elif len(run) == 1:
            out.append(run)
        else:
            out.extend(run[i:i + 2] for i in range(len(run) - 1))
    return out


def terms(text: str) -> list[str]:
    """The :func:`tokens` of ``text`` and the pairs of adjacent tokens."""
    words = tokens(text)
    return words + [f"{a} {b}" for a, b in itertools.pairwise(words)]


def term_hashes(text: str) -> np.ndarray:
    """CRC-32 hashes of :func:`terms`, shape (n_terms,), uint32."""
    return np.fromiter((zlib.crc32(t.encode("utf-8")) for t in terms(text)), dtype=np.uint32)


@dataclass(frozen=True)
class TermCounts:
    """Term counts of a set of texts: sorted unique hashed ``keys`` (n,) uint32 and their ``counts`` (n,) uint32."""

    keys: np.ndarray
    counts: np.ndarray

    @staticmethod
    def empty() -> TermCounts:
        """No terms."""
        return TermCounts(np.zeros(0, np.uint32), np.zeros(0, np.uint32))

    @staticmethod
    def from_texts(texts: Iterable[str | None]) -> TermCounts:
        """Counts of the terms of every text (``None`` and empty texts count nothing), capped at ``MAX_TERMS``."""
        return TermCounts.from_hashes(term_hashes(t) for t in texts if t)

    @staticmethod
    def from_hashes(hashes: Iterable[np.ndarray]) -> TermCounts:
        """Counts of the hashed terms of every text (:func:`term_hashes` arrays), capped at ``MAX_TERMS``."""
        out, batch = TermCounts.empty(), []
        for h in hashes:
            if h.size:
                batch.append(h)
            if len(batch) >= 4096:
                out, batch = out.merge(TermCounts._of(np.concatenate(batch))), []
        return out.merge(TermCounts._of(np.concatenate(batch))) if batch else out

    @staticmethod
    def _of(hashes: np.ndarray) -> TermCounts:
        keys, counts = np.unique(hashes, return_counts=True)
        return TermCounts(keys.astype(np.uint32), counts.astype(np.uint32))

    def __len__(self) -> int:
        return int(self.keys.size)

    def merge(self, other: TermCounts) -> TermCounts:
        """Summed counts of both (exact below the cap), capped at ``MAX_TERMS`` most frequent terms."""
        if not len(other):
            return self
        if not len(self):
            return other._capped()
        keys = np.concatenate([self.keys, other.keys])
        counts = np.concatenate([self.counts, other.counts]).astype(np.uint64)
        uniq, inv = np.unique(keys, return_inverse=True)
        summed = np.bincount(inv, weights=counts, minlength=uniq.size)
        summed = np.minimum(summed, np.iinfo(np.uint32).max)
        return TermCounts(uniq.astype(np.uint32), summed.astype(np.uint32))._capped()

    def _capped(self) -> TermCounts:
        if len(self) <= MAX_TERMS:
            return self
        keep = np.lexsort((self.keys, -self.counts.astype(np.int64)))[:MAX_TERMS]
        keep.sort()
        return TermCounts(self.keys[keep], self.counts[keep])

    def to_bytes(self) -> bytes:
        """Compact, compressed serialisation (``from_bytes`` inverts it)."""
        body = self.keys.astype("<u4").tobytes() + self.counts.astype("<u4").tobytes()
        return _MAGIC + len(self).to_bytes(4, "little") + zlib.compress(body, 6)

    @staticmethod
    def from_bytes(blob: bytes) -> TermCounts:
        """Inverse of :meth:`to_bytes`.

        Raises
        ------
        ValueError
            Not a term-count blob, or a corrupt one.
        """
        head = len(_MAGIC) + 4
        if len(blob) < head or bytes(blob[:len(_MAGIC)]) != _MAGIC:
            raise ValueError("not a term-count blob")
        n = int.from_bytes(blob[len(_MAGIC):head], "little")
        if n > MAX_TERMS:
            raise ValueError(f"corrupt term-count blob ({n} terms, at most {MAX_TERMS})")
        try:  # bounded: an imported blob could inflate ~1000x (a zlib bomb) before the length check
            inflate = zlib.decompressobj()
            body = inflate.decompress(bytes(blob[head:]), 8 * n + 1)
        except zlib.error as exc:
            raise ValueError(f"corrupt term-count blob ({exc})") from None
        if len(body) != 8 * n or not inflate.eof:
            raise ValueError("corrupt term-count blob (length)")
        keys = np.frombuffer(body[:4 * n], dtype="<u4").astype(np.uint32)
        counts = np.frombuffer(body[4 * n:], dtype="<u4").astype(np.uint32)
        if n > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise ValueError("corrupt term-count blob (keys not sorted)")
        return TermCounts(keys, counts)


@dataclass(frozen=True)
class TaskTerms:
    """What the ranking reads of a task's counts: sorted ``keys`` (n,) uint32 and unit log-tf ``weights`` (n,)
    float32."""

    keys: np.ndarray
    weights: np.ndarray

    @staticmethod
    def of(counts: TermCounts, sample_counts: TermCounts | None = None) -> TaskTerms:
        """Unit ``1 + ln tf`` weights of the ``counts``; with ``sample_counts`` (how many samples hold each term: a
        completion task's), each weight times ``min(1, s / RECURRING_SAMPLES)`` — a term missing from them (past
        their cap) is taken as held by one sample."""
        w = 1.0 + np.log(np.maximum(counts.counts.astype(np.float64), 1.0))
        if sample_counts is not None and w.size:
            held = np.ones(w.size)
            if len(sample_counts):
                pos = np.minimum(np.searchsorted(sample_counts.keys, counts.keys), len(sample_counts) - 1)
                found = sample_counts.keys[pos] == counts.keys
                held = np.where(found, np.maximum(sample_counts.counts[pos].astype(np.float64), 1.0), 1.0)
            w = w * np.minimum(1.0, held / RECURRING_SAMPLES)
        norm = float(np.linalg.norm(w))
        return TaskTerms(counts.keys, ((w / norm) if norm > 0 else w).astype(np.float32))


def lexical_scores(prompt: TermCounts, tasks: Sequence[TaskTerms]) -> np.ndarray:
    """Lexical scores ``lex(p, t)`` in [0, 1] of one prompt for each task, shape (len(tasks),).

    The idf is computed over ``tasks`` (see the module notes); 0 for a prompt without terms.
    """
    n = len(tasks)
    out = np.zeros(n)
    if not len(prompt) or n == 0:
        return out
    tf = np.zeros((n, len(prompt)))
    for i, t in enumerate(tasks):
        if t.keys.size == 0:
            continue
        pos = np.minimum(np.searchsorted(t.keys, prompt.keys), t.keys.size - 1)
        hit = t.keys[pos] == prompt.keys
        tf[i] = np.where(hit, t.weights[pos], 0.0)
    df = np.count_nonzero(tf, axis=0)
    q = (1.0 + np.log(prompt.counts.astype(np.float64))) * (np.log((1.0 + n) / (1.0 + df)) + 1.0)
    q /= float(np.linalg.norm(q))
    return np.asarray(np.clip(tf @ q, 0.0, 1.0))


def standardised(x: np.ndarray) -> np.ndarray:
    """``(x − mean) / std`` over the entries, shape as ``x``; zeros where ``x`` does not vary."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    sd = float(x.std())
    return np.asarray((x - x.mean()) / sd) if sd > 1e-12 else np.zeros_like(x)


def fuse(rank: np.ndarray, lexical: np.ndarray) -> np.ndarray:
    """Hybrid ordering score ``z(rank) + z(lexical)`` over one prompt's candidates, shape (T,).

    ``rank`` (T,) the Fisher ranking scores, ``lexical`` (T,) the prior-weighted lexical scores. Only the
    order is meaningful (a sum of standard scores, no fixed range).
    """
    return np.asarray(standardised(rank) + standardised(lexical))


def hybrid_key(rank: np.ndarray, prompt: TermCounts, tasks: Sequence[TaskTerms], prior: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(fused order key, lexical scores)`` of one prompt's candidates, shapes (T,), (T,): :func:`fuse` of the
    ranking scores ``rank`` (T,) and the :func:`lexical_scores` taken at the evidence ``prior`` (T,)."""
    lex = lexical_scores(prompt, tasks)
    return fuse(rank, lex * np.asarray(prior, dtype=np.float64)), lex
