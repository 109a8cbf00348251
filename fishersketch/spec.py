"""The sketch specification: everything that determines the random projections.

Two states are comparable only if their specs have the same :meth:`SketchSpec.fingerprint`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from fishersketch.errors import SketchError

__all__ = [
    "ALGORITHM_VERSION",
    "AUTO_SRHT_MIN_K",
    "MAX_SRHT_LENGTH",
    "SketchSpec",
    "next_pow2",
]

ALGORITHM_VERSION = 1
"""Version of the projection generator, feature maps and state layout.

Bump it whenever a change alters the projections drawn for a spec or the meaning of the stored sums;
states of different versions are refused by :meth:`SketchState.from_bytes` and by ``merge``.
"""

AUTO_SRHT_MIN_K = 2049
"""``error_projection="auto"`` resolves to ``"srht"`` when ``K >= AUTO_SRHT_MIN_K`` and to ``"dense"``
otherwise.

Rule (device independent, so the fingerprint does not depend on where a spec is used): up to
K = 2048 the dense int8 error signs cost at most ``2 m K`` bytes (16 MiB at m = 4096) and give
i.i.d. coordinates, the setting the paper uses for small-dimensional comparisons; above it the dense
matrix grows to ~1 GiB at K = 128,256 and the O(m K) GEMM dominates the update, while the SRHT costs
O(N log N + m) per token (see ``bench/results/sketch.md`` for the measured crossover).
"""

MAX_SRHT_LENGTH = 1 << 24
"""Largest padded error length N supported by the SRHT path."""

ErrorProjection = Literal["auto", "srht", "dense"]
Granularity = Literal["token", "sequence"]


def next_pow2(n: int) -> int:
    """Smallest power of two ``>= n`` (``n >= 1``)."""
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class SketchSpec:
    """Specification of a FisherSketch feature map.

    Parameters
    ----------
    d : int
        Activation dimension (the head input; include the constant 1 if the head has a bias).
    K : int
        Error dimension (number of head outputs, e.g. the vocabulary size).
    m : int, default 4096
        Sketch dimension (number of random-feature coordinates).
    seed : int, default 0
        Seed of every random draw (projections and the A/B split); ``0 <= seed < 2**64``.
    error_projection : {"auto", "srht", "dense"}, default "auto"
        Projection of the error side. ``"dense"``: two m x K Rademacher sign matrices stored as int8.
        ``"srht"``: subsampled randomized Hadamard transform (sign vectors D, D' of length
        N = next_pow2(K) and index sets I, I' of size m). ``"auto"`` is resolved at construction by
        the rule of :data:`AUTO_SRHT_MIN_K`; the resolved kind is what is stored and fingerprinted.
    granularity : {"token", "sequence"}, default "token"
        ``"token"``: one feature vector per token (head kernel ``((a.a')(e.e'))**2``).
        ``"sequence"``: one feature vector per sample, for shared-parameter layers
        (kernel ``(sum_{t,s} (a_t.a'_s)(e_t.e'_s))**2``); a sample's tokens must arrive in one
        ``Sketcher.update`` call.
    activation_projection : {"dense"}, default "dense"
        Projection of the activation side: two m x d Rademacher sign matrices stored as int8.

    Notes
    -----
    The spec is frozen and hashable. Two specs with equal fields (after resolving ``"auto"``) have the
    same :meth:`fingerprint` and generate bit-identical projections on any machine.
    """

    d: int
    K: int
    m: int = 4096
    seed: int = 0
    error_projection: ErrorProjection = "auto"
    granularity: Granularity = "token"
    activation_projection: Literal["dense"] = "dense"

    def __post_init__(self) -> None:
        for name in ("d", "K", "m", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SketchError(f"SketchSpec.{name} must be an int, got {value!r}")
        if self.d < 1 or self.K < 1 or self.m < 1:
            raise SketchError(f"SketchSpec needs d, K, m >= 1, got d={self.d}, K={self.K}, m={self.m}")
        if not 0 <= self.seed < 2**64:
            raise SketchError(f"SketchSpec.seed must be in [0, 2**64), got {self.seed}")
        if self.error_projection not in ("auto", "srht", "dense"):
            raise SketchError(
                f"error_projection must be 'auto', 'srht' or 'dense', got {self.error_projection!r}"
            )
        if self.granularity not in ("token", "sequence"):
            raise SketchError(f"granularity must be 'token' or 'sequence', got {self.granularity!r}")
        if self.activation_projection != "dense":
            raise SketchError(f"activation_projection must be 'dense', got {self.activation_projection!r}")
        if self.error_projection == "auto":
            resolved = "srht" if self.K >= AUTO_SRHT_MIN_K else "dense"
            object.__setattr__(self, "error_projection", resolved)
        if self.error_projection == "srht" and next_pow2(self.K) > MAX_SRHT_LENGTH:
            raise SketchError(f"K={self.K} exceeds the largest supported SRHT length {MAX_SRHT_LENGTH}")

    @property
    def error_length(self) -> int:
        """Padded error length N (a power of two) for the SRHT; ``K`` for dense projections."""
        return next_pow2(self.K) if self.error_projection == "srht" else self.K

    def to_dict(self) -> dict[str, Any]:
        """Canonical dictionary of the spec (resolved kinds, algorithm version included).

        Returns
        -------
        dict
            Keys ``algorithm_version, d, K, m, seed, error_projection, granularity,
            activation_projection``.
        """
        return {
            "algorithm_version": ALGORITHM_VERSION,
            "d": self.d,
            "K": self.K,
            "m": self.m,
            "seed": self.seed,
            "error_projection": self.error_projection,
            "granularity": self.granularity,
            "activation_projection": self.activation_projection,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SketchSpec:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        SketchError
            If the algorithm version differs from :data:`ALGORITHM_VERSION` or a field is invalid.
        """
        version = data.get("algorithm_version")
        if version != ALGORITHM_VERSION:
            raise SketchError(
                f"spec was written by FisherSketch algorithm version {version!r}; "
                f"this library implements version {ALGORITHM_VERSION}"
            )
        fields = {k: data[k] for k in ("d", "K", "m", "seed", "error_projection", "granularity",
                                       "activation_projection") if k in data}
        try:
            return cls(**fields)
        except TypeError as exc:  # missing required field
            raise SketchError(f"incomplete spec dictionary: {exc}") from exc

    def canonical_json(self) -> str:
        """Canonical JSON of :meth:`to_dict` (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def fingerprint(self) -> str:
        """Stable identifier of the feature map: ``"fsk<version>-<24 hex digits>"``.

        The digits are the first 96 bits of SHA-256 of :meth:`canonical_json`, so they change with the
        algorithm version and with every field; they do not depend on the process, device or machine.
        """
        digest = hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()
        return f"fsk{ALGORITHM_VERSION}-{digest[:24]}"

    def describe(self) -> str:
        """Human-readable one-line summary (used in error messages)."""
        return (
            f"SketchSpec(d={self.d}, K={self.K}, m={self.m}, seed={self.seed}, "
            f"error_projection={self.error_projection!r}, granularity={self.granularity!r}, "
            f"v{ALGORITHM_VERSION})"
        )
