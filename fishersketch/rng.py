"""Counter-based pseudo-random bits (SplitMix64) that are identical on every machine.

The projections of a :class:`~fishersketch.SketchSpec` and the A/B split of a sample are derived
from this module only, never from a library RNG whose stream could change between versions or
devices. Every value is a pure function of ``(seed, stream, counter)``:

``word(seed, stream, k) = mix(key(seed, stream) + k)`` (arithmetic mod 2**64), where ``mix`` is the
SplitMix64 output function (Steele, Lea & Flood, 2014) and ``key(seed, stream) =
mix(mix(seed) ^ mix(stream))``. The numpy functions operate on ``uint64`` arrays with wrap-around
arithmetic; :func:`split_of` is the same computation with Python integers.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "MASK64",
    "STREAM_ACT",
    "STREAM_ERR_DENSE",
    "STREAM_SPLIT",
    "STREAM_SRHT_INDEX",
    "STREAM_SRHT_SIGN",
    "mix64",
    "mix64_int",
    "random_bits",
    "random_permutation",
    "random_signs",
    "random_subset",
    "split_of",
    "split_of_array",
    "stream_key",
]

MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB

# Stream identifiers: one per independent family of random draws.
STREAM_ACT = 1
"""Dense activation signs, a (2m, d) matrix: rows [0, m) are r_a, rows [m, 2m) are r'_a."""
STREAM_ERR_DENSE = 2
"""Dense error signs, a (2m, K) matrix: rows [0, m) are r_e, rows [m, 2m) are r'_e."""
STREAM_SRHT_SIGN = 3
"""SRHT sign vectors D, D' (a (2, N) matrix)."""
STREAM_SRHT_INDEX = 4
"""SRHT row index sets I (sub-stream 0) and I' (sub-stream 1)."""
STREAM_SPLIT = 5
"""A/B split of sample ids."""


def mix64_int(x: int) -> int:
    """SplitMix64 output function on a Python integer (taken mod 2**64).

    Parameters
    ----------
    x : int

    Returns
    -------
    int
        In [0, 2**64).
    """
    z = (x + _GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 output function, elementwise on a ``uint64`` array.

    Parameters
    ----------
    x : np.ndarray of uint64, any shape

    Returns
    -------
    np.ndarray of uint64, same shape
    """
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = x + np.uint64(_GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        return z ^ (z >> np.uint64(31))


def stream_key(seed: int, stream: int, sub: int = 0) -> int:
    """Key of one random stream.

    Parameters
    ----------
    seed : int
        The spec seed (any integer; taken mod 2**64).
    stream : int
        One of the ``STREAM_*`` constants.
    sub : int, default 0
        Sub-stream (e.g. 0 for I and 1 for I').

    Returns
    -------
    int
        In [0, 2**64).
    """
    return mix64_int(mix64_int(seed & MASK64) ^ mix64_int((stream << 32) ^ (sub & 0xFFFFFFFF)))


def random_bits(key: int, n_words: int, start: int = 0) -> np.ndarray:
    """Words ``mix(key + k)`` for ``k`` in ``[start, start + n_words)``.

    Parameters
    ----------
    key : int
    n_words : int
    start : int, default 0

    Returns
    -------
    np.ndarray of uint64, shape (n_words,)
    """
    with np.errstate(over="ignore"):
        counters = np.uint64(key) + np.arange(start, start + n_words, dtype=np.uint64)
    return mix64(counters)


def random_signs(key: int, rows: int, cols: int, *, block_rows: int | None = None) -> np.ndarray:
    """A (rows, cols) matrix of independent Rademacher signs stored as int8.

    Entry ``(i, j)`` is ``1 - 2 * bit`` where ``bit`` is bit ``(i * cols + j) % 64`` (least
    significant first) of word ``(i * cols + j) // 64`` of the stream ``key``.

    Parameters
    ----------
    key : int
        Stream key (:func:`stream_key`).
    rows, cols : int
    block_rows : int, optional
        Rows generated per block (bounds temporary memory); does not change the result.

    Returns
    -------
    np.ndarray of int8, shape (rows, cols), values in {-1, +1}
    """
    out = np.empty((rows, cols), dtype=np.int8)
    if rows == 0 or cols == 0:
        return out
    if block_rows is None:
        block_rows = max(1, (1 << 22) // cols)
    flat = out.reshape(-1)
    total = rows * cols
    step = block_rows * cols
    for lo in range(0, total, step):
        hi = min(total, lo + step)
        w0, w1 = lo // 64, (hi + 63) // 64
        words = random_bits(key, w1 - w0, start=w0).astype("<u8", copy=False)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        dst = flat[lo:hi]
        dst[:] = bits[lo - 64 * w0 : hi - 64 * w0]  # 0/1, then 1 - 2 bit in place
        dst *= -2
        dst += 1
    return out


def random_subset(key: int, n: int, k: int) -> np.ndarray:
    """``k`` indices of ``range(n)`` drawn uniformly, returned sorted.

    For ``k <= n`` the indices are distinct (a uniformly random subset: the ``k`` smallest of ``n``
    random 64-bit keys, ties broken by index). For ``k > n`` the multiset is the concatenation of
    ``k // n`` full copies of ``range(n)`` and a random subset of size ``k % n``, so every index
    appears ``floor(k/n)`` or ``ceil(k/n)`` times.

    Parameters
    ----------
    key : int
        Stream key.
    n : int
        Population size.
    k : int
        Number of indices.

    Returns
    -------
    np.ndarray of int64, shape (k,), non-decreasing
    """
    if n <= 0:
        raise ValueError("population must be non-empty")
    full, rest = divmod(k, n)
    parts = [np.repeat(np.arange(n, dtype=np.int64), full)] if full else []
    if rest:
        keys = random_bits(key, n)
        order = np.argsort(keys, kind="stable")
        parts.append(order[:rest].astype(np.int64))
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return np.sort(out, kind="stable")


def random_permutation(key: int, n: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` (argsort of ``n`` random 64-bit keys).

    Parameters
    ----------
    key : int
        Stream key.
    n : int

    Returns
    -------
    np.ndarray of int64, shape (n,)
    """
    return np.argsort(random_bits(key, n), kind="stable").astype(np.int64)


def split_of(sample_id: int, seed: int) -> int:
    """A/B split of one sample: 0 for A, 1 for B.

    The top bit of ``mix(sample_id ^ key(seed, STREAM_SPLIT))``; negative ids are taken as their
    two's-complement 64-bit pattern. Identical to :func:`split_of_array`.

    Parameters
    ----------
    sample_id : int
    seed : int

    Returns
    -------
    int
        0 or 1.
    """
    key = stream_key(seed, STREAM_SPLIT)
    return mix64_int((int(sample_id) & MASK64) ^ key) >> 63


def split_of_array(sample_ids: np.ndarray, seed: int) -> np.ndarray:
    """Vectorised :func:`split_of`.

    Parameters
    ----------
    sample_ids : np.ndarray of integers, shape (n,)
    seed : int

    Returns
    -------
    np.ndarray of int64, shape (n,), values in {0, 1}
    """
    ids = np.asarray(sample_ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError("sample ids must be integers")
    ids64 = ids.astype(np.int64, copy=False).view(np.uint64)
    key = np.uint64(stream_key(seed, STREAM_SPLIT))
    return (mix64(ids64 ^ key) >> np.uint64(63)).astype(np.int64)
