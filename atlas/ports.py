"""Interfaces the query services need from the model side, implemented in ``workers``.

``atlas`` never imports a model: routing asks a :class:`PromptSketcher` for the states of its prompts.
Two implementations exist (``workers.prompt_batcher.InProcessPromptSketcher``: the model in this
process, one micro-batching loop; ``workers.prompt_remote.RedisPromptSketcher``: prompts travel to
worker processes over Redis), chosen by the composition root (``service.container``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from atlas.models import Space
    from fishersketch import SketchState


class PromptStates(list["SketchState"]):
    """The states of a batch of prompts (a list, in order) with their novelty vectors and truncation flags beside
    them.

    Attributes
    ----------
    novelty : ndarray, shape (n, r), float32, or None
        Each prompt's projected mean head input (:mod:`atlas.novelty`); ``None`` when the sketcher did not
        send them (a worker of an earlier version): the novelty test is then skipped.
    truncated : tuple of bool, length n, or None
        Whether each prompt was cut to the worker's token limit (``max_tokens_per_sample``: its first tokens
        were sketched); ``None`` when the sketcher did not say (a worker of an earlier version).
    """

    novelty: np.ndarray | None = None
    truncated: tuple[bool, ...] | None = None

    @classmethod
    def of(cls, states: Sequence[SketchState], novelty: np.ndarray | None,
           truncated: Sequence[bool] | None = None) -> PromptStates:
        """``states`` with ``novelty`` and ``truncated`` (rows in the same order; ``None`` or a row count that
        differs: none)."""
        out = cls(states)
        if novelty is not None and len(novelty) == len(out):
            out.novelty = np.asarray(novelty, dtype=np.float32)
        if truncated is not None and len(truncated) == len(out):
            out.truncated = tuple(bool(t) for t in truncated)
        return out

    def part(self, start: int, stop: int) -> PromptStates:
        """Prompts ``start:stop`` with their vectors and flags."""
        return PromptStates.of(self[start:stop], None if self.novelty is None else self.novelty[start:stop],
                               None if self.truncated is None else self.truncated[start:stop])


@dataclass(frozen=True)
class SpaceKey:
    """What a worker must serve to sketch for a space: its model and sketch spec.

    Attributes
    ----------
    space_id : int
    model_name : str
        For messages ("no worker serves model ...").
    model_fingerprint, spec_fingerprint : str
    spec : dict
        ``SketchSpec.to_dict()`` of the space (to read states back).
    """

    space_id: int
    model_name: str
    model_fingerprint: str
    spec_fingerprint: str
    spec: dict[str, Any]

    @property
    def serving_key(self) -> str:
        """Short stable name of (model, spec): the queue every worker of this pair listens on."""
        raw = f"{self.model_fingerprint}|{self.spec_fingerprint}".encode()
        return hashlib.blake2b(raw, digest_size=8).hexdigest()

    @classmethod
    def of(cls, space: Space) -> SpaceKey:
        """The key of a space row."""
        return cls(int(space.id), str(space.model_name), str(space.model_fingerprint), str(space.spec_fingerprint),
                   dict(space.spec))


def serving_key(model_fingerprint: str, spec_fingerprint: str) -> str:
    """:attr:`SpaceKey.serving_key` from the two fingerprints (what a worker announces)."""
    return SpaceKey(0, "", model_fingerprint, spec_fingerprint, {}).serving_key


@runtime_checkable
class PromptSketcher(Protocol):
    """Turns prompts into FisherSketch states with a space's model.

    Implementations batch concurrent calls. Errors are domain errors: ``ModelUnavailable`` (503, no
    model or worker serves the space — raised at once, never after a hang; a worker of its model may come up),
    ``IncompatibleSpace`` (409, an in-process sketcher whose one model or sketch spec is not the space's: waiting
    cannot help), ``QueueFull`` (429, with
    ``retry_after_s`` computed from the queue), ``PayloadTooLarge`` (413, more prompts in one request than
    the queue ever admits), ``InvalidInput`` (422, a prompt that cannot be sketched, e.g. under 2 tokens, its
    index in ``detail``).
    """

    def check_served(self, space: SpaceKey) -> None:
        """Raise ``ModelUnavailable`` (or ``IncompatibleSpace``, see the class) unless some model of this service can
        sketch for ``space``."""
        ...

    async def sketch(self, space: SpaceKey, prompts: Sequence[str]) -> list[SketchState]:
        """One state per prompt (text mode: every next-token position of the prompt); a :class:`PromptStates`
        when the implementation also sends the prompts' novelty vectors and truncation flags."""
        ...

    def stats(self) -> dict[str, Any]:
        """Queue depth, batches run, mean batch size (for ``/metrics`` and ``/readyz``)."""
        ...

    def close(self) -> None:
        """Stop background loops and release connections."""
        ...


def check_prompt_lengths(prompts: Sequence[str], max_chars: int) -> None:
    """Raise ``PayloadTooLarge`` (413) for a prompt over ``max_chars`` characters."""
    from atlas.errors import PayloadTooLarge

    for i, p in enumerate(prompts):
        if len(p) > max_chars:
            raise PayloadTooLarge(
                f"prompt {i} has {len(p)} characters; the limit is {max_chars}",
                {"prompt": i, "chars": len(p), "max_prompt_chars": max_chars},
            )
