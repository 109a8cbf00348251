"""Mergeable sums for the baseline task representations users compare against.

Collected in the same pass as the FisherSketch state (see ``workers.extraction``):

* mean hidden state — mean of the head input ``a`` over all counted tokens,
* last-token hidden state — mean over samples of ``a`` at each sample's last counted token,
* mean token loss — mean cross-entropy over counted tokens (for perplexity similarity).

Like :class:`fishersketch.SketchState` they are sums and counts, so appending samples to a task
merges exactly.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import cast

import numpy as np

_MAGIC = b"FABL"
_VERSION = 1


@dataclass
class BaselineSums:
    """Running sums for the baseline representations of one task.

    Attributes
    ----------
    sum_hidden : ndarray, shape (d,), float64
        Sum of head inputs over counted tokens.
    sum_last_hidden : ndarray, shape (d,), float64
        Sum over samples of the head input at the sample's last counted token.
    sum_loss : float
        Sum of token cross-entropies (nats).
    n_tokens : int
        Counted tokens.
    n_samples : int
        Counted samples.
    """

    d: int
    sum_hidden: np.ndarray = field(default=cast(np.ndarray, None))
    sum_last_hidden: np.ndarray = field(default=cast(np.ndarray, None))
    sum_loss: float = 0.0
    n_tokens: int = 0
    n_samples: int = 0

    def __post_init__(self) -> None:
        if self.sum_hidden is None:
            self.sum_hidden = np.zeros(self.d, dtype=np.float64)
        if self.sum_last_hidden is None:
            self.sum_last_hidden = np.zeros(self.d, dtype=np.float64)

    def merge(self, other: BaselineSums) -> BaselineSums:
        """Return the sums of ``self`` and ``other`` (same ``d``)."""
        if other.d != self.d:
            raise ValueError(f"cannot merge baselines of width {self.d} and {other.d}")
        return BaselineSums(
            d=self.d,
            sum_hidden=self.sum_hidden + other.sum_hidden,
            sum_last_hidden=self.sum_last_hidden + other.sum_last_hidden,
            sum_loss=self.sum_loss + other.sum_loss,
            n_tokens=self.n_tokens + other.n_tokens,
            n_samples=self.n_samples + other.n_samples,
        )

    def mean_hidden(self) -> np.ndarray:
        """Mean hidden state, shape (d,), float32 (zeros when empty)."""
        return (self.sum_hidden / max(self.n_tokens, 1)).astype(np.float32)

    def last_hidden(self) -> np.ndarray:
        """Mean last-token hidden state, shape (d,), float32 (zeros when empty)."""
        return (self.sum_last_hidden / max(self.n_samples, 1)).astype(np.float32)

    def mean_loss(self) -> float:
        """Mean token loss in nats (0.0 when empty)."""
        return self.sum_loss / max(self.n_tokens, 1)

    def to_bytes(self) -> bytes:
        """Serialise to a versioned, checksummed blob."""
        header = struct.pack("<4sIIdqq", _MAGIC, _VERSION, self.d, self.sum_loss, self.n_tokens, self.n_samples)
        body = header + self.sum_hidden.astype("<f8").tobytes() + self.sum_last_hidden.astype("<f8").tobytes()
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def from_bytes(cls, blob: bytes) -> BaselineSums:
        """Inverse of :meth:`to_bytes`; raises ``ValueError`` on a corrupt or foreign blob."""
        head = struct.calcsize("<4sIIdqq")
        if len(blob) < head + 4 or blob[:4] != _MAGIC:
            raise ValueError("not a FisherAtlas baseline blob")
        (crc,) = struct.unpack("<I", blob[-4:])
        if zlib.crc32(blob[:-4]) != crc:
            raise ValueError("baseline blob checksum mismatch (corrupt data)")
        _, version, d, sum_loss, n_tokens, n_samples = struct.unpack("<4sIIdqq", blob[:head])
        if version != _VERSION:
            raise ValueError(f"unsupported baseline blob version {version}")
        if len(blob) != head + 16 * d + 4:
            raise ValueError("baseline blob has the wrong length")
        vec = np.frombuffer(blob[head : head + 16 * d], dtype="<f8").astype(np.float64)
        return cls(d=d, sum_hidden=vec[:d].copy(), sum_last_hidden=vec[d:].copy(), sum_loss=sum_loss,
                   n_tokens=n_tokens, n_samples=n_samples)
