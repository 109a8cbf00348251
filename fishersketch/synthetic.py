"""Synthetic tasks with controlled activation–error coupling (tests and benchmarks).

Task ``k`` draws, per token, a latent ``z ~ N(0, I_r)`` and an independent ``z' ~ N(0, I_r)``:

``a = s_k (U_k z + σ ξ)``,  ``e = V_k (c_k z + sqrt(1 − c_k²) z') + σ η``

with ``U_k = cos θ_k U_0 + sin θ_k W_k`` (shared plus task-specific activation subspace),
``V_k = cos φ_k V_0 + sin φ_k X_k`` (likewise for errors), coupling ``c_k ∈ [0, 1]`` (``c = 0``:
activations and errors independent, the Kronecker proxy is exact in expectation; ``c = 1``: errors are
a linear function of the same latent) and a task scale ``s_k``. The angles, couplings and scales are
drawn per task from the seed, so pairs span a wide range of Fisher alignment and of ρ.

``kind="mixture"`` replaces the Gaussian latent by ``classes`` token classes shared by all tasks, like a
classifier head: a token of class ``y`` has ``a = s_k (μ_y + σ ξ)`` and an error ``e = ν_y' + σ η`` where
``y' = y`` with probability ``c_k`` and a random class otherwise; task ``k`` has its own class
frequencies (Dirichlet). Coupling then changes the fourth moments strongly, so ρ varies widely.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SyntheticTask", "make_tasks"]


@dataclass(frozen=True)
class SyntheticTask:
    """One synthetic task.

    Attributes
    ----------
    a : np.ndarray, float32 (n, d)
    e : np.ndarray, float32 (n, K)
    sample_ids : np.ndarray, int64 (n,)
        Consecutive tokens grouped into samples of ``tokens_per_sample`` tokens.
    coupling, act_angle, err_angle, scale : float
        The task's parameters.
    """

    a: np.ndarray
    e: np.ndarray
    sample_ids: np.ndarray
    coupling: float
    act_angle: float
    err_angle: float
    scale: float


def _orth(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((rows, cols)))
    return q[:, :cols]


def make_tasks(n_tasks: int, n: int, d: int, K: int, *, rank: int = 4, noise: float = 0.3, seed: int = 0,
               tokens_per_sample: int = 8, scale_range: tuple[float, float] = (0.3, 3.0),
               id_offset: int = 0, kind: str = "gaussian", classes: int = 6) -> list[SyntheticTask]:
    """Draw ``n_tasks`` synthetic tasks of ``n`` tokens each.

    Parameters
    ----------
    n_tasks, n, d, K : int
    rank : int, default 4
        Latent dimension r (``r <= d`` and ``r <= K``).
    noise : float, default 0.3
        Isotropic noise σ on activations and errors.
    seed : int, default 0
    tokens_per_sample : int, default 8
    scale_range : (float, float), default (0.3, 3.0)
        Range of the log-uniform task scale ``s_k``.
    id_offset : int, default 0
        Sample ids of task k start at ``id_offset + k * n``.
    kind : {"gaussian", "mixture"}, default "gaussian"
    classes : int, default 6
        Number of token classes for ``kind="mixture"``.

    Returns
    -------
    list of SyntheticTask
    """
    if rank > min(d, K):
        raise ValueError("rank must not exceed d or K")
    if kind not in ("gaussian", "mixture"):
        raise ValueError(f"kind must be 'gaussian' or 'mixture', got {kind!r}")
    rng = np.random.default_rng(seed)
    if kind == "mixture":
        return _mixture_tasks(rng, n_tasks, n, d, K, noise, tokens_per_sample, scale_range, id_offset, classes)
    U0, V0 = _orth(rng, d, rank), _orth(rng, K, rank)
    tasks = []
    for k in range(n_tasks):
        theta = float(rng.uniform(0.0, np.pi / 2))
        phi = float(rng.uniform(0.0, np.pi / 2))
        c = float(rng.uniform(0.0, 1.0))
        s = float(np.exp(rng.uniform(np.log(scale_range[0]), np.log(scale_range[1]))))
        U = np.cos(theta) * U0 + np.sin(theta) * _orth(rng, d, rank)
        V = np.cos(phi) * V0 + np.sin(phi) * _orth(rng, K, rank)
        z = rng.standard_normal((n, rank))
        z2 = rng.standard_normal((n, rank))
        a = s * (z @ U.T + noise * rng.standard_normal((n, d)))
        e = (c * z + np.sqrt(1.0 - c * c) * z2) @ V.T + noise * rng.standard_normal((n, K))
        ids = id_offset + k * n + np.arange(n, dtype=np.int64) // max(1, tokens_per_sample)
        tasks.append(SyntheticTask(a=a.astype(np.float32), e=e.astype(np.float32), sample_ids=ids,
                                   coupling=c, act_angle=theta, err_angle=phi, scale=s))
    return tasks


def _mixture_tasks(rng: np.random.Generator, n_tasks: int, n: int, d: int, K: int, noise: float,
                   tokens_per_sample: int, scale_range: tuple[float, float], id_offset: int,
                   classes: int) -> list[SyntheticTask]:
    mu = rng.standard_normal((classes, d))
    nu = rng.standard_normal((classes, K))
    tasks = []
    for k in range(n_tasks):
        c = float(rng.uniform(0.0, 1.0))
        s = float(np.exp(rng.uniform(np.log(scale_range[0]), np.log(scale_range[1]))))
        freq = rng.dirichlet(np.full(classes, 0.7))
        y = rng.choice(classes, size=n, p=freq)
        keep = rng.uniform(size=n) < c
        y_err = np.where(keep, y, rng.integers(0, classes, size=n))
        a = s * (mu[y] + noise * rng.standard_normal((n, d)))
        e = nu[y_err] + noise * rng.standard_normal((n, K))
        ids = id_offset + k * n + np.arange(n, dtype=np.int64) // max(1, tokens_per_sample)
        tasks.append(SyntheticTask(a=a.astype(np.float32), e=e.astype(np.float32), sample_ids=ids,
                                   coupling=c, act_angle=0.0, err_angle=0.0, scale=s))
    return tasks
