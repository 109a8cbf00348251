"""Exact head Fisher alignment by the kernel identity (validation reference, O(n_i n_j (d + K))).

For tasks with tokens ``(a_s, e_s)`` the head Fisher is ``F = mean_s (a_s ⊗ e_s)(a_s ⊗ e_s)ᵀ`` and

``<F_i, F_j>_F = mean_{s∈i, t∈j} ((a_s·a_t)(e_s·e_t))² = mean((G_a ∘ G_e)²)``,

with the Gram matrices ``G_a = A_i A_jᵀ`` and ``G_e = E_i E_jᵀ``; likewise
``<M_a,i, M_a,j>_F = mean(G_a²)`` for ``M_a = mean a aᵀ`` and ``<Γ_e,i, Γ_e,j>_F = mean(G_e²)``.
The Gram matrices are formed in tiles of at most ``tile x tile`` entries, never a (dK)² or (n_i x n_j)
array, in float64.

``statistic="v"`` (default) includes the self-pairs ``s = t`` on the diagonal: this is the cosine of the
materialised empirical matrices (the paper's exact baseline). ``statistic="u"`` drops them (the
population target of the sketch's U-statistic, for sketch-versus-exact comparisons).

Sequence granularity (shared-parameter kernel): with sample ids, a draw is a sample with
``g = Σ_t a_t ⊗ e_t``; ``<g, g'> = Σ_{t∈s, t'∈s'} (a_t·a_t')(e_t·e_t')``, ``S_ae = mean over sample
pairs of <g, g'>²``, ``S_a = mean ‖A_s A_s'ᵀ‖_F²`` and ``S_e = mean ‖E_s E_s'ᵀ‖_F²`` (the Gram matrix of the two
samples' tokens, ``(n_s, n_s')``: defined for samples of different lengths).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from fishersketch.errors import SketchError

__all__ = [
    "ExactMatrix",
    "ExactResult",
    "exact_alignment",
    "exact_alignment_naive",
    "exact_matrix",
    "exact_matrix_naive",
]

Statistic = Literal["v", "u"]


@dataclass(frozen=True)
class ExactResult:
    """Exact alignment of one pair.

    Attributes
    ----------
    fisher : float
        A_F = <F_i, F_j> / (‖F_i‖ ‖F_j‖).
    activation : float
        S_cov(M_a).
    error : float
        S_cov(Γ_e).
    proxy : float
        Kronecker proxy ``activation * error``.
    chi : float
        χ_ij = S_ae(i,j) / (S_a(i,j) S_e(i,j)).
    rho : float
        ρ = χ_ij / sqrt(χ_ii χ_jj) = fisher / proxy.
    s_ae, s_a, s_e : np.ndarray, float64 (3,)
        Kernel means ``[S(i,i), S(j,j), S(i,j)]``.
    statistic : {"v", "u"}
    """

    fisher: float
    activation: float
    error: float
    proxy: float
    chi: float
    rho: float
    s_ae: np.ndarray
    s_a: np.ndarray
    s_e: np.ndarray
    statistic: str


@dataclass(frozen=True)
class ExactMatrix:
    """Exact kernel means and alignments of T tasks (all arrays (T, T), float64).

    Attributes
    ----------
    s_ae, s_a, s_e : np.ndarray
        Kernel means (diagonal per ``statistic``).
    fisher, activation, error, proxy, chi, rho : np.ndarray
    statistic : {"v", "u"}
    """

    s_ae: np.ndarray
    s_a: np.ndarray
    s_e: np.ndarray
    fisher: np.ndarray
    activation: np.ndarray
    error: np.ndarray
    proxy: np.ndarray
    chi: np.ndarray
    rho: np.ndarray
    statistic: str


def _to64(x: Any, name: str, device: torch.device) -> torch.Tensor:
    t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.ndim != 2 or not t.is_floating_point():
        raise SketchError(f"{name} must be a 2-D floating array, got shape {tuple(t.shape)} dtype {t.dtype}")
    if not bool(torch.isfinite(t).all()):
        raise SketchError(f"{name} contains NaN or Inf")
    return t.to(device=device, dtype=torch.float64)


@dataclass
class _Task:
    a: torch.Tensor
    e: torch.Tensor
    groups: torch.Tensor | None  # (n,) sample index in [0, S) for sequence granularity
    n_draws: int


def _prepare(tasks: Sequence[tuple[Any, Any]], sample_ids: Sequence[Any] | None, device: torch.device) -> list[_Task]:
    out: list[_Task] = []
    for k, (a, e) in enumerate(tasks):
        a64, e64 = _to64(a, f"a[{k}]", device), _to64(e, f"e[{k}]", device)
        if a64.shape[0] != e64.shape[0]:
            raise SketchError(f"task {k}: a and e have {a64.shape[0]} and {e64.shape[0]} rows")
        if out and (a64.shape[1] != out[0].a.shape[1] or e64.shape[1] != out[0].e.shape[1]):
            raise SketchError("all tasks must have the same d and K")
        groups = None
        n = a64.shape[0]
        if sample_ids is not None:
            ids = np.asarray(sample_ids[k]).reshape(-1)
            if ids.shape != (a64.shape[0],):
                raise SketchError(f"task {k}: sample_ids must have shape ({a64.shape[0]},)")
            _, inv = np.unique(ids, return_inverse=True)
            groups = torch.from_numpy(inv.reshape(-1).astype(np.int64)).to(device)
            n = int(inv.max()) + 1 if inv.size else 0
        out.append(_Task(a64, e64, groups, n))
    return out


def _block_token(ti: _Task, tj: _Task, tile: int, same: bool, statistic: Statistic) -> np.ndarray:
    """[Σ (G_a G_e)², Σ G_a², Σ G_e²] over token pairs, the diagonal removed for U and same task."""
    acc = torch.zeros(3, dtype=torch.float64, device=ti.a.device)
    ni, nj = ti.a.shape[0], tj.a.shape[0]
    for r0 in range(0, ni, tile):
        ar, er = ti.a[r0 : r0 + tile], ti.e[r0 : r0 + tile]
        for c0 in range(0, nj, tile):
            ga = ar @ tj.a[c0 : c0 + tile].T
            ge = er @ tj.e[c0 : c0 + tile].T
            gae = ga * ge
            acc += torch.stack([(gae * gae).sum(), (ga * ga).sum(), (ge * ge).sum()])
    if same and statistic == "u":
        na = (ti.a * ti.a).sum(1)
        ne = (ti.e * ti.e).sum(1)
        acc -= torch.stack([((na * ne) ** 2).sum(), (na**2).sum(), (ne**2).sum()])
    return acc.cpu().numpy()


def _block_sequence(ti: _Task, tj: _Task, tile: int, same: bool, statistic: Statistic) -> np.ndarray:
    """Sample-level sums [Σ <g,g'>², Σ ‖A_sᵀA_s'‖², Σ ‖E_sᵀE_s'‖²] over sample pairs."""
    assert ti.groups is not None and tj.groups is not None
    dev = ti.a.device
    Si, Sj = ti.n_draws, tj.n_draws
    kg = torch.zeros(Si, Sj, dtype=torch.float64, device=dev)
    ka = torch.zeros(Si, Sj, dtype=torch.float64, device=dev)
    ke = torch.zeros(Si, Sj, dtype=torch.float64, device=dev)
    ni, nj = ti.a.shape[0], tj.a.shape[0]
    for r0 in range(0, ni, tile):
        rows = slice(r0, r0 + tile)
        pi = torch.nn.functional.one_hot(ti.groups[rows], Si).to(torch.float64)  # (tr, Si)
        for c0 in range(0, nj, tile):
            cols = slice(c0, c0 + tile)
            pj = torch.nn.functional.one_hot(tj.groups[cols], Sj).to(torch.float64)
            ga = ti.a[rows] @ tj.a[cols].T
            ge = ti.e[rows] @ tj.e[cols].T
            kg += pi.T @ (ga * ge) @ pj
            ka += pi.T @ (ga * ga) @ pj
            ke += pi.T @ (ge * ge) @ pj
    if same and statistic == "u":
        idx = torch.arange(Si, device=dev)
        for k in (kg, ka, ke):
            k[idx, idx] = 0.0
    return torch.stack([(kg * kg).sum(), ka.sum(), ke.sum()]).cpu().numpy()


def _finish(S: np.ndarray, statistic: str) -> ExactMatrix:
    """Cosines, χ, ρ from kernel means S (3, T, T); zero self terms give 0 cosines and ρ = 1."""
    out = {}
    d = [np.diagonal(S[f]) for f in range(3)]
    ok = [(x > 0)[:, None] & (x > 0)[None, :] for x in d]
    for f, name in enumerate(("fisher", "activation", "error")):
        denom = np.sqrt(np.where(ok[f], np.outer(d[f], d[f]), 1.0))
        out[name] = np.where(ok[f], S[f] / denom, 0.0)
    all_ok = ok[0] & ok[1] & ok[2] & (S[1] > 0) & (S[2] > 0)
    chi = np.where(all_ok, S[0] / np.where(all_ok, S[1] * S[2], 1.0), 0.0)
    cd = np.diagonal(chi)
    cok = all_ok & (cd > 0)[:, None] & (cd > 0)[None, :]
    rho = np.where(cok, chi / np.sqrt(np.where(cok, np.outer(cd, cd), 1.0)), 1.0)
    return ExactMatrix(s_ae=S[0], s_a=S[1], s_e=S[2], fisher=out["fisher"], activation=out["activation"],
                       error=out["error"], proxy=out["activation"] * out["error"], chi=chi, rho=rho,
                       statistic=statistic)


def exact_matrix(tasks: Sequence[tuple[Any, Any]], *, statistic: Statistic = "v", tile: int = 2048,
                 sample_ids: Sequence[Any] | None = None, device: torch.device | str = "cpu") -> ExactMatrix:
    """Exact kernel means and alignments of all pairs of ``tasks``.

    Parameters
    ----------
    tasks : sequence of (a, e)
        ``a`` (n_k, d) and ``e`` (n_k, K) per task (tensors or arrays).
    statistic : {"v", "u"}, default "v"
        Diagonal with (V) or without (U) self-pairs.
    tile : int, default 2048
        Gram tiles are at most ``tile x tile``.
    sample_ids : sequence of arrays, optional
        Per-task sample ids of the tokens; switches to the sequence-granularity kernel.
    device : torch.device or str, default "cpu"

    Returns
    -------
    ExactMatrix
    """
    if statistic not in ("v", "u"):
        raise SketchError(f"statistic must be 'v' or 'u', got {statistic!r}")
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:  # range(0, n, 0) raised a bare ValueError
        raise SketchError(f"tile must be a positive integer, got {tile!r}")
    dev = torch.device(device)
    ts = _prepare(tasks, sample_ids, dev)
    T = len(ts)
    S = np.zeros((3, T, T))
    block = _block_sequence if sample_ids is not None else _block_token
    for i in range(T):
        for j in range(i, T):
            same = i == j
            sums = block(ts[i], ts[j], tile, same, statistic)
            ni, nj = ts[i].n_draws, ts[j].n_draws
            pairs = ni * (ni - 1) if (same and statistic == "u") else ni * nj
            vals = sums / pairs if pairs > 0 else np.zeros(3)
            S[:, i, j] = S[:, j, i] = vals
    return _finish(S, statistic)


def exact_alignment(a_i: Any, e_i: Any, a_j: Any, e_j: Any, *, statistic: Statistic = "v", tile: int = 2048,
                    sample_ids_i: Any | None = None, sample_ids_j: Any | None = None,
                    device: torch.device | str = "cpu") -> ExactResult:
    """Exact head Fisher alignment of two tasks, the exact S_cov(M_a), S_cov(Γ_e) and the proxy.

    Parameters
    ----------
    a_i, e_i : (n_i, d), (n_i, K)
    a_j, e_j : (n_j, d), (n_j, K)
    statistic : {"v", "u"}, default "v"
    tile : int, default 2048
    sample_ids_i, sample_ids_j : arrays, optional
        Token sample ids of both tasks for the sequence-granularity kernel (give both or neither).
    device : torch.device or str, default "cpu"

    Returns
    -------
    ExactResult
    """
    if (sample_ids_i is None) != (sample_ids_j is None):
        raise SketchError("give sample ids for both tasks or for neither")
    ids = None if sample_ids_i is None else [sample_ids_i, sample_ids_j]
    mat = exact_matrix([(a_i, e_i), (a_j, e_j)], statistic=statistic, tile=tile, sample_ids=ids, device=device)
    return _pair_result(mat)


def _pair_result(mat: ExactMatrix) -> ExactResult:
    def trio(x: np.ndarray) -> np.ndarray:
        return np.array([x[0, 0], x[1, 1], x[0, 1]])

    return ExactResult(
        fisher=float(mat.fisher[0, 1]), activation=float(mat.activation[0, 1]), error=float(mat.error[0, 1]),
        proxy=float(mat.proxy[0, 1]), chi=float(mat.chi[0, 1]), rho=float(mat.rho[0, 1]),
        s_ae=trio(mat.s_ae), s_a=trio(mat.s_a), s_e=trio(mat.s_e), statistic=mat.statistic,
    )


def _naive_sums(a1: np.ndarray, e1: np.ndarray, a2: np.ndarray, e2: np.ndarray, skip_diag: bool) -> np.ndarray:
    acc = np.zeros(3)
    for s in range(a1.shape[0]):
        for t in range(a2.shape[0]):
            if skip_diag and s == t:
                continue
            ga = float(np.dot(a1[s], a2[t]))
            ge = float(np.dot(e1[s], e2[t]))
            acc += (ga * ge * ga * ge, ga * ga, ge * ge)
    return acc


def exact_matrix_naive(tasks: Sequence[tuple[Any, Any]], *, statistic: Statistic = "v") -> ExactMatrix:
    """The paper's per-pair loop (``for s: for t: (<a_s,a_t><e_s,e_t>)²``) in Python, float64.

    Same result as :func:`exact_matrix` (token granularity) up to rounding; O(n² (d + K)) with Python
    overhead per pair — a timing baseline and a cross-check only.
    """
    arrs = [(np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)) for a, e in tasks]
    T = len(arrs)
    S = np.zeros((3, T, T))
    for i in range(T):
        for j in range(i, T):
            (a1, e1), (a2, e2) = arrs[i], arrs[j]
            same = i == j
            sums = _naive_sums(a1, e1, a2, e2, skip_diag=same and statistic == "u")
            n1, n2 = a1.shape[0], a2.shape[0]
            pairs = n1 * (n1 - 1) if (same and statistic == "u") else n1 * n2
            S[:, i, j] = S[:, j, i] = sums / pairs if pairs > 0 else 0.0
    return _finish(S, statistic)


def exact_alignment_naive(a_i: Any, e_i: Any, a_j: Any, e_j: Any, *, statistic: Statistic = "v") -> ExactResult:
    """:func:`exact_alignment` by the per-pair Python loop of :func:`exact_matrix_naive`."""
    mat = exact_matrix_naive([(a_i, e_i), (a_j, e_j)], statistic=statistic)
    return _pair_result(mat)
