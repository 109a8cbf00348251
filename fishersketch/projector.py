"""The projection half of FisherSketch: the sign matrices of a spec on a device, and the per-token
projections ``(u, u', v, v')`` of activations and errors, in fixed-shape chunks.

Compute paths
-------------
* Activations: one GEMM of the (n, d) activations with the stacked (2m, d) sign matrix, stored as
  int8 and cast to the compute dtype (cached in that dtype when it fits, see ``cache_weights``).
* Errors, dense: one float32 GEMM with the stacked (2m, K) int8 sign matrix.
* Errors, SRHT: pad to N, multiply by D and D' (two copies in one buffer), one batched FWHT
  (:mod:`fishersketch.fwht`), keep outputs I of the first copy and I' of the second. Float32 always.

Reproducibility. Tokens are processed in chunks of exactly ``chunk_rows`` rows (the last chunk is
zero-padded; the SRHT transforms fixed blocks of ``err_block`` tokens), so every GEMM has the same
shape whatever the batch size; per-token features then do not depend on how tokens are batched or
sharded, and states built from any sharding of the same data agree to float64 rounding of the sums
(same device, ``chunk_rows`` and BLAS threading). Accumulation is in float64.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from typing import Any, Self

import numpy as np
import torch

from fishersketch.errors import SketchError
from fishersketch.fwht import GatheredHadamard, KronPlan, choose_plan
from fishersketch.inputs import all_finite, as_tensor, check_tokens
from fishersketch.projections import Projections, generate_projections
from fishersketch.spec import SketchSpec

__all__ = ["Projector"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_ERR_BLOCK_ELEMS = 1 << 20
"""Bound on (rows x N) of one FWHT block on a CPU: 2 copies x tokens x N floats (4 MiB per buffer at
float32; 4 tokens at N = 2**17). Small blocks keep the three buffers in cache; measured best on the dev box
(bench/results/sketch.md)."""
_ERR_BLOCK_ELEMS_CUDA = 1 << 26
"""The same bound on a GPU (256 MiB per buffer): a block of a few tokens would pay a kernel launch per FWHT
stage each (bench/results/gpu.md)."""
_CACHE_LIMIT_BYTES = 512 << 20
"""``cache_weights=None`` keeps a compute-dtype copy of a sign matrix when it is at most this big."""


_Chunk = tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""``(lo, hi, u, u', v, v')`` of one chunk of rows."""


class Projector:
    """The sign matrices of a spec on a device and the projections of tokens: the half of
    :class:`fishersketch.Sketcher` that knows nothing of features or states (its parameters are the
    Sketcher's)."""

    def __init__(self, spec: SketchSpec, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 *, chunk_rows: int | None = None, fwht_method: str = "auto",
                 cache_weights: bool | None = None) -> None:
        if not isinstance(spec, SketchSpec):
            raise SketchError(f"spec must be a SketchSpec, got {type(spec).__name__}")
        if dtype not in _FLOAT_DTYPES:
            raise SketchError(f"dtype must be a floating dtype, got {dtype}")
        self.spec = spec
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise SketchError(f"device {device!r} is not a torch device: {exc}") from None
        if self.device.type == "cuda" and not torch.cuda.is_available():  # torch's bare AssertionError before
            raise SketchError(f"device {device!r}: CUDA is not available in this torch build or machine")
        self.dtype = dtype
        self.err_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self.projections: Projections = generate_projections(spec).to(self.device)
        m = spec.m
        self._inv_sqrt_m = 1.0 / math.sqrt(m)

        # Error-side FWHT blocking: a power-of-two number of tokens per block.
        self.plan: KronPlan | None = None
        self._gather: GatheredHadamard | None = None
        self._srht_signs: torch.Tensor | None = None
        self.err_block = 0
        if spec.error_projection == "srht":
            N = spec.error_length
            self.plan = choose_plan(N, m, self.device, method=fwht_method)
            assert self.projections.srht_signs is not None and self.projections.srht_index is not None
            self._gather = GatheredHadamard(self.plan, self.projections.srht_index, self.err_dtype, self.device)
            self._srht_signs = self.projections.srht_signs[:, : spec.K].to(self.err_dtype)
            budget = _ERR_BLOCK_ELEMS_CUDA if self.device.type == "cuda" else _ERR_BLOCK_ELEMS
            self.err_block = max(1, min(1 << 10, budget // (2 * N)))
            self.err_block = 1 << (self.err_block.bit_length() - 1)

        self._max_err_block = self.err_block
        self._set_chunk_rows(chunk_rows)

        self._act_cache = self._maybe_cache(self.projections.act_signs, self.dtype, cache_weights)
        self._err_cache: torch.Tensor | None = None
        if self.projections.err_signs is not None:
            self._err_cache = self._maybe_cache(self.projections.err_signs, self.err_dtype, cache_weights)

    # -- weights -----------------------------------------------------------------------------------

    @staticmethod
    def _maybe_cache(signs: torch.Tensor, dtype: torch.dtype, cache: bool | None) -> torch.Tensor | None:
        size = signs.numel() * torch.empty((), dtype=dtype).element_size()
        if cache is None:
            cache = size <= _CACHE_LIMIT_BYTES
        return signs.to(dtype) if cache else None

    def _act_weight(self) -> torch.Tensor:
        return self._act_cache if self._act_cache is not None else self.projections.act_signs.to(self.dtype)

    def _err_weight(self) -> torch.Tensor:
        if self._err_cache is not None:
            return self._err_cache
        assert self.projections.err_signs is not None
        return self.projections.err_signs.to(self.err_dtype)

    def memory_bytes(self) -> dict[str, int]:
        """Device memory held by this sketcher.

        Returns
        -------
        dict
            ``projections`` (int8 signs, SRHT signs and indices), ``weight_cache`` (compute-dtype
            copies of the signs), ``workspace_per_chunk`` (transient buffers of one chunk: projections,
            float64 features, FWHT scratch).
        """
        cache = sum(t.numel() * t.element_size() for t in (self._act_cache, self._err_cache) if t is not None)
        m, C = self.spec.m, self.chunk_rows
        width = torch.empty((), dtype=self.err_dtype).element_size()
        work = 4 * C * m * width + 3 * C * m * 8  # (u, u', v, v') and the float64 feature buffer
        if self._gather is not None:
            rows = 2 * self.err_block
            work += (rows * self.spec.error_length + self._gather.workspace_numel(rows)) * width
        if self._srht_signs is not None:
            cache += self._srht_signs.numel() * self._srht_signs.element_size()
        return {"projections": self.projections.nbytes(), "weight_cache": cache, "workspace_per_chunk": work}

    # -- validation --------------------------------------------------------------------------------

    def _check(self, a: Any, e: Any, sample_ids: Any | None) -> tuple[torch.Tensor, torch.Tensor, np.ndarray | None]:
        return check_tokens(self.spec, a, e, sample_ids)

    # -- projections -------------------------------------------------------------------------------

    def _chunks(self, n: int) -> Sequence[tuple[int, int]]:
        C = self.chunk_rows
        return [(lo, min(n, lo + C)) for lo in range(0, n, C)]

    def _pad(self, x: torch.Tensor, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows [lo, hi) of x on the device in ``dtype``, zero-padded to ``chunk_rows`` rows."""
        block = x[lo:hi].to(device=self.device, dtype=dtype)
        if hi - lo == self.chunk_rows:
            return block.contiguous()
        out = torch.zeros(self.chunk_rows, x.shape[1], dtype=dtype, device=self.device)
        out[: hi - lo] = block
        return out

    def _error_rows(self, e: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Chunk rows of ``e`` for :meth:`_project_err`: zero-padded for dense, as is for the SRHT."""
        if self._gather is None:
            return self._pad(e, lo, hi, self.err_dtype)
        return e[lo:hi].to(device=self.device, dtype=self.err_dtype)

    def _project_act(self, a: torch.Tensor, w_act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Activation projections (u, u') of one padded chunk, each (chunk_rows, m), error dtype."""
        m = self.spec.m
        pa = torch.matmul(a, w_act.T)
        if pa.dtype != self.err_dtype:
            pa = pa.to(self.err_dtype)
        return pa[:, :m], pa[:, m:]

    def _project_err(self, e: torch.Tensor, w_err: torch.Tensor | None,
                     work: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Error projections (v, v') of one chunk, each (chunk_rows, m), error dtype.

        Dense: ``e`` is the zero-padded chunk (chunk_rows, K). SRHT: ``e`` holds only the chunk's valid
        rows; blocks of ``err_block`` tokens are transformed independently (fixed shapes), the last
        one zero-padded, and rows past the valid ones are left unset.
        """
        m = self.spec.m
        if w_err is not None:
            pe = torch.matmul(e, w_err.T)
            return pe[:, :m], pe[:, m:]
        assert self._gather is not None and work is not None
        C, K, N, tb = self.chunk_rows, self.spec.K, self.spec.error_length, self.err_block
        c = e.shape[0]
        v = torch.empty(C, m, dtype=self.err_dtype, device=self.device)
        v2 = torch.empty(C, m, dtype=self.err_dtype, device=self.device)
        # Input block (two sign-flipped copies D e, D' e side by side; its zero padding is written once
        # per call and never overwritten) followed by the FWHT scratch.
        x = work[: 2 * tb * N].view(2, tb, N)
        scratch = work[2 * tb * N :]
        assert self._srht_signs is not None
        for lo in range(0, c, tb):
            k = min(tb, c - lo)
            # A short last block (a routing prompt) is transformed in the smallest power-of-two block
            # that holds it. Every view has rows of length N, so the padding columns K..N are the same
            # (still zero) in each.
            b = tb if k == tb else min(tb, 1 << (k - 1).bit_length())
            xb = x if b == tb else work[: 2 * b * N].view(2, b, N)
            torch.mul(e[lo : lo + k].unsqueeze(0), self._srht_signs.unsqueeze(1), out=xb[:, :k, :K])
            if k < b:
                xb[:, k:, :K].zero_()
            self._gather(xb.view(2 * b, N), scratch, out=(v[lo : lo + b], v2[lo : lo + b]))
        return v, v2

    def _workspace(self) -> torch.Tensor | None:
        """Per-call SRHT buffer: the input block (zero-padded) followed by the FWHT scratch."""
        if self._gather is None:
            return None
        rows, N = 2 * self.err_block, self.spec.error_length
        work = torch.empty(rows * N + self._gather.workspace_numel(rows), dtype=self.err_dtype, device=self.device)
        if self.spec.K < N:
            work[: rows * N].view(rows, N)[:, self.spec.K :].zero_()
        return work

    def _iter_projections(self, a: torch.Tensor, e: torch.Tensor) -> Iterator[_Chunk]:
        """Yield ``(lo, hi, u, u', v, v')`` per chunk, rows beyond ``hi - lo`` dropped."""
        w_act = self._act_weight()
        w_err = self._err_weight() if self.projections.err_signs is not None else None
        work = self._workspace()
        for lo, hi in self._chunks(a.shape[0]):
            u, u2 = self._project_act(self._pad(a, lo, hi, self.dtype), w_act)
            v, v2 = self._project_err(self._error_rows(e, lo, hi), w_err, work)
            c = hi - lo
            yield lo, hi, u[:c], u2[:c], v[:c], v2[:c]

    def _concat(self, parts: Sequence[tuple[torch.Tensor, ...]], chunks: Sequence[tuple[int, int]],
                count: int) -> tuple[torch.Tensor, ...]:
        """Concatenate per-chunk outputs, dropping the padded rows; check finiteness."""
        if not parts:
            return tuple(torch.zeros(0, self.spec.m, dtype=self.err_dtype, device=self.device) for _ in range(count))
        out = tuple(torch.cat([p[k][: hi - lo] for p, (lo, hi) in zip(parts, chunks, strict=True)])
                    for k in range(count))
        if not all(all_finite(x) for x in out):
            raise SketchError("non-finite projections (NaN/Inf in the input, or overflow)")
        return out

    def project_activations(self, a: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Activation projections ``(u, u')`` = ``(a r_aᵀ, a r'_aᵀ)`` of each token (the activation path).

        Parameters
        ----------
        a : tensor (n, d)

        Returns
        -------
        u, u2 : torch.Tensor
            Each (n, m), error dtype.
        """
        a = as_tensor(a, "a")
        if a.ndim != 2 or a.shape[1] != self.spec.d or not a.is_floating_point():
            raise SketchError(f"a must be floating with shape (n, {self.spec.d}), got {tuple(a.shape)} {a.dtype}")
        w_act = self._act_weight()
        chunks = self._chunks(a.shape[0])
        parts = [self._project_act(self._pad(a, lo, hi, self.dtype), w_act) for lo, hi in chunks]
        u, u2 = self._concat(parts, chunks, 2)
        return u, u2

    def project_errors(self, e: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Error projections ``(v, v')`` = ``(e r_eᵀ, e r'_eᵀ)`` of each token (the error path).

        Parameters
        ----------
        e : tensor (n, K)

        Returns
        -------
        v, v2 : torch.Tensor
            Each (n, m), error dtype.
        """
        e = as_tensor(e, "e")
        if e.ndim != 2 or e.shape[1] != self.spec.K or not e.is_floating_point():
            raise SketchError(f"e must be floating with shape (n, {self.spec.K}), got {tuple(e.shape)} {e.dtype}")
        w_err = self._err_weight() if self.projections.err_signs is not None else None
        work = self._workspace()
        chunks = self._chunks(e.shape[0])
        parts = [self._project_err(self._error_rows(e, lo, hi), w_err, work) for lo, hi in chunks]
        v, v2 = self._concat(parts, chunks, 2)
        return v, v2

    def project(self, a: Any, e: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raw projections ``(u, u', v, v')`` of each token (unscaled).

        Parameters
        ----------
        a : tensor (n, d)
        e : tensor (n, K)

        Returns
        -------
        tuple of torch.Tensor
            Each (n, m) on the sketcher's device, in the error dtype.
        """
        a, e, _ = self._check(a, e, None)
        parts = [p[2:] for p in self._iter_projections(a, e)]  # padded rows already dropped
        u, u2, v, v2 = self._concat(parts, [(0, p[0].shape[0]) for p in parts], 4)
        return u, u2, v, v2

    def _set_chunk_rows(self, chunk_rows: int | None) -> None:
        if chunk_rows is None:
            chunk_rows = 1024 if self.device.type == "cuda" else 256
        if not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise SketchError(f"chunk_rows must be a positive int, got {chunk_rows!r}")
        if self._max_err_block:
            self.err_block = min(self._max_err_block, 1 << (chunk_rows.bit_length() - 1))
            chunk_rows = -(-chunk_rows // self.err_block) * self.err_block
        self.chunk_rows = chunk_rows

    def with_chunk_rows(self, chunk_rows: int) -> Self:
        """A copy sharing this one's projections and caches, with another fixed chunk size.

        Short inputs (a routing prompt of a few tokens) are padded to ``chunk_rows`` rows; a smaller
        chunk makes them several times cheaper. States of the two sketchers agree to float32 rounding,
        not bit for bit, so use one chunk size for everything that is merged or resumed.
        """
        clone = copy.copy(self)
        clone._set_chunk_rows(chunk_rows)
        return clone
