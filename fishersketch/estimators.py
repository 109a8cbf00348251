"""Alignment estimators from sketch states (paper, Appendix "Linear-Time Head Fisher Alignment").

Kernel means. For tasks ``i != j`` and feature ``f`` in {ae, a, e}:
``S_f(i, j) = <μ_f,i, μ_f,j>`` with ``μ = Σψ / n`` — already unbiased because the two tasks' draws are
independent. For ``i = j`` the U-statistic ``S_f(i, i) = (‖Σψ‖² − Σ‖ψ‖²) / (n (n − 1))`` removes the
self-pairs. Every ``S`` is clamped before any ratio at ``EPS = 1e-10`` relative to the tasks' own scale:
``S_f(i, j) ≥ EPS · sqrt(q_f,i q_f,j)`` with ``q_f,i = Σ‖ψ_f‖² / n_i`` the task's mean squared feature norm
per draw (the paper's fixed ε in units of the data, so that every estimate is invariant to the scale of ``a``
and ``e``: with an absolute ε a gradient of a mean-reduced loss, ``e / n_tokens``, fell under it and the error
factor read 0).

Point estimates use the pooled A ∪ B sums (all ``n_i n_j`` cross pairs, the lowest-variance
unbiased choice):

* ``fisher``      Â_F = S_ae(i,j) / sqrt(S_ae(i,i) S_ae(j,j))
* ``activation``  S_cov(M_a) = S_a(i,j) / sqrt(S_a(i,i) S_a(j,j)); ``error`` S_cov(Γ_e) likewise
* ``proxy``       activation · error (the Kronecker proxy)
* ``chi``         χ_ij = S_ae / (S_a S_e);  ``rho`` ρ = fisher / proxy (= χ_ij / sqrt(χ_ii χ_jj) before
                  clipping), bounded to ``[1 / RHO_MAX, RHO_MAX]``

Ranges (docs/SCORES.md): ``fisher``, ``activation``, ``error``, ``proxy`` and ``fisher_eb`` are cosines in
``[0, 1]`` — the cross kernel mean of a pair is clamped at its floor below, and a ratio above 1 (the cross
term of a small task can exceed the unbiased self terms by noise) is clipped to 1 with the flag
``cosine_clipped``. Identical states (``align(a, a)``) give exactly 1 for every cosine and ρ = 1.

Split-half diagnostics use within-split estimates (both tasks' split-A sums, then split-B sums):
``log ρ^A``, ``log ρ^B`` (each the log of that half's ρ as above — from cosines clipped to 1 and ρ bounded —
where the paper writes ``log χ^s_ij − ½ log χ^s_ii − ½ log χ^s_jj`` of clamped S; they differ only where a half's
cosine exceeds 1 by noise or its ρ hits a bound, and a review measured the same accuracy against exact log ρ,
RMSE 0.1685 against 0.1690), ``log_rho_split = (log ρ^A + log ρ^B) / 2`` and
``se = |log ρ^A − log ρ^B| / 2``. :func:`align_matrix` adds the empirical-Bayes shrinkage over the
off-diagonal pairs (``c = 1.5``): ``τ² = max(0, Var(ℓ̄) − c mean(SE²))``,
``w = τ² / (τ² + SE² + 1e-10)``, ``ρ^EB = exp(w ℓ̄)``, ``Â_F^EB = proxy · ρ^EB``, ``α_EB = mean w`` and
the split-half reliability ``r = corr(log ρ^A, log ρ^B)``.

Degenerate inputs never give NaN or Inf; they give the documented neutral values and a flag:

* ``empty``           a task has no draws: every similarity is 0, ρ = 1.
* ``single_draw``     a task has one draw: its self terms use ``‖ψ‖²`` (V-statistic) instead.
* ``zero_norm_<f>``   a self term of feature f is ≤ EPS · q_f after the U-statistic (zero or noise-dominated
                      data): the cosines of f with that task are 0 and ρ = 1, χ = 0.
* ``clamped``         a cross term was below its floor EPS · sqrt(q_f,i q_f,j) and clamped.
* ``rho_bounded``     ρ hit its bound (proxy near 0).
* ``cosine_clipped``  a cosine ratio above 1 was clipped to 1.
* ``identical``       the two states are identical (all cosines and ρ exactly 1).
* ``split_half_unavailable``  a split has fewer than 2 draws (or zero norm) for a task: log ρ^A,
                      log ρ^B, log_rho_split, se are 0 and the pair gets weight 0 in the shrinkage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fishersketch.errors import SketchError, SpecMismatch
from fishersketch.state import SketchState

__all__ = ["EB_C", "EPS", "RHO_MAX", "AlignmentResult", "MatrixResult", "align", "align_matrix"]

EPS = 1e-10
"""Clamp of every kernel mean before ratios (paper: ε = 1e-10), relative to the tasks' mean squared feature norms
per draw (module docstring)."""
EB_C = 1.5
"""Noise inflation factor of the empirical-Bayes τ² (paper: c = 1.5)."""
RHO_MAX = 100.0
"""ρ is bounded to ``[1 / RHO_MAX, RHO_MAX]``; a pair that hits the bound gets the ``rho_bounded`` flag
(its proxy activation · error is near 0, so the ratio fisher / proxy carries no information)."""

_FEATURES = ("ae", "a", "e")


@dataclass(frozen=True)
class AlignmentResult:
    """Alignment of one pair of tasks (see the module docstring for the definitions).

    Attributes
    ----------
    fisher, activation, error, proxy, chi, rho : float
    log_rho_split, se, log_rho_a, log_rho_b : float
        Split-half diagnostics.
    s_ae, s_a, s_e : float
        Cross kernel means S_f(i, j) (clamped at EPS · sqrt(q_i q_j); module docstring).
    n_i, n_j : int
        Draws of the two tasks.
    flags : tuple of str
    """

    fisher: float
    activation: float
    error: float
    proxy: float
    chi: float
    rho: float
    log_rho_split: float
    se: float
    log_rho_a: float
    log_rho_b: float
    s_ae: float
    s_a: float
    s_e: float
    n_i: int
    n_j: int
    flags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary (JSON-serialisable; flags as a list)."""
        out = asdict(self)
        out["flags"] = list(self.flags)
        return out


@dataclass(frozen=True)
class MatrixResult:
    """All pairwise alignments of T tasks plus the empirical-Bayes shrinkage of ρ.

    Attributes
    ----------
    fisher, activation, error, proxy, chi, rho : np.ndarray, float64 (T, T)
        Pooled point estimates (diagonal: 1 for valid tasks; chi diagonal is χ_ii).
    log_rho_split, se, log_rho_a, log_rho_b : np.ndarray, float64 (T, T)
    weight : np.ndarray, float64 (T, T)
        Shrinkage weights w_ij (0 on the diagonal and for pairs without split halves).
    rho_eb, fisher_eb : np.ndarray, float64 (T, T)
        ρ^EB = exp(w ℓ̄) and Â_F^EB = proxy · ρ^EB (diagonal 1 for valid tasks).
    s_ae, s_a, s_e : np.ndarray, float64 (T, T)
        Kernel means (diagonal: U-statistics), clamped at EPS · sqrt(q_i q_j).
    n_draws : np.ndarray, int64 (T,)
    alpha_eb, tau2, reliability_r, v_total, v_noise, c : float
    flags : tuple of str
        Matrix-level flags (``eb_insufficient_pairs``, ``reliability_undefined``).
    pair_flags : dict
        ``(i, j) -> flags`` for ``i < j`` pairs with at least one flag.
    """

    fisher: np.ndarray
    activation: np.ndarray
    error: np.ndarray
    proxy: np.ndarray
    chi: np.ndarray
    rho: np.ndarray
    log_rho_split: np.ndarray
    se: np.ndarray
    log_rho_a: np.ndarray
    log_rho_b: np.ndarray
    weight: np.ndarray
    rho_eb: np.ndarray
    fisher_eb: np.ndarray
    s_ae: np.ndarray
    s_a: np.ndarray
    s_e: np.ndarray
    n_draws: np.ndarray
    alpha_eb: float
    tau2: float
    reliability_r: float
    v_total: float
    v_noise: float
    c: float = EB_C
    flags: tuple[str, ...] = ()
    pair_flags: dict[tuple[int, int], tuple[str, ...]] = field(default_factory=dict)

    def pair(self, i: int, j: int) -> AlignmentResult:
        """The :class:`AlignmentResult` of pair ``(i, j)`` (pooled and split-half fields)."""
        key = (min(i, j), max(i, j))
        return AlignmentResult(
            fisher=float(self.fisher[i, j]), activation=float(self.activation[i, j]),
            error=float(self.error[i, j]), proxy=float(self.proxy[i, j]), chi=float(self.chi[i, j]),
            rho=float(self.rho[i, j]), log_rho_split=float(self.log_rho_split[i, j]), se=float(self.se[i, j]),
            log_rho_a=float(self.log_rho_a[i, j]), log_rho_b=float(self.log_rho_b[i, j]),
            s_ae=float(self.s_ae[i, j]), s_a=float(self.s_a[i, j]), s_e=float(self.s_e[i, j]),
            n_i=int(self.n_draws[i]), n_j=int(self.n_draws[j]), flags=self.pair_flags.get(key, ()),
        )


@dataclass
class _Kernels:
    """Kernel means of one data view (pooled, split A or split B), in the tasks' own units.

    Each task's features are divided by ``root = sqrt(q)``, ``q`` its mean squared feature norm per draw, before any
    product: ``S`` is ``S_raw(i, j) / (root_i root_j)``, of order 1 whatever the scale of ``a`` and ``e``, so the
    clamp at :data:`EPS` is relative and nothing underflows (raw kernel means of features near 1e-150 did)."""

    S: np.ndarray  # (3, T, T) unclamped, normalized; diagonal = self term
    n: np.ndarray  # (T,) draws
    self_ok: np.ndarray  # (3, T) self term > EPS (normalized)
    v_stat: np.ndarray  # (T,) self terms used the V-statistic (n == 1)
    root: np.ndarray  # (3, T) sqrt(q): the raw kernel mean is S · root_i · root_j


def _kernels(sums: np.ndarray, sq: np.ndarray, n: np.ndarray, *, allow_v: bool) -> _Kernels:
    """Kernel means from stacked sums (T, 3, m), squared norms (T, 3) and draws (T,)."""
    T = sums.shape[0]
    nf = n.astype(np.float64)
    safe = np.where(nf > 0, nf, 1.0)
    # a task's own units: q = mean squared feature norm per draw (1 for a task of no draws or of all-zero features,
    # whose terms are 0 and invalid anyway)
    per_draw = sq.T / safe[None, :]
    q = np.where((n[None, :] > 0) & (per_draw > 0) & np.isfinite(per_draw), per_draw, 1.0)  # (3, T)
    root = np.sqrt(q)
    sums = sums / root.T[:, :, None]
    sq = sq / q.T
    mu = sums / safe[:, None, None]
    mu[n == 0] = 0.0
    S = np.stack([mu[:, f] @ mu[:, f].T for f in range(3)])  # (3, T, T) Gram matrices (BLAS)
    norms2 = np.einsum("ifm,ifm->fi", sums, sums)  # (3, T)
    self_terms = np.zeros((3, T))
    many = n >= 2
    denom = nf * (nf - 1.0)
    self_terms[:, many] = (norms2[:, many] - sq.T[:, many]) / denom[many]
    v_stat = n == 1
    if allow_v:
        self_terms[:, v_stat] = sq.T[:, v_stat]
        has = n >= 1
    else:
        has = many
    idx = np.arange(T)
    S[:, idx, idx] = self_terms
    self_ok = (self_terms > EPS) & has[None, :]
    return _Kernels(S=S, n=n, self_ok=self_ok, v_stat=v_stat & allow_v, root=root)


def _cosines_and_rho(k: _Kernels, same: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Cosines, χ, ρ and validity masks from one kernel view (all (T, T), no NaN).

    Cosines are clipped to ``[0, 1]`` (the cross kernel mean of a pair can exceed the product of
    the unbiased self terms by sampling noise); ``same[i, j]`` marks identical states, whose cosines
    and ρ are exactly 1. ρ = fisher / proxy is bounded to ``[1 / RHO_MAX, RHO_MAX]``.
    """
    C = np.maximum(k.S, EPS)
    T = C.shape[1]
    out: dict[str, np.ndarray] = {}
    valid_f = [k.self_ok[f][:, None] & k.self_ok[f][None, :] for f in range(3)]
    eye = np.eye(T, dtype=bool)
    ident = eye if same is None else (same | eye)
    clipped = np.zeros((T, T), dtype=bool)
    for f, name in enumerate(("fisher", "activation", "error")):
        d = np.diagonal(C[f])
        cos = C[f] / np.sqrt(np.outer(d, d))
        clipped |= valid_f[f] & (cos > 1.0) & ~ident
        cos = np.minimum(cos, 1.0)
        cos = np.where(ident & (k.n[:, None] > 0), 1.0, cos)
        out[name] = np.where(valid_f[f] | (ident & (k.n[:, None] > 0)), cos, 0.0)
    out["proxy"] = out["activation"] * out["error"]
    # χ in raw units (a diagnostic): the normalized ratio times root_ae,i root_ae,j / (root_a,i root_a,j root_e,i …)
    lg = np.log(k.root)  # (3, T): the units' product in log space (roots near 1e-150 underflowed as products)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        units = np.exp((lg[0][:, None] + lg[0][None, :]) - (lg[1][:, None] + lg[1][None, :])
                       - (lg[2][:, None] + lg[2][None, :]))
        chi = np.nan_to_num(C[0] / (C[1] * C[2]) * units, nan=0.0, posinf=np.finfo(np.float64).max)
    rho_ok = valid_f[0] & valid_f[1] & valid_f[2]
    raw = out["fisher"] / np.maximum(out["proxy"], EPS)
    bounded = rho_ok & ((raw > RHO_MAX) | (raw < 1.0 / RHO_MAX))
    rho = np.clip(raw, 1.0 / RHO_MAX, RHO_MAX)
    rho = np.where(ident, 1.0, rho)
    out["chi"] = np.where(rho_ok, chi, 0.0)
    out["rho"] = np.where(rho_ok, rho, 1.0)
    out["log_rho"] = np.where(rho_ok, np.log(np.where(rho_ok, rho, 1.0)), 0.0)
    out["rho_ok"] = rho_ok | (ident & (k.n[:, None] > 0) & (k.n[None, :] > 0) & ~eye)
    out["rho_bounded"] = bounded & ~ident
    out["cos_clipped"] = clipped
    out["clamped"] = (k.S < EPS) & ~eye
    return out


def _identical(sums: np.ndarray, sq: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``(T, T)`` mask of pairs of byte-identical states (same sums, squared norms and draws)."""
    T = sums.shape[0]
    keys = [hash((a.tobytes(), b.tobytes(), c.tobytes())) for a, b, c in zip(sums, sq, n, strict=True)]
    same = np.zeros((T, T), dtype=bool)
    for i in range(T):
        for j in range(i + 1, T):
            if keys[i] == keys[j] and np.array_equal(sums[i], sums[j]) and np.array_equal(n[i], n[j]):
                same[i, j] = same[j, i] = True
    return same


def _stack(states: Sequence[SketchState]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sums = np.stack([s.sums for s in states])  # (T, 2, 3, m)
    sq = np.stack([s.sq_norms for s in states])  # (T, 2, 3)
    n = np.stack([s.draw_counts() for s in states]).astype(np.int64)  # (T, 2)
    return sums, sq, n


def _check_states(states: Sequence[SketchState]) -> None:
    if len(states) == 0:
        raise SketchError("need at least one state")
    for s in states:
        if not isinstance(s, SketchState):
            raise SketchError(f"expected SketchState, got {type(s).__name__}")
    fp = states[0].spec.fingerprint()
    for s in states[1:]:
        if s.spec.fingerprint() != fp:
            raise SpecMismatch(f"cannot align states of different specs: {states[0].spec.describe()} vs "
                               f"{s.spec.describe()}")


def _pair_flags(i: int, j: int, pooled: _Kernels, cp: dict[str, np.ndarray], split_ok: np.ndarray) -> tuple[str, ...]:
    flags: list[str] = []
    if pooled.n[i] == 0 or pooled.n[j] == 0:
        flags.append("empty")
    if pooled.v_stat[i] or pooled.v_stat[j]:
        flags.append("single_draw")
    for f, name in enumerate(_FEATURES):
        has = pooled.n[[i, j]] > 0
        if np.any(~pooled.self_ok[f, [i, j]] & has):
            flags.append(f"zero_norm_{name}")
    if bool(np.any(cp["clamped"][:, i, j])):
        flags.append("clamped")
    if not split_ok[i, j]:
        flags.append("split_half_unavailable")
    if cp["rho_bounded"][i, j]:
        flags.append("rho_bounded")
    if cp["cos_clipped"][i, j]:
        flags.append("cosine_clipped")
    if cp["same"][i, j]:
        flags.append("identical")
    return tuple(flags)


def align_matrix(states: Sequence[SketchState], *, c: float = EB_C) -> MatrixResult:
    """All pairwise alignments of ``states`` with empirical-Bayes shrinkage of ρ.

    Parameters
    ----------
    states : sequence of SketchState
        T states of one spec, each holding the draws of a different task.
    c : float, default 1.5
        Noise inflation of τ² (paper: c ∈ [1.5, 2]).

    Returns
    -------
    MatrixResult

    Raises
    ------
    SpecMismatch
        The states do not share one spec.
    """
    states = list(states)
    _check_states(states)
    T = len(states)
    sums, sq, n = _stack(states)
    pooled = _kernels(sums.sum(axis=1), sq.sum(axis=1), n.sum(axis=1), allow_v=True)
    same = _identical(sums, sq, n)
    cp = _cosines_and_rho(pooled, same)
    cp["same"] = same
    # Kernel matrices shared by every pair: S[f] with clamping, as reported.
    with np.errstate(over="ignore", under="ignore"):  # the kernel means as reported: in raw units again
        C = np.maximum(pooled.S, EPS) * (pooled.root[:, :, None] * pooled.root[:, None, :])
    # Split halves (within-split estimates, no V-statistic fallback).
    halves = [_kernels(sums[:, s], sq[:, s], n[:, s], allow_v=False) for s in (0, 1)]
    hcp = [_cosines_and_rho(h, same) for h in halves]
    split_ok = hcp[0]["rho_ok"] & hcp[1]["rho_ok"]
    eye = np.eye(T, dtype=bool)
    log_a = np.where(split_ok, hcp[0]["log_rho"], 0.0)
    log_b = np.where(split_ok, hcp[1]["log_rho"], 0.0)
    lbar = 0.5 * (log_a + log_b)
    se = 0.5 * np.abs(log_a - log_b)
    for arr in (log_a, log_b, lbar, se):
        arr[eye] = 0.0

    iu, ju = np.triu_indices(T, k=1)
    ok = split_ok[iu, ju]
    flags: list[str] = []
    lp, sp = lbar[iu, ju][ok], se[iu, ju][ok]
    if lp.size >= 2:
        v_total = float(np.var(lp, ddof=1))
        v_noise = float(np.mean(sp**2))
        tau2 = max(0.0, v_total - c * v_noise)
    else:
        v_total = v_noise = tau2 = 0.0
        flags.append("eb_insufficient_pairs")
    weight = np.where(split_ok & ~eye, tau2 / (tau2 + se**2 + 1e-10), 0.0)
    alpha = float(np.mean(weight[iu, ju][ok])) if lp.size else 0.0
    rho_eb = np.exp(weight * lbar)
    fisher_eb = np.clip(cp["proxy"] * rho_eb, 0.0, 1.0)
    la, lb = log_a[iu, ju][ok], log_b[iu, ju][ok]
    if la.size >= 3 and np.std(la) > 0 and np.std(lb) > 0:
        r = float(np.corrcoef(la, lb)[0, 1])
    else:
        r = 0.0
        flags.append("reliability_undefined")

    pair_flags: dict[tuple[int, int], tuple[str, ...]] = {}
    for i, j in zip(iu.tolist(), ju.tolist(), strict=True):
        pf = _pair_flags(i, j, pooled, cp, split_ok)
        if pf:
            pair_flags[(i, j)] = pf

    return MatrixResult(
        fisher=cp["fisher"], activation=cp["activation"], error=cp["error"], proxy=cp["proxy"],
        chi=cp["chi"], rho=cp["rho"], log_rho_split=lbar, se=se, log_rho_a=log_a, log_rho_b=log_b,
        weight=weight, rho_eb=rho_eb, fisher_eb=fisher_eb, s_ae=C[0], s_a=C[1], s_e=C[2],
        n_draws=n.sum(axis=1), alpha_eb=alpha, tau2=float(tau2), reliability_r=r, v_total=v_total,
        v_noise=v_noise, c=float(c), flags=tuple(flags), pair_flags=pair_flags,
    )


def align(state_i: SketchState, state_j: SketchState) -> AlignmentResult:
    """Alignment of two tasks (pooled point estimates and split-half log ρ with its SE).

    Parameters
    ----------
    state_i, state_j : SketchState
        States of one spec. The cross terms assume the two tasks' draws are independent; a state aligned with
        itself (or with a byte-identical copy) is flagged ``identical`` and every cosine and ρ is exactly 1 — an
        empty one (no draws) gives 0 with the flag ``empty`` as well.

    Returns
    -------
    AlignmentResult

    Raises
    ------
    SpecMismatch
        The states have different specs.
    """
    return align_matrix([state_i, state_j]).pair(0, 1)
