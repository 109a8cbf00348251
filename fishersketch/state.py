"""Mergeable streaming state of one task: A/B split sums of the three feature maps.

Layout (``m`` = sketch dimension; split 0 = A, 1 = B; feature 0 = ae, 1 = a, 2 = e):

``sums``           float64 (2, 3, m)   Σ ψ_f over the draws of each split
``sq_norms``       float64 (2, 3)      Σ ‖ψ_f‖² over the draws of each split (for the U-statistic)
``token_counts``   int64 (2,)          tokens per split
``sample_counts``  int64 (2,)          samples per split

A *draw* is one feature vector: a token for ``granularity="token"``, a sample for ``"sequence"``.
Every field is a sum, so :meth:`SketchState.merge` is elementwise addition (associative and
commutative up to float64 rounding). Sample counts: by default each ``update`` call adds the number of
distinct sample ids it saw, so a sample whose tokens are split over several calls or shards is counted
once per piece (token counts and sums are unaffected); ``update(..., sample_starts=...)`` and
:meth:`fishersketch.Sketcher.stream` count each sample exactly once (at its first token, or, for
sequence granularity, when its draw is added).
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Literal

import numpy as np

from fishersketch.errors import CorruptState, SketchError, SpecMismatch
from fishersketch.spec import SketchSpec

__all__ = ["FEATURES", "FORMAT_VERSION", "SPLITS", "SketchState"]

FEATURES: tuple[str, str, str] = ("ae", "a", "e")
"""Feature order of the second axis of :attr:`SketchState.sums`."""
SPLITS: tuple[str, str] = ("A", "B")
"""Split order of the first axis of :attr:`SketchState.sums`."""

FORMAT_VERSION = 1
"""Version of the :meth:`SketchState.to_bytes` layout."""

_MAGIC = b"FSKS"
_PREFIX = struct.Struct("<4sHHI")  # magic, format version, reserved, header length
_DIGEST = 32  # blake2b digest bytes at the end of the blob

Feature = Literal["ae", "a", "e"]


def _feature_index(feature: str) -> int:
    try:
        return FEATURES.index(feature)
    except ValueError:
        raise SketchError(f"feature must be one of {FEATURES}, got {feature!r}") from None


def _split_index(split: str | int) -> int:
    if split in (0, "A", "a"):
        return 0
    if split in (1, "B", "b"):
        return 1
    raise SketchError(f"split must be 'A' or 'B', got {split!r}")


class SketchState:
    """Streaming sums of one task under one :class:`SketchSpec`.

    Create with :meth:`empty`, fill with :meth:`fishersketch.Sketcher.update`, combine with
    :meth:`merge`, persist with :meth:`to_bytes` / :meth:`from_bytes`.

    Parameters
    ----------
    spec : SketchSpec
    sums : np.ndarray, float64 (2, 3, m)
    sq_norms : np.ndarray, float64 (2, 3)
    token_counts : np.ndarray, int64 (2,)
    sample_counts : np.ndarray, int64 (2,)
    """

    __slots__ = ("sample_counts", "spec", "sq_norms", "sums", "token_counts")

    def __init__(self, spec: SketchSpec, sums: np.ndarray, sq_norms: np.ndarray, token_counts: np.ndarray,
                 sample_counts: np.ndarray) -> None:
        if not isinstance(spec, SketchSpec):  # an AttributeError on spec.m before
            raise SketchError(f"spec must be a SketchSpec, got {type(spec).__name__}")
        m = spec.m
        self.spec = spec
        self.sums = np.ascontiguousarray(sums, dtype=np.float64)
        self.sq_norms = np.ascontiguousarray(sq_norms, dtype=np.float64)
        self.token_counts = np.ascontiguousarray(token_counts, dtype=np.int64)
        self.sample_counts = np.ascontiguousarray(sample_counts, dtype=np.int64)
        if self.sums.shape != (2, 3, m) or self.sq_norms.shape != (2, 3):
            raise SketchError(f"state arrays have shapes {self.sums.shape}, {self.sq_norms.shape}; "
                              f"expected (2, 3, {m}) and (2, 3)")
        if self.token_counts.shape != (2,) or self.sample_counts.shape != (2,):
            raise SketchError("state counts must have shape (2,)")
        # what from_bytes refuses, refused here too: a NaN sum aligned as "zero data" (fisher 0, s_ae NaN), a
        # negative count gave n = -10
        if not (np.all(np.isfinite(self.sums)) and np.all(np.isfinite(self.sq_norms))):
            raise SketchError("state sums and squared norms must be finite")
        if np.any(self.sq_norms < 0) or np.any(self.token_counts < 0) or np.any(self.sample_counts < 0):
            raise SketchError("state squared norms and counts must be ≥ 0")

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def empty(cls, spec: SketchSpec) -> SketchState:
        """A state with no draws.

        Parameters
        ----------
        spec : SketchSpec

        Returns
        -------
        SketchState
        """
        if not isinstance(spec, SketchSpec):
            raise SketchError(f"spec must be a SketchSpec, got {type(spec).__name__}")
        return cls(spec, np.zeros((2, 3, spec.m)), np.zeros((2, 3)), np.zeros(2, np.int64), np.zeros(2, np.int64))

    def copy(self) -> SketchState:
        """Deep copy."""
        return SketchState(self.spec, self.sums.copy(), self.sq_norms.copy(), self.token_counts.copy(),
                           self.sample_counts.copy())

    # -- counts --------------------------------------------------------------------------------------

    @property
    def m(self) -> int:
        """Sketch dimension."""
        return self.spec.m

    @property
    def n_tokens(self) -> int:
        """Tokens over both splits."""
        return int(self.token_counts.sum())

    @property
    def n_samples(self) -> int:
        """Samples over both splits (see the module notes on how pieces of a sample are counted)."""
        return int(self.sample_counts.sum())

    def draw_counts(self) -> np.ndarray:
        """Draws per split (tokens for token granularity, samples for sequence granularity).

        Returns
        -------
        np.ndarray, int64 (2,)
        """
        return self.token_counts if self.spec.granularity == "token" else self.sample_counts

    @property
    def n_draws(self) -> int:
        """Draws over both splits (the ``n`` of the U-statistic)."""
        return int(self.draw_counts().sum())

    # -- accessors ------------------------------------------------------------------------------------

    def feature_sum(self, feature: Feature = "ae", split: str | None = None) -> np.ndarray:
        """Σ ψ_f over one split or both.

        Parameters
        ----------
        feature : {"ae", "a", "e"}
        split : {"A", "B"}, optional
            Both splits when omitted.

        Returns
        -------
        np.ndarray, float64 (m,)
        """
        f = _feature_index(feature)
        if split is None:
            total: np.ndarray = self.sums[0, f] + self.sums[1, f]
            return total
        one: np.ndarray = self.sums[_split_index(split), f].copy()
        return one

    def mean(self, feature: Feature = "ae", split: str | None = None) -> np.ndarray:
        """Mean embedding μ_f = Σ ψ_f / n over one split or both (zeros when there are no draws).

        Parameters
        ----------
        feature : {"ae", "a", "e"}
        split : {"A", "B"}, optional

        Returns
        -------
        np.ndarray, float64 (m,)
        """
        counts = self.draw_counts()
        n = int(counts.sum()) if split is None else int(counts[_split_index(split)])
        s = self.feature_sum(feature, split)
        return s / n if n > 0 else np.zeros_like(s)

    @property
    def has_signature(self) -> bool:
        """False when the state has no draws or μ_ae is exactly zero (then :meth:`signature` is zeros)."""
        return self.n_draws > 0 and bool(np.any(self.feature_sum("ae") != 0.0))

    def signature(self) -> np.ndarray:
        """Unit-norm task signature μ_ae / ‖μ_ae‖ in float32.

        Returns
        -------
        np.ndarray, float32 (m,)
            All zeros when :attr:`has_signature` is False (never NaN).
        """
        mu = self.feature_sum("ae")
        norm = float(np.linalg.norm(mu))
        if self.n_draws == 0 or not np.isfinite(norm) or norm == 0.0:
            return np.zeros(self.m, dtype=np.float32)
        return (mu / norm).astype(np.float32)

    # -- combination ------------------------------------------------------------------------------------

    def _check_compatible(self, other: SketchState) -> None:
        if not isinstance(other, SketchState):
            raise SketchError(f"cannot merge a SketchState with {type(other).__name__}")
        if other.spec.fingerprint() != self.spec.fingerprint():
            raise SpecMismatch(
                f"cannot merge states of different specs: {self.spec.describe()} "
                f"[{self.spec.fingerprint()}] vs {other.spec.describe()} [{other.spec.fingerprint()}]"
            )

    def merge(self, other: SketchState) -> SketchState:
        """New state holding the draws of both states.

        Parameters
        ----------
        other : SketchState
            Same spec fingerprint.

        Returns
        -------
        SketchState

        Raises
        ------
        SpecMismatch
            If the specs differ.
        """
        self._check_compatible(other)
        return SketchState(self.spec, self.sums + other.sums, self.sq_norms + other.sq_norms,
                           self.token_counts + other.token_counts, self.sample_counts + other.sample_counts)

    def merge_(self, other: SketchState) -> SketchState:
        """In-place :meth:`merge`; returns ``self``."""
        self._check_compatible(other)
        self.sums += other.sums
        self.sq_norms += other.sq_norms
        self.token_counts += other.token_counts
        self.sample_counts += other.sample_counts
        return self

    def _accumulate(self, sums: np.ndarray, sq_norms: np.ndarray, token_counts: np.ndarray,
                    sample_counts: np.ndarray) -> None:
        """Add the sums of one update call (used by :class:`~fishersketch.Sketcher`)."""
        self.sums += sums
        self.sq_norms += sq_norms
        self.token_counts += token_counts
        self.sample_counts += sample_counts

    # -- serialisation ------------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Serialise to a self-describing, checksummed blob.

        Layout: ``b"FSKS"``, format version (u16), reserved (u16), header length (u32), a UTF-8 JSON
        header (spec dictionary with algorithm version, fingerprint, m), the payload (``sums``,
        ``sq_norms`` as little-endian float64, ``token_counts``, ``sample_counts`` as little-endian
        int64), then a 32-byte BLAKE2b digest of everything before it. At m = 4096 the blob is
        about 192 KiB.

        Returns
        -------
        bytes
        """
        header = json.dumps(
            {"spec": self.spec.to_dict(), "fingerprint": self.spec.fingerprint(), "m": self.m},
            sort_keys=True, separators=(",", ":"),
        ).encode("utf-8")
        body = b"".join([
            _PREFIX.pack(_MAGIC, FORMAT_VERSION, 0, len(header)),
            header,
            self.sums.astype("<f8").tobytes(),
            self.sq_norms.astype("<f8").tobytes(),
            self.token_counts.astype("<i8").tobytes(),
            self.sample_counts.astype("<i8").tobytes(),
        ])
        return body + hashlib.blake2b(body, digest_size=_DIGEST).digest()

    @classmethod
    def from_bytes(cls, blob: bytes, spec: SketchSpec | None = None) -> SketchState:
        """Inverse of :meth:`to_bytes`.

        Parameters
        ----------
        blob : bytes
        spec : SketchSpec, optional
            Expected spec; when given, a blob of another spec is refused.

        Returns
        -------
        SketchState

        Raises
        ------
        CorruptState
            Not a FisherSketch state, truncated, or the checksum does not match.
        SpecMismatch
            The blob's spec differs from ``spec`` or was written by another algorithm version.
        """
        if not isinstance(blob, bytes | bytearray | memoryview):
            raise CorruptState(f"expected bytes, got {type(blob).__name__}")
        blob = bytes(blob)
        if len(blob) < _PREFIX.size + _DIGEST or blob[:4] != _MAGIC:
            raise CorruptState("not a FisherSketch state blob (bad magic or too short)")
        body, digest = blob[:-_DIGEST], blob[-_DIGEST:]
        if hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest:
            raise CorruptState("FisherSketch state blob is corrupt (checksum mismatch)")
        _, version, _, header_len = _PREFIX.unpack_from(body, 0)
        if version != FORMAT_VERSION:
            raise CorruptState(f"unsupported state format version {version} (this library reads {FORMAT_VERSION})")
        start = _PREFIX.size
        try:
            header = json.loads(body[start : start + header_len].decode("utf-8"))
            spec_dict = header["spec"]
            fingerprint = header["fingerprint"]
            m = int(header["m"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptState(f"FisherSketch state header is unreadable: {exc}") from exc
        try:
            blob_spec = SketchSpec.from_dict(spec_dict)
        except SketchError as exc:
            raise SpecMismatch(f"state blob has an incompatible spec: {exc}") from exc
        if blob_spec.fingerprint() != fingerprint or blob_spec.m != m:
            raise CorruptState("FisherSketch state header is inconsistent (fingerprint does not match spec)")
        if spec is not None and spec.fingerprint() != fingerprint:
            raise SpecMismatch(
                f"state blob was built with {blob_spec.describe()} [{fingerprint}], expected "
                f"{spec.describe()} [{spec.fingerprint()}]"
            )
        off = start + header_len
        expected = off + 8 * (6 * m + 6 + 2 + 2)
        if len(body) != expected:
            raise CorruptState(f"FisherSketch state payload has {len(body) - off} bytes, expected {expected - off}")
        sums = np.frombuffer(body, dtype="<f8", count=6 * m, offset=off).reshape(2, 3, m)
        off += 48 * m
        sq = np.frombuffer(body, dtype="<f8", count=6, offset=off).reshape(2, 3)
        off += 48
        tokens = np.frombuffer(body, dtype="<i8", count=2, offset=off)
        samples = np.frombuffer(body, dtype="<i8", count=2, offset=off + 16)
        try:  # the constructor refuses non-finite sums and negative norms or counts: in a blob, a corrupt state
            return cls(blob_spec, sums.astype(np.float64), sq.astype(np.float64), tokens.astype(np.int64),
                       samples.astype(np.int64))
        except SketchError:
            raise CorruptState("FisherSketch state payload holds invalid values") from None

    def __repr__(self) -> str:
        return (f"SketchState({self.spec.describe()}, tokens={self.token_counts.tolist()}, "
                f"samples={self.sample_counts.tolist()})")
