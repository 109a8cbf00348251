"""The fixed random projections of a spec, drawn on the CPU and moved to a device.

All draws come from :mod:`fishersketch.rng` (SplitMix64 streams keyed by the spec seed), so the
projections are bit-identical in every process, on every machine and on every device.

Layout
------
``act_signs``   int8 (2m, d): rows [0, m) are r_a, rows [m, 2m) are r'_a.
``err_signs``   int8 (2m, K): rows [0, m) are r_e, rows [m, 2m) are r'_e (dense error projection).
``srht_signs``  int8 (2, N): the diagonals of D and D' (SRHT error projection, N = next_pow2(K)).
``srht_index``  int64 (2, m): the rows I and I' of H_N (SRHT error projection). I is sorted; I' is a
                random subset in random order, so that the pairing of I_j with I'_j is random (with
                m > N, where rows repeat, sorted pairs would repeat the same coordinate).

With the SRHT, coordinate j of the error projections is ``r_e,j = H_N[I_j, :K] * D[:K]`` and
``r'_e,j = H_N[I'_j, :K] * D'[:K]``; for any fixed row the entries are i.i.d. Rademacher, so every
coordinate has exactly the law of the dense construction (the coordinates are dependent).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from fishersketch import rng
from fishersketch.spec import SketchSpec

__all__ = ["Projections", "generate_projections"]


@dataclass(frozen=True)
class Projections:
    """Projection tensors of one spec (see the module docstring for the layout).

    Attributes
    ----------
    spec : SketchSpec
    act_signs : torch.Tensor, int8 (2m, d)
    err_signs : torch.Tensor or None, int8 (2m, K); dense error projection only
    srht_signs : torch.Tensor or None, int8 (2, N); SRHT only
    srht_index : torch.Tensor or None, int64 (2, m); SRHT only
    """

    spec: SketchSpec
    act_signs: torch.Tensor
    err_signs: torch.Tensor | None
    srht_signs: torch.Tensor | None
    srht_index: torch.Tensor | None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The non-empty projection tensors by name (in a fixed order)."""
        out = {"act_signs": self.act_signs}
        for name in ("err_signs", "srht_signs", "srht_index"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def to(self, device: torch.device | str) -> Projections:
        """Copy of the projections on ``device`` (values unchanged, storage dtypes unchanged)."""
        moved = {k: v.to(device) for k, v in self.tensors().items()}
        return Projections(
            spec=self.spec,
            act_signs=moved["act_signs"],
            err_signs=moved.get("err_signs"),
            srht_signs=moved.get("srht_signs"),
            srht_index=moved.get("srht_index"),
        )

    def nbytes(self) -> int:
        """Bytes held by the projection tensors (their storage dtypes)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def digest(self) -> str:
        """SHA-256 over the spec fingerprint and the raw bytes of every tensor (moved to CPU).

        Equal digests mean bit-identical projections; used to check reproducibility across processes
        and devices.
        """
        h = hashlib.sha256(self.spec.fingerprint().encode())
        for name, t in self.tensors().items():
            h.update(name.encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(np.ascontiguousarray(t.detach().cpu().numpy()).tobytes())
        return h.hexdigest()


def generate_projections(spec: SketchSpec) -> Projections:
    """Draw the projections of ``spec`` on the CPU.

    Parameters
    ----------
    spec : SketchSpec

    Returns
    -------
    Projections
        CPU tensors; use :meth:`Projections.to` to move them.
    """
    m, d, K = spec.m, spec.d, spec.K
    act = rng.random_signs(rng.stream_key(spec.seed, rng.STREAM_ACT), 2 * m, d)
    err = srht_signs = srht_index = None
    if spec.error_projection == "dense":
        err = torch.from_numpy(rng.random_signs(rng.stream_key(spec.seed, rng.STREAM_ERR_DENSE), 2 * m, K))
    else:
        N = spec.error_length
        signs = rng.random_signs(rng.stream_key(spec.seed, rng.STREAM_SRHT_SIGN), 2, N)
        first = rng.random_subset(rng.stream_key(spec.seed, rng.STREAM_SRHT_INDEX, 0), N, m)
        second = rng.random_subset(rng.stream_key(spec.seed, rng.STREAM_SRHT_INDEX, 1), N, m)
        second = second[rng.random_permutation(rng.stream_key(spec.seed, rng.STREAM_SRHT_INDEX, 2), m)]
        index = np.stack([first, second])
        srht_signs = torch.from_numpy(signs)
        srht_index = torch.from_numpy(index)
    return Projections(
        spec=spec,
        act_signs=torch.from_numpy(act),
        err_signs=err,
        srht_signs=srht_signs,
        srht_index=srht_index,
    )
