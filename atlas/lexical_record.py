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

from atlas.lexical import TermCounts, term_hashes
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


@dataclass(frozen=True)
class LexicalDelta:
    """What a job adds to its task's record, computed outside the final transaction: the term ``counts`` of
    its samples' routing texts and each sample's :func:`atlas.template.presence`."""

    counts: TermCounts
    presences: list[np.ndarray | None]

    @staticmethod
    def of_texts(texts: Sequence[str | None], template_texts: Sequence[str | None] | None = None) -> LexicalDelta:
        """The delta of a job's routing ``texts`` (the template from ``template_texts``, default the same; each
        text is hashed once where both are the same string)."""
        hashes = [term_hashes(t) if t else np.zeros(0, np.uint32) for t in texts]
        tpl = texts if template_texts is None else template_texts
        presences = [np.unique(h) if t == r and counted(t) else presence(t)
                     for h, r, t in zip(hashes, texts, tpl, strict=True)]
        return LexicalDelta(TermCounts.from_hashes(hashes), presences)

    @staticmethod
    def of_samples(samples: Sequence[Sample], mode: str) -> LexicalDelta:
        """The delta of a job's samples: counts of their :func:`routing_text`, template of their
        :func:`template_text`."""
        return LexicalDelta.of_texts([routing_text(s, mode) for s in samples], [template_text(s) for s in samples])


@dataclass(frozen=True)
class LexicalRecord:
    """What a task stores of its samples' words: term ``counts`` and ``template`` (``None``: stored before
    templates existed — a bare :class:`atlas.lexical.TermCounts` blob — so the template test is off)."""

    counts: TermCounts
    template: TaskTemplate | None

    def add(self, delta: LexicalDelta) -> LexicalRecord:
        """This record with a job's :class:`LexicalDelta` added (counts summed, template intersected)."""
        return LexicalRecord(self.counts.merge(delta.counts),
                             None if self.template is None else self.template.add_presences(delta.presences))

    def to_bytes(self) -> bytes:
        """Serialisation (``from_bytes`` inverts it; a record without template is a bare counts blob)."""
        counts = self.counts.to_bytes()
        if self.template is None:
            return counts
        return _RECORD + len(counts).to_bytes(4, "little") + counts + self.template.to_bytes()

    @staticmethod
    def has_template(blob: bytes) -> bool:
        """Whether a stored blob is a record with a template (not a bare counts blob of before templates)."""
        return bytes(blob).startswith(_RECORD)

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
        head = len(_RECORD) + 4
        n = int.from_bytes(blob[len(_RECORD):head], "little")
        if len(blob) < head + n:
            raise ValueError("corrupt lexical record (length)")
        return LexicalRecord(TermCounts.from_bytes(blob[head:head + n]), TaskTemplate.from_bytes(blob[head + n:]))
