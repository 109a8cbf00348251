"""Fast Walsh–Hadamard transforms in plain PyTorch (CPU and CUDA, no compiled extension).

Two algorithms compute ``y = H_N x`` row-wise for ``x`` of shape (B, N), ``N = 2**p``, with the
unnormalised Sylvester matrix ``H_N[t, i] = (-1)**popcount(t & i)``:

* **butterfly** (:func:`fwht_butterfly`): the radix-2 ``view``+``cat`` butterfly of the paper,
  ``p`` passes over the data.
* **Kronecker GEMMs** (:class:`KronPlan`): ``H_N = H_{f_1} ⊗ … ⊗ H_{f_s}``; stage ``k`` contracts one
  base-``f_k`` digit of the index in place with a small dense ``H_{f_k}`` by one batched GEMM
  (``H_f @ X`` with X of shape (f, b) for the ``b`` lower index values, or ``X @ H_f`` for the last
  digit). Only ``s`` passes over the data, each a GEMM.

Subsampled outputs. The SRHT needs only ``m`` of the ``N`` outputs. A plan may mark a factor ``g``
as *gathered* (the most significant digit): the other stages are computed in full, then for each
requested output ``t = u·R + r`` only the ``g`` products ``Σ_i H_g[u, i] Z[i·R + r]`` are formed, so the
last stage costs ``O(m g)`` per row instead of ``O(N g)``.

All arithmetic is in the dtype of ``x`` (float32 for the sketch). Kronecker stages use
``torch.matmul``; on CUDA they are only exact float32 when ``torch.get_float32_matmul_precision()`` is
``"highest"`` (no TF32), which :func:`choose_plan` checks.

Plan rule (measured on the 2-core AMD EPYC dev box, float32, single-core CPU time, see
``bench/sketch/fwht.py`` and ``bench/results/sketch.md``): on CPU the fewest balanced Kronecker stages
of at most 32 (N ≤ 2**13) or 16 (larger N: each stage is a small-K GEMM, and 16 balances flops
against passes over memory), with the leftover digit ``g = 2**(log2 N mod 4)`` gathered when
``8 g m <= N`` (at m = 4096: N = 2**17 gathers 2, N = 2**18 gathers 4). This is the best measured plan
or within ~5 % of it for every N from 2**7 to 2**18 and 4–5x faster than the butterfly for
N ≥ 2**10. The butterfly is used only for N < 64. On CUDA the Kronecker plan (factors ≤ 2**7) is used
when float32 matmuls are exact (``torch.get_float32_matmul_precision() == "highest"``), otherwise the
butterfly — an unmeasured rule (no GPU on the dev box).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = [
    "KronPlan",
    "choose_plan",
    "fwht",
    "fwht_butterfly",
    "hadamard",
    "kron_factors",
]


@lru_cache(maxsize=64)
def _hadamard_cpu(f: int) -> torch.Tensor:
    H = torch.ones(1, 1, dtype=torch.float64)
    while H.shape[0] < f:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    return H


_HAD_CACHE: dict[tuple[int, torch.dtype, str], torch.Tensor] = {}


def hadamard(f: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """Sylvester Hadamard matrix ``H_f`` (unnormalised, symmetric, entries ±1).

    Parameters
    ----------
    f : int
        Order, a power of two.
    dtype : torch.dtype
    device : torch.device or str

    Returns
    -------
    torch.Tensor, shape (f, f)
    """
    if f < 1 or f & (f - 1):
        raise ValueError(f"Hadamard order must be a power of two, got {f}")
    key = (f, dtype, str(torch.device(device)))
    H = _HAD_CACHE.get(key)
    if H is None:
        H = _hadamard_cpu(f).to(dtype=dtype, device=device).contiguous()
        _HAD_CACHE[key] = H
    return H


def fwht_butterfly(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised FWHT along the last dimension by the radix-2 ``view``+``cat`` butterfly.

    This is Algorithm "Batched FWHT" of the paper (one pass per bit, new tensor per pass).

    Parameters
    ----------
    x : torch.Tensor, shape (..., N), N a power of two

    Returns
    -------
    torch.Tensor, shape (..., N)
        ``H_N x`` row-wise.
    """
    N = x.shape[-1]
    if N & (N - 1):
        raise ValueError(f"FWHT length must be a power of two, got {N}")
    lead = x.shape[:-1]
    y = x.reshape(-1, N)
    B = y.shape[0]
    h = 1
    while h < N:
        v = y.view(B, -1, 2, h)
        a, b = v[:, :, 0, :], v[:, :, 1, :]
        y = torch.cat((a + b, a - b), dim=2).view(B, N)
        h *= 2
    return y.view(*lead, N)


def kron_factors(N: int, max_factor: int) -> tuple[int, ...]:
    """Split ``N = 2**p`` into the fewest powers of two ``<= max_factor``, as equal as possible.

    Parameters
    ----------
    N : int
        Power of two.
    max_factor : int
        Power of two ``>= 2``.

    Returns
    -------
    tuple of int
        Factors in non-decreasing order whose product is ``N`` (empty for ``N = 1``); the largest
        comes last because the last (least significant) digit is contracted by the most efficient GEMM
        form.
    """
    p = int(math.log2(N))
    q = int(math.log2(max_factor))
    if p == 0:
        return ()
    stages = -(-p // q)
    base, extra = divmod(p, stages)
    return tuple(sorted(1 << (base + (1 if k < extra else 0)) for k in range(stages)))


@dataclass(frozen=True)
class KronPlan:
    """A transform plan for length ``N``.

    Attributes
    ----------
    N : int
        Transform length (power of two).
    method : {"kron", "butterfly"}
    factors : tuple of int
        Kronecker factors of the fully computed stages (method ``"kron"``).
    gathered : int
        Factor of the last, gathered stage (``1`` if none); ``prod(factors) * gathered == N`` for
        ``"kron"``.
    """

    N: int
    method: str
    factors: tuple[int, ...] = ()
    gathered: int = 1

    def __post_init__(self) -> None:
        if self.method not in ("kron", "butterfly"):
            raise ValueError(f"unknown FWHT method {self.method!r}")
        if self.method == "kron" and math.prod(self.factors) * self.gathered != self.N:
            raise ValueError(f"factors {self.factors} x {self.gathered} do not multiply to {self.N}")

    def describe(self) -> str:
        """Short description, e.g. ``"kron 32x32x32|4"`` or ``"butterfly"``."""
        if self.method == "butterfly":
            return "butterfly"
        full = "x".join(str(f) for f in self.factors) or "-"
        return f"kron {full}|{self.gathered}"


def choose_plan(N: int, m: int, device: torch.device | str, *, method: str = "auto") -> KronPlan:
    """The FWHT plan used by the sketcher for length ``N`` and ``m`` gathered outputs per row.

    Parameters
    ----------
    N : int
        Padded error length (power of two).
    m : int
        Number of gathered outputs.
    device : torch.device or str
    method : {"auto", "kron", "butterfly"}, default "auto"
        Force a method or apply the measured rule (module docstring).

    Returns
    -------
    KronPlan
    """
    dev = torch.device(device)
    if method == "auto":
        if dev.type == "cuda":
            exact = torch.get_float32_matmul_precision() == "highest"
            method = "kron" if exact and N >= 64 else "butterfly"
        else:
            method = "kron" if N >= 64 else "butterfly"
    if method == "butterfly" or N == 1:
        return KronPlan(N=N, method="butterfly")
    if method != "kron":
        raise ValueError(f"unknown FWHT method {method!r}")
    cpu_factor = 32 if N <= 1 << 13 else 16
    max_factor = 128 if dev.type == "cuda" else cpu_factor
    # Gather the leftover digit g = N / 16**k only when its g strided reads per output are few
    # (8 g m <= N); otherwise a full stage is as cheap (measured).
    p = N.bit_length() - 1
    g = 1 << (p % 4)
    gathered = g if g > 1 and 8 * g * m <= N else 1
    return KronPlan(N=N, method="kron", factors=kron_factors(N // gathered, max_factor), gathered=gathered)


def _kron_stage(src: torch.Tensor, a: int, f: int, b: int, H: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """One Kronecker stage: contract, in place, the base-``f`` digit with ``a`` above and ``b`` below.

    ``src`` holds rows of length ``a f b`` (any number of rows, contiguous); the result is written into
    ``dst`` (a flat buffer with at least ``src.numel()`` elements) and returned with ``src``'s shape.
    The digit order is unchanged (no transpose): for ``b > 1`` this is the batched GEMM
    ``H_f @ X`` with ``X`` of shape (f, b); for the last digit (``b = 1``) it is ``X @ H_f``
    with ``X`` of shape (rows·a, f) (``H_f`` is symmetric).
    """
    n = src.numel()
    out = dst[:n]
    if b == 1:
        torch.matmul(src.reshape(-1, f), H, out=out.view(-1, f))
    else:
        torch.matmul(H, src.reshape(-1, f, b), out=out.view(-1, f, b))
    return out.view(src.shape)


def _stage_shapes(N: int, factors: Sequence[int], high: int = 1) -> list[tuple[int, int, int]]:
    """``(a, f, b)`` of each stage for the digit layout (high, f_1, …, f_s) of an index in [0, N)."""
    shapes = []
    above = high
    for f in factors:
        below = N // (above * f)
        shapes.append((above, f, below))
        above *= f
    return shapes


def fwht(x: torch.Tensor, plan: KronPlan | None = None, *, work: torch.Tensor | None = None) -> torch.Tensor:
    """Full unnormalised FWHT of each row of ``x`` by ``plan`` (no gathering).

    Parameters
    ----------
    x : torch.Tensor, shape (B, N)
    plan : KronPlan, optional
        Defaults to ``choose_plan(N, N, x.device)``; its gathered factor is computed in full here.
    work : torch.Tensor, optional
        Flat scratch buffer with ``2 * B * N`` elements of ``x.dtype`` (allocated if omitted).

    Returns
    -------
    torch.Tensor, shape (B, N)
    """
    B, N = x.shape
    if plan is None:
        plan = choose_plan(N, N, x.device)
    if plan.method == "butterfly":
        return fwht_butterfly(x)
    if work is None:
        work = torch.empty(2 * B * N, dtype=x.dtype, device=x.device)
    bufs = (work[: B * N], work[B * N : 2 * B * N])
    y = x.contiguous()
    factors = (plan.gathered, *plan.factors) if plan.gathered > 1 else plan.factors
    for a, f, b in _stage_shapes(N, factors):
        dst = bufs[1] if y.data_ptr() == bufs[0].data_ptr() else bufs[0]
        y = _kron_stage(y, a, f, b, hadamard(f, x.dtype, x.device), dst)
    return y.clone()


class GatheredHadamard:
    """``(H_N x)[:, I_g]`` for G groups of rows, each group with its own output index set.

    Parameters
    ----------
    plan : KronPlan
    index : torch.Tensor, int64 (G, m)
        Output indices per group (entries in ``[0, N)``).
    dtype : torch.dtype
    device : torch.device

    Notes
    -----
    The index of a row is split into digits (g, f_1, …, f_s), g most significant. The full stages
    contract f_1 … f_s in place; then output ``t = u R + r`` (``R = N / g``) is
    ``Σ_i H_g[u, i] Z[i R + r]``: ``g`` strided reads per output, precomputed here as flat positions
    and weights.
    """

    def __init__(self, plan: KronPlan, index: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
        self.plan = plan
        self.index = index.to(device=device, dtype=torch.int64)
        self.dtype = dtype
        self.device = device
        self.groups, self.m = self.index.shape
        g = plan.gathered
        # Gather in increasing index order (memory locality), then restore the requested order.
        order = torch.argsort(self.index, dim=1, stable=True)
        self._sorted = torch.gather(self.index, 1, order)
        self._unsort: list[torch.Tensor | None] = []
        for k in range(self.groups):
            identity = bool(torch.equal(order[k], torch.arange(self.m, device=device)))
            self._unsort.append(None if identity else torch.argsort(order[k]))
        # Flat positions of the g inputs of each gathered output in the (g, R) layout, and the
        # matching rows of H_g: output t = u R + r is sum_i H_g[u, i] Z[i R + r], u = t // R, r = t % R.
        R = plan.N // g
        lanes = torch.arange(g, device=device, dtype=torch.int64)[:, None] * R
        self._flat = [(lanes + (self._sorted[k] % R)[None, :]).reshape(-1).contiguous() for k in range(self.groups)]
        Hg = hadamard(g, dtype, device)
        self._weights = [Hg[self._sorted[k] // R].T.contiguous() for k in range(self.groups)]  # (g, m)
        self._stages = _stage_shapes(plan.N, plan.factors, high=g)
        self._stage_h = [hadamard(f, dtype, device) for f in plan.factors]

    def workspace_numel(self, rows: int) -> int:
        """Scratch elements needed for ``rows`` input rows (all groups together)."""
        return 2 * rows * self.plan.N

    def __call__(self, x: torch.Tensor, work: torch.Tensor | None = None,
                 out: Sequence[torch.Tensor] | None = None) -> torch.Tensor | None:
        """Transform and gather.

        Parameters
        ----------
        x : torch.Tensor, shape (G * B, N), contiguous
            Group ``k`` is rows ``[k B, (k+1) B)``. Not modified.
        work : torch.Tensor, optional
            Flat scratch buffer with at least ``workspace_numel(G * B)`` elements, not overlapping ``x``.
        out : sequence of G tensors of shape (B, m), optional
            Where to write the outputs of each group (views are fine).

        Returns
        -------
        torch.Tensor of shape (G, B, m), or None when ``out`` is given.
        """
        rows, N = x.shape
        G = self.groups
        B = rows // G
        if out is None:
            result = torch.empty(G, B, self.m, dtype=x.dtype, device=x.device)
            out = list(result)
        else:
            result = None
        if self.plan.method == "butterfly":
            y = fwht_butterfly(x).view(G, B, N)
            for k in range(G):
                torch.index_select(y[k], 1, self.index[k], out=out[k])
            return result
        if work is None:
            work = torch.empty(self.workspace_numel(rows), dtype=x.dtype, device=x.device)
        bufs = (work[: rows * N], work[rows * N : 2 * rows * N])
        y = x
        for (a, f, b), H in zip(self._stages, self._stage_h, strict=True):
            # Ping-pong: never write into the buffer that holds the current input.
            dst = bufs[1] if y.data_ptr() == bufs[0].data_ptr() else bufs[0]
            y = _kron_stage(y, a, f, b, H, dst)
        g = self.plan.gathered
        z = y.view(G, B, N)
        for k in range(G):
            cols = z[k].index_select(1, self._flat[k])  # (B, g*m); 2-D index_select is the fast path
            unsort = self._unsort[k]
            if g == 1:
                res = cols
            elif unsort is None:
                torch.sum(cols.view(B, g, self.m) * self._weights[k], dim=1, out=out[k])
                continue
            else:
                res = torch.sum(cols.view(B, g, self.m) * self._weights[k], dim=1)
            if unsort is None:
                out[k].copy_(res)
            else:
                torch.index_select(res, 1, unsort, out=out[k])
        return result
