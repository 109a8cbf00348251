"""A task's lexical record and what a job adds to it: the blob format of ``task_lexicon`` (no SQL here).

:class:`LexicalRecord` holds a task's term counts (:mod:`atlas.lexical`) and template (:mod:`atlas.template`)
in one blob; :class:`LexicalDelta` is a job's contribution, computed from its samples' routing texts
(:func:`routing_text`) and template texts (:func:`template_text`). :mod:`atlas.lexicon_repo` stores and reads
the records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from atlas.lexical import TaskTerms, TermCounts, term_hashes
from atlas.samples import Sample
from atlas.template import TaskTemplate, counted, presence


def routing_text(sample: Sample, mode: str) -> str | None:
    """What a prompt routed to the task is compared with: the ``prompt`` of a completion-mode sample
    (a prompt has no answer), the text (or prompt + completion) of a text-mode one."""
    if mode == "completion":
        return sample.prompt
    return sample.text if sample.text is not None else (sample.prompt or "") + (sample.completion or "")


def template_text(sample: Sample) -> str | None:
    """What a sample brings to its task's template: its ``prompt`` when it has one (a prompt routed to the
    task has no completion, so a term every completion shares must not be required of it), else its text."""
    return sample.prompt if sample.prompt is not None else sample.text


_RECORD = b"FALR1"
_RECORD_SAMPLES = b"FALR2"
"""A record with its per-term sample counts (a completion task's, since 2026-11-28)."""


@dataclass(frozen=True)
class LexicalDelta:
    """What a job adds to its task's record, computed outside the final transaction: the term ``counts`` of
    its samples' routing texts, each sample's :func:`atlas.template.presence`, and — for a completion-mode task —
    ``sample_counts``, how many of its samples' routing texts hold each term."""

    counts: TermCounts
    presences: list[np.ndarray | None]
    sample_counts: TermCounts | None = None

    @staticmethod
    def of_texts(texts: Sequence[str | None], template_texts: Sequence[str | None] | None = None, *,
                 per_sample: bool = False) -> LexicalDelta:
        """The delta of a job's routing ``texts`` (the template from ``template_texts``, default the same; each
        text is hashed once where both are the same string); ``per_sample``: with the per-term sample counts."""
        hashes = [term_hashes(t) if t else np.zeros(0, np.uint32) for t in texts]
        tpl = texts if template_texts is None else template_texts
        presences = [np.unique(h) if t == r and counted(t) else presence(t)
                     for h, r, t in zip(hashes, texts, tpl, strict=True)]
        held = None
        if per_sample:
            held = TermCounts.from_hashes(p if p is not None and t == r else np.unique(h)
                                          for h, p, r, t in zip(hashes, presences, texts, tpl, strict=True))
        return LexicalDelta(TermCounts.from_hashes(hashes), presences, held)

    @staticmethod
    def of_samples(samples: Sequence[Sample], mode: str) -> LexicalDelta:
        """The delta of a job's samples: counts of their :func:`routing_text`, template of their
        :func:`template_text`, and for a completion-mode task the per-term sample counts."""
        return LexicalDelta.of_texts([routing_text(s, mode) for s in samples], [template_text(s) for s in samples],
                                     per_sample=mode == "completion")


@dataclass(frozen=True)
class LexicalRecord:
    """What a task stores of its samples' words: term ``counts``, ``template`` (``None``: stored before
    templates existed — a bare :class:`atlas.lexical.TermCounts` blob — so the template test is off) and
    ``sample_counts`` (how many samples hold each term; kept for completion-mode tasks, whose profile weighs them;
    ``None``: a text task, or one stored before them, routed on its counts alone until re-derived)."""

    counts: TermCounts
    template: TaskTemplate | None
    sample_counts: TermCounts | None = None

    @staticmethod
    def empty() -> LexicalRecord:
        """The record of a task no job has added to yet."""
        return LexicalRecord(TermCounts.empty(), TaskTemplate.empty())

    def add(self, delta: LexicalDelta) -> LexicalRecord:
        """This record with a job's :class:`LexicalDelta` added (counts summed, template intersected; sample
        counts summed — a record without them stays without, unless it is empty: its earlier samples are not at
        hand)."""
        if self.sample_counts is not None and delta.sample_counts is not None:
            held: TermCounts | None = self.sample_counts.merge(delta.sample_counts)
        else:
            held = delta.sample_counts if not len(self.counts) and self.sample_counts is None else None
        return LexicalRecord(self.counts.merge(delta.counts),
                             None if self.template is None else self.template.add_presences(delta.presences),
                             held)

    def terms(self) -> TaskTerms:
        """The profile the ranking reads (:meth:`atlas.lexical.TaskTerms.of`)."""
        return TaskTerms.of(self.counts, self.sample_counts)

    def to_bytes(self) -> bytes:
        """Serialisation (``from_bytes`` inverts it; a record without template is a bare counts blob, one
        without sample counts a version-1 record)."""
        counts = self.counts.to_bytes()
        if self.template is None:
            return counts
        head = len(counts).to_bytes(4, "little") + counts
        if self.sample_counts is None:
            return _RECORD + head + self.template.to_bytes()
        template = self.template.to_bytes()
        return _RECORD_SAMPLES + head + len(template).to_bytes(4, "little") + template + self.sample_counts.to_bytes()

    @staticmethod
    def has_template(blob: bytes) -> bool:
        """Whether a stored blob is a record with a template (not a bare counts blob of before templates)."""
        return bytes(blob).startswith((_RECORD, _RECORD_SAMPLES))

    @staticmethod
    def from_bytes(blob: bytes) -> LexicalRecord:
        """Inverse of :meth:`to_bytes`; also reads a bare counts blob (no template).

        Raises
        ------
        ValueError
            Neither, or a corrupt one.
        """
        blob = bytes(blob)
        if not LexicalRecord.has_template(blob):
            return LexicalRecord(TermCounts.from_bytes(blob), None)
        counts, at = _part(blob, len(_RECORD))
        if blob.startswith(_RECORD):
            return LexicalRecord(TermCounts.from_bytes(counts), TaskTemplate.from_bytes(blob[at:]))
        template, at = _part(blob, at)
        return LexicalRecord(TermCounts.from_bytes(counts), TaskTemplate.from_bytes(template),
                             TermCounts.from_bytes(blob[at:]))


def _part(blob: bytes, at: int) -> tuple[bytes, int]:
    """The length-prefixed part of ``blob`` at ``at`` and the offset after it."""
    n = int.from_bytes(blob[at:at + 4], "little")
    if len(blob) < at + 4 or len(blob) < at + 4 + n:
        raise ValueError("corrupt lexical record (length)")
    return blob[at + 4:at + 4 + n], at + 4 + n
