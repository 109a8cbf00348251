"""Exceptions raised by :mod:`fishersketch`.

All of them derive from :class:`ValueError`, so callers that only distinguish "bad input" from
"bug" can catch ``ValueError``; callers that want to react to a specific condition catch the
subclass.
"""

from __future__ import annotations

__all__ = ["CorruptState", "SketchError", "SpecMismatch"]


class SketchError(ValueError):
    """Invalid input to a sketch operation (wrong shape, NaN/Inf, bad dtype, bad parameter)."""


class SpecMismatch(SketchError):
    """Two objects built from different :class:`~fishersketch.SketchSpec` were combined.

    Raised when merging states of different specs, when updating a state with a
    :class:`~fishersketch.Sketcher` of another spec, when aligning such states, and by
    :meth:`~fishersketch.SketchState.from_bytes` when the blob's spec is not the expected one.
    """


class CorruptState(SketchError):
    """A serialized state could not be decoded (bad magic, truncated, checksum mismatch, bad header)."""
