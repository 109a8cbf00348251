"""A task's *template*: the terms every one of its samples contains, and the open-set test built on it.

Many tasks are defined by a fixed wording around varying content — an instruction header, a question
frame, a label list ("The native language of X is ___ .", "… describe a set of five objects …",
"Answer:"). A prompt that lacks a term every sample of the answered task has is not that task's prompt,
however close its Fisher geometry (docs/SCORES.md, "Open set: template test").

Template
    ``K = {terms in every counted sample}`` (the terms of :func:`atlas.lexical.terms`, hashed; a pair's
    prompt, :func:`atlas.lexicon_repo.template_text`). A sample is counted when it has a text that is not
    blank; a text without any term (``"x = 1"``, ``"?"``) counts and empties ``K`` — a prompt like it
    has no term either. It is
    kept as the intersection over jobs, so an append needs only the stored keys and the new samples:
    ``K ← K ∩ (terms in every new sample)``. At most ``MAX_TEMPLATE`` keys are kept (the smallest hashes
    when a very long single sample would exceed it): a subset of the true ``K`` only ever makes the
    test more lenient.
Leave-one-out checks
    Each new sample is checked against the terms that *every other* counted sample contains (the stored
    ``K`` and the job's other samples): it is a *miss* if it lacks one. ``checks`` and ``misses`` are
    summed over jobs. ``(misses + 1) / (checks + 2)`` (Laplace's rule of succession) estimates how often
    a new prompt of the task lacks a template term.
Test
    *Active* when that estimate is at most ``TEMPLATE_FALSE_REJECT`` (≥ 48 checks without a miss) and
    ``K`` is not empty. An active template rejects ("none") a prompt routed to the task that lacks any
    term of ``K``, with confidence ``1 −`` the estimate. Free-text tasks (no term in every sample, or
    frequent misses) never activate it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from atlas.lexical import TermCounts, term_hashes

MAX_TEMPLATE = 4096
"""Template keys kept per task."""
TEMPLATE_FALSE_REJECT = 0.02
"""Largest estimated rate of in-task prompts lacking a template term at which the test is active."""
_HEAD = struct.Struct("<4sIIII")
_MAGIC = b"FAT1"


def presence(text: str | None) -> np.ndarray | None:
    """The distinct hashed terms of ``text``, sorted, shape (n,) uint32; ``None`` (not counted) for ``None`` or a
    blank text. A text without terms gives an empty array: it is counted."""
    if text is None or not counted(text):
        return None
    return np.unique(term_hashes(text))


def counted(text: str | None) -> bool:
    """Whether a sample's text counts in its task's template: present and not blank."""
    return text is not None and bool(text.strip())


@dataclass(frozen=True)
class TaskTemplate:
    """The terms in every counted sample (``keys``, sorted uint32), over ``docs`` samples, with the
    leave-one-out ``checks`` and ``misses`` (module notes)."""

    keys: np.ndarray
    docs: int = 0
    checks: int = 0
    misses: int = 0

    @staticmethod
    def empty() -> TaskTemplate:
        """No sample counted yet."""
        return TaskTemplate(np.zeros(0, np.uint32))

    @staticmethod
    def of_texts(texts: Iterable[str | None]) -> TaskTemplate:
        """The template of one batch of samples (``None`` and blank texts are not counted)."""
        return TaskTemplate.empty().add(texts)

    def add(self, texts: Iterable[str | None]) -> TaskTemplate:
        """This template with a job's samples added (:meth:`add_presences` of their :func:`presence`)."""
        return self.add_presences([presence(t) for t in texts])

    def add_presences(self, presences: Sequence[np.ndarray | None]) -> TaskTemplate:
        """This template with a job's samples added, given as their :func:`presence` arrays (``None``: not
        counted): keys intersected, each new sample checked against every other counted sample (module notes)."""
        sets = [p for p in presences if p is not None]
        m = len(sets)
        if m == 0:
            return self
        if self.docs:  # only the stored keys can stay in the template (or be missed)
            uniq = self.keys
            counts = np.sum([np.isin(uniq, s) for s in sets], axis=0)
        else:
            uniq, counts = np.unique(np.concatenate(sets), return_counts=True)
        keys = uniq[counts == m]
        # a sample misses if it lacks a term every other counted sample has (the stored keys and
        # m − 1 of the new samples); with no other sample at all there is nothing to check
        near = uniq[counts == m - 1]
        others = self.docs + m - 1
        misses = sum(bool(near.size) and not bool(np.all(np.isin(near, s))) for s in sets) if others else 0
        if keys.size > MAX_TEMPLATE:
            keys = keys[:MAX_TEMPLATE]
        return TaskTemplate(keys.astype(np.uint32), self.docs + m, self.checks + (m if others else 0),
                            self.misses + int(misses))

    @property
    def false_reject(self) -> float:
        """Estimated share of the task's prompts lacking a template term, ``(misses + 1) / (checks + 2)``."""
        return (self.misses + 1) / (self.checks + 2)

    @property
    def active(self) -> bool:
        """Whether the test applies (module notes)."""
        return bool(self.keys.size) and self.false_reject <= TEMPLATE_FALSE_REJECT

    def missing(self, prompt: TermCounts) -> int:
        """How many template terms the prompt's terms lack (0 when the test is not active)."""
        if not self.active:
            return 0
        return int(np.count_nonzero(~np.isin(self.keys, prompt.keys)))

    def to_bytes(self) -> bytes:
        """Serialisation (``from_bytes`` inverts it)."""
        return _HEAD.pack(_MAGIC, self.docs, self.checks, self.misses, self.keys.size) + \
            self.keys.astype("<u4").tobytes()

    @staticmethod
    def from_bytes(blob: bytes) -> TaskTemplate:
        """Inverse of :meth:`to_bytes`.

        Raises
        ------
        ValueError
            Not a template blob, or a corrupt one.
        """
        if len(blob) < _HEAD.size:
            raise ValueError("not a template blob")
        magic, docs, checks, misses, n = _HEAD.unpack_from(blob)
        if magic != _MAGIC:
            raise ValueError("not a template blob")
        body = bytes(blob[_HEAD.size:])
        if len(body) != 4 * n or misses > checks or checks > docs:
            raise ValueError("corrupt template blob")
        keys = np.frombuffer(body, dtype="<u4").astype(np.uint32)
        if n > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise ValueError("corrupt template blob (keys not sorted)")
        return TaskTemplate(keys, docs, checks, misses)
