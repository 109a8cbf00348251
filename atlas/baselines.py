"""Mergeable sums for the baseline task representations users compare against.

Collected in the same pass as the FisherSketch state (see ``workers.extraction``):

* mean hidden state — mean of the head input ``a`` over all counted tokens,
* last-token hidden state — mean over samples of ``a`` at each sample's last counted token,
* mean token loss — mean cross-entropy over counted tokens (for perplexity similarity),
* novelty vectors — per sample, the mean head input over its counted positions (:mod:`atlas.novelty`),
  for at most :data:`atlas.novelty.MAX_NOVELTY_SAMPLES` samples: those of smallest content hash.

Like :class:`fishersketch.SketchState` they are sums and counts, so appending samples to a task
merges exactly; the novelty vectors merge as a bottom-k sample (the same samples whatever the order of
the appends).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from atlas.novelty import MAX_NOVELTY_SAMPLES, NOVELTY_DIM

_MAGIC = b"FABL"
_VERSION = 2
"""Version 2 adds the novelty vectors; version 1 blobs (none) are read."""


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
    sample_keys : ndarray, shape (n_v,), int64
        Content hashes of the samples whose novelty vectors are kept (ascending).
    sample_vectors : ndarray, shape (n_v, r), float32
        Their projected mean head inputs (:func:`atlas.novelty.project`); ``r`` is 0 when none are kept.
    """

    d: int
    sum_hidden: np.ndarray = field(default=cast(np.ndarray, None))
    sum_last_hidden: np.ndarray = field(default=cast(np.ndarray, None))
    sum_loss: float = 0.0
    n_tokens: int = 0
    n_samples: int = 0
    sample_keys: np.ndarray = field(default=cast(np.ndarray, None))
    sample_vectors: np.ndarray = field(default=cast(np.ndarray, None))

    def __post_init__(self) -> None:
        if self.sum_hidden is None:
            self.sum_hidden = np.zeros(self.d, dtype=np.float64)
        if self.sum_last_hidden is None:
            self.sum_last_hidden = np.zeros(self.d, dtype=np.float64)
        if self.sample_keys is None or self.sample_vectors is None:
            self.sample_keys = np.zeros(0, dtype=np.int64)
            self.sample_vectors = np.zeros((0, 0), dtype=np.float32)

    def with_sample_vectors(self, keys: np.ndarray, vectors: np.ndarray) -> BaselineSums:
        """These sums with ``vectors`` (shape (n, r)) of the samples ``keys`` (shape (n,)) added to the kept ones
        (a key already kept is kept once; the :data:`atlas.novelty.MAX_NOVELTY_SAMPLES` smallest keys stay)."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if not len(keys):
            return replace(self)
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(keys):
            raise ValueError("novelty vectors must be (n, r) with one key each")
        if len(self.sample_keys) and len(keys) and vectors.shape[1] != self.sample_vectors.shape[1]:
            raise ValueError(f"cannot merge novelty vectors of width {self.sample_vectors.shape[1]} and "
                             f"{vectors.shape[1]}")
        all_keys = np.concatenate([self.sample_keys, keys])
        all_vecs = np.concatenate([self.sample_vectors, vectors]) if len(self.sample_keys) else vectors
        uniq, first = np.unique(all_keys, return_index=True)  # sorted ascending, first occurrence kept
        first = first[:MAX_NOVELTY_SAMPLES]
        return replace(self, sample_keys=uniq[:MAX_NOVELTY_SAMPLES].copy(),
                       sample_vectors=np.ascontiguousarray(all_vecs[first], dtype=np.float32))

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
        ).with_sample_vectors(self.sample_keys, self.sample_vectors).with_sample_vectors(other.sample_keys,
                                                                                    other.sample_vectors)

    def check_imported(self) -> None:
        """Raise ``ValueError`` unless these sums are ones a worker makes: finite hidden sums, counts ≥ 0, novelty
        vectors of the width its model makes (``min(d, NOVELTY_DIM)``). An import checks them (a crafted blob's
        narrower vectors made every route of its space answer 500); reading a stored blob does not (a worker's
        ``sum_loss`` may be infinite where a target's probability rounded to 0, and nothing reads it)."""
        if not (np.all(np.isfinite(self.sum_hidden)) and np.all(np.isfinite(self.sum_last_hidden))):
            raise ValueError("baseline sums are not finite")
        if self.n_tokens < 0 or self.n_samples < 0:
            raise ValueError("baseline counts are negative")
        r = self.sample_vectors.shape[1] if len(self.sample_keys) else 0
        if r and r != min(self.d, NOVELTY_DIM):
            raise ValueError(f"baseline novelty vectors of width {r}; a model of width {self.d} makes "
                             f"{min(self.d, NOVELTY_DIM)}")

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
        n_v, r = (self.sample_vectors.shape if len(self.sample_keys) else (0, 0))
        body = (header + self.sum_hidden.astype("<f8").tobytes() + self.sum_last_hidden.astype("<f8").tobytes()
                + struct.pack("<II", n_v, r) + self.sample_keys.astype("<i8").tobytes()
                + self.sample_vectors.astype("<f4").tobytes())
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
        if version not in (1, _VERSION):
            raise ValueError(f"unsupported baseline blob version {version}")
        end = head + 16 * d
        keys = np.zeros(0, dtype=np.int64)
        vecs = np.zeros((0, 0), dtype=np.float32)
        if version == 1:
            if len(blob) != end + 4:
                raise ValueError("baseline blob has the wrong length")
        else:
            if len(blob) < end + 12:
                raise ValueError("baseline blob has the wrong length")
            n_v, r = struct.unpack("<II", blob[end:end + 8])
            if n_v > MAX_NOVELTY_SAMPLES or r > NOVELTY_DIM or (n_v == 0) != (r == 0) or r > d:
                raise ValueError("baseline blob has novelty vectors of an impossible shape")
            if len(blob) != end + 8 + 8 * n_v + 4 * n_v * r + 4:
                raise ValueError("baseline blob has the wrong length")
            keys = np.frombuffer(blob[end + 8:end + 8 + 8 * n_v], dtype="<i8").astype(np.int64)
            vecs = np.frombuffer(blob[end + 8 + 8 * n_v:-4], dtype="<f4").astype(np.float32).reshape(n_v, r)
            if n_v and (not np.all(np.isfinite(vecs)) or np.any(np.diff(keys) <= 0)):
                raise ValueError("baseline blob has invalid novelty vectors")
        vec = np.frombuffer(blob[head:end], dtype="<f8").astype(np.float64)
        return cls(d=d, sum_hidden=vec[:d].copy(), sum_last_hidden=vec[d:].copy(), sum_loss=sum_loss,
                   n_tokens=n_tokens, n_samples=n_samples, sample_keys=keys, sample_vectors=vecs)
