"""Head-only transfer oracle and source-selection metrics.

Oracle (the regime the head-Fisher theory is exact for)
------------------------------------------------------
The model body is frozen. For every task we run the body once and cache the output-head inputs ``a``
(with the trailing 1 when the head has a bias) and the next-token targets ``y`` of its counted positions
(:func:`cache_head_inputs`, via the product's :meth:`workers.extraction.Extractor.iter_head_batches`).
Fine-tuning a source ``s`` then only touches a float32 copy of the output head ``W`` (K × d, bias folded
in as the last column; a tied input embedding is *not* changed, the body's activations are cached):
``steps`` Adam steps with learning rate ``lr`` on minibatches of ``batch_tokens`` positions drawn with a
fixed seed from the source's *training* split, full-vocabulary cross-entropy (through the model's
post-head logit transform, if any). Losses are mean token cross-entropies (nats = log perplexity) on
each target's *evaluation* split.

Normalised transfer (paper, Section "Experiments")::

    U[s, t] = (L_t(base) − L_t(after s)) / max(L_t(base) − L_t(after t), 0.01)

i.e. the fraction of the target's self-training gain recovered by training on ``s``; negative when
transfer hurts.

Source selection
----------------
For each target ``t`` a method scores every candidate ``s ≠ t`` and picks its arg-max. With
``U*`` the oracle's best candidate value:

* top-1 — fraction of targets whose pick is the oracle's best source;
* top-3 — fraction of targets whose oracle-best source is among the method's three best;
* % oracle — mean over targets of ``U[pick, t] / U*`` (targets with ``U* ≤ 0`` are left out and counted);
* max regret — max over targets of ``U* − U[pick, t]``;
* Spearman — mean over targets of the rank correlation of scores and ``U`` over the candidates.

Ties in a method's scores are broken uniformly at random *in expectation* (every metric is averaged over
the tied set), so a constant score is exactly the random baseline and "random" is reported that way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy.stats import spearmanr

if TYPE_CHECKING:
    import argparse

    from atlas.samples import Sample
    from workers.extraction import Extractor
    from workers.model_loading import LoadedModel

U_FLOOR = 0.01
"""Floor of the self-transfer denominator of U (paper)."""


@dataclass
class HeadCache:
    """Cached head inputs and targets of one split of one task.

    Attributes
    ----------
    a : Tensor, shape (n, d), float32
        Head inputs (with the trailing 1 when the head has a bias).
    y : Tensor, shape (n,), int64
        Next-token targets.
    ids : Tensor, shape (n,), int64, or None
        Sample id of each position (``atlas.samples.sample_id``).
    """

    a: torch.Tensor
    y: torch.Tensor
    ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])


def cache_head_inputs(extractor: Extractor, samples: Sequence[Sample], mode: str) -> HeadCache:
    """Run the frozen body once over ``samples`` and cache ``(a, y)`` of every counted position.

    Parameters
    ----------
    extractor : workers.extraction.Extractor
        Its truncation policy applies (same as the sketches).
    samples : sequence of atlas.samples.Sample
    mode : {"text", "completion"}

    Returns
    -------
    HeadCache
        On the CPU.
    """
    a_parts: list[torch.Tensor] = []
    y_parts: list[torch.Tensor] = []
    id_parts: list[torch.Tensor] = []
    for hb in extractor.iter_head_batches(list(samples), mode=mode):  # type: ignore[arg-type]
        a_parts.append(hb.a.detach().float().cpu())
        y_parts.append(hb.targets.detach().cpu())
        id_parts.append(hb.sample_ids.detach().cpu())
    if not a_parts:
        raise ValueError("no counted positions in these samples")
    return HeadCache(a=torch.cat(a_parts), y=torch.cat(y_parts), ids=torch.cat(id_parts))


@dataclass
class HeadOracle:
    """Fine-tunes a copy of the output head on cached activations and measures losses.

    Parameters
    ----------
    W0 : Tensor, shape (K, d), float32
        The model's head (bias folded in as the last column when present).
    transform : callable
        Post-head logit transform ``z = f(z_raw)`` (identity for most models).
    steps : int
        Optimiser steps per fine-tune.
    lr : float
        Adam learning rate.
    batch_tokens : int
        Positions per minibatch (the whole split when it is smaller).
    device : torch.device
    eval_chunk : int
        Positions per chunk when computing losses.
    """

    W0: torch.Tensor
    transform: Callable[[torch.Tensor], torch.Tensor]
    steps: int = 50
    lr: float = 1e-3
    batch_tokens: int = 512
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    eval_chunk: int = 4096

    @classmethod
    def from_model(cls, lm: LoadedModel, **kwargs: Any) -> HeadOracle:
        """Oracle for ``lm``'s output head (see the class parameters for ``kwargs``)."""
        head = lm.head
        W = head.weight.detach().float()
        bias = getattr(head, "bias", None)
        if bias is not None:
            W = torch.cat([W, bias.detach().float()[:, None]], dim=1)
        return cls(W0=W.clone().to(lm.device), transform=lm.logit_transform.apply, device=lm.device, **kwargs)

    def loss(self, W: torch.Tensor, cache: HeadCache) -> float:
        """Mean token cross-entropy (nats) of head ``W`` on ``cache``."""
        total = 0.0
        with torch.no_grad():
            for s in range(0, len(cache), self.eval_chunk):
                a = cache.a[s:s + self.eval_chunk].to(self.device)
                y = cache.y[s:s + self.eval_chunk].to(self.device)
                z = self.transform(a @ W.T)
                total += float(torch.nn.functional.cross_entropy(z, y, reduction="sum"))
        return total / max(len(cache), 1)

    def finetune(self, cache: HeadCache, seed: int) -> torch.Tensor:
        """Head after ``steps`` Adam steps on ``cache`` (minibatches drawn with ``seed``)."""
        W = self.W0.clone().requires_grad_(True)
        opt = torch.optim.Adam([W], lr=self.lr)
        gen = torch.Generator().manual_seed(int(seed))
        n = len(cache)
        for _ in range(self.steps):
            full = n <= self.batch_tokens
            idx = torch.arange(n) if full else torch.randperm(n, generator=gen)[: self.batch_tokens]
            a = cache.a[idx].to(self.device)
            y = cache.y[idx].to(self.device)
            loss = torch.nn.functional.cross_entropy(self.transform(a @ W.T), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return W.detach()


def add_oracle_args(parser: argparse.ArgumentParser, *, steps: int, batch: int) -> None:
    """The oracle's options (``--oracle-steps``, ``--oracle-lr``, ``--oracle-batch``) with these defaults."""
    parser.add_argument("--oracle-steps", type=int, default=steps, help="head-only Adam steps per source")
    parser.add_argument("--oracle-lr", type=float, default=1e-4, help="head-only Adam learning rate")
    parser.add_argument("--oracle-batch", type=int, default=batch, help="positions per head-only minibatch")


def add_split_args(parser: argparse.ArgumentParser, *, sketch: int, train: int, eval_: int, unit: str) -> None:
    """Per-domain split sizes ``--n-sketch``, ``--n-train``, ``--n-eval`` (experiments 3 and 6)."""
    parser.add_argument("--n-sketch", type=int, default=sketch, help=f"{unit} per domain for the signature")
    parser.add_argument("--n-train", type=int, default=train, help=f"oracle train {unit} per domain")
    parser.add_argument("--n-eval", type=int, default=eval_, help=f"oracle eval {unit} per domain")


def quick_split_args(args: argparse.Namespace) -> None:
    """``--quick`` sizes of experiments 3 and 6: one seed, m ≤ 512, 30/30/20 per domain, 10 oracle steps."""
    args.seeds = args.seeds[:1]
    args.m = min(args.m, 512)
    args.n_sketch, args.n_train, args.n_eval = 30, 30, 20
    args.oracle_steps = 10


def split_settings(args: argparse.Namespace, unit: str) -> dict[str, Any]:
    """Run-fact settings of experiments 3 and 6: ``m``, ``max_tokens`` and the per-domain split sizes."""
    return {"m": args.m, "max_tokens": args.max_tokens,
            "per domain sketch/train/eval": f"{args.n_sketch}/{args.n_train}/{args.n_eval} {unit}"}


def oracle_from_args(lm: LoadedModel, args: argparse.Namespace) -> HeadOracle:
    """:class:`HeadOracle` for ``lm`` with the settings of :func:`add_oracle_args`."""
    return HeadOracle.from_model(lm, steps=args.oracle_steps, lr=args.oracle_lr, batch_tokens=args.oracle_batch)


def oracle_setting(args: argparse.Namespace, unit: str = "") -> str:
    """The oracle's settings for the run facts (``unit`` follows the batch size, e.g. ``" tokens"``)."""
    return f"head-only Adam {args.oracle_steps} steps lr {args.oracle_lr} batch {args.oracle_batch}{unit}"


@dataclass
class TransferResult:
    """Losses and normalised transfer between tasks.

    Attributes
    ----------
    names : list of str
    base : ndarray, shape (T,)
        ``L_t(base)``.
    after : ndarray, shape (S, T)
        ``L_t(after s)``; sources are the same tasks as targets (``after[t, t]`` is self-training).
    U : ndarray, shape (S, T)
        Normalised transfer.
    """

    names: list[str]
    base: np.ndarray
    after: np.ndarray
    U: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {"names": self.names, "base": self.base, "after": self.after, "U": self.U}


def normalised_transfer(base: np.ndarray, after: np.ndarray) -> np.ndarray:
    """``U[s, t] = (base[t] − after[s, t]) / max(base[t] − after[t, t], 0.01)``.

    Parameters
    ----------
    base : ndarray, shape (T,)
    after : ndarray, shape (T, T)

    Returns
    -------
    ndarray, shape (T, T)
    """
    base = np.asarray(base, dtype=np.float64)
    after = np.asarray(after, dtype=np.float64)
    denom = np.maximum(base - np.diag(after), U_FLOOR)
    return (base[None, :] - after) / denom[None, :]


def transfer_matrix(oracle: HeadOracle, train: Mapping[str, HeadCache], evals: Mapping[str, HeadCache],
                    seed: int, log: Callable[[str], None] | None = None) -> TransferResult:
    """Fine-tune on every task's training split and evaluate on every task's evaluation split.

    Parameters
    ----------
    oracle : HeadOracle
    train, evals : mapping of task name to HeadCache
        Same keys (in the same order).
    seed : int
        Minibatch seed (the same for every source).
    log : callable, optional
        Progress lines.

    Returns
    -------
    TransferResult
    """
    names = list(train)
    if list(evals) != names:
        raise ValueError("train and eval caches must have the same tasks in the same order")
    base = np.array([oracle.loss(oracle.W0, evals[t]) for t in names])
    after = np.zeros((len(names), len(names)))
    for i, s in enumerate(names):
        W = oracle.finetune(train[s], seed)
        after[i] = [oracle.loss(W, evals[t]) for t in names]
        if log is not None:
            log(f"  oracle source {s}: self gain {base[i] - after[i, i]:.4f} nats")
    return TransferResult(names=names, base=base, after=after, U=normalised_transfer(base, after))


# ----------------------------------------------------------------------------------------------------
# Source selection


@dataclass
class SelectionMetrics:
    """Source-selection quality of one scoring method (see the module docstring).

    Attributes
    ----------
    top1, top3 : float
    pct_oracle : float
    max_regret : float
    mean_regret : float
    spearman : float
        Mean per-target Spearman of scores against U (NaN when scores are constant).
    n_targets : int
    n_pct_excluded : int
        Targets left out of % oracle because no candidate transfers positively.
    picks : list of str
        The pick per target (the first of the tied set when tied).
    """

    top1: float
    top3: float
    pct_oracle: float
    max_regret: float
    mean_regret: float
    spearman: float
    n_targets: int
    n_pct_excluded: int
    picks: list[str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return dict(self.__dict__)


def _topk_prob(scores: np.ndarray, best: int, k: int, tol: float) -> float:
    """Probability that candidate ``best`` is in the top ``k`` under random tie-breaking."""
    s = scores[best]
    greater = int(np.sum(scores > s + tol))
    tied = int(np.sum(np.abs(scores - s) <= tol))
    return float(np.clip((k - greater) / tied, 0.0, 1.0))


def selection_metrics(U: np.ndarray, scores: np.ndarray, names: Sequence[str],
                      candidates: Sequence[Sequence[int]] | None = None, tol: float = 1e-9) -> SelectionMetrics:
    """Score a source-selection method against the oracle.

    Parameters
    ----------
    U : ndarray, shape (T, T)
        ``U[s, t]`` normalised transfer from source ``s`` to target ``t``.
    scores : ndarray, shape (T, T)
        ``scores[s, t]`` the method's score of source ``s`` for target ``t`` (higher = better).
    names : sequence of str
    candidates : sequence of sequences of int, optional
        Candidate sources per target (default: every other task).
    tol : float
        Scores within ``tol`` of each other are tied.

    Returns
    -------
    SelectionMetrics
    """
    T = U.shape[1]
    top1: list[float] = []
    top3: list[float] = []
    ratios: list[float] = []
    regrets: list[float] = []
    rhos: list[float] = []
    picks: list[str] = []
    excluded = 0
    for t in range(T):
        cand = np.array(candidates[t] if candidates is not None else [s for s in range(U.shape[0]) if s != t])
        u = U[cand, t]
        sc = np.asarray(scores[cand, t], dtype=np.float64)
        if not np.all(np.isfinite(sc)):
            sc = np.where(np.isfinite(sc), sc, -np.inf)
        best = int(np.argmax(u))
        top1.append(_topk_prob(sc, best, 1, tol))
        top3.append(_topk_prob(sc, best, 3, tol))
        chosen = np.flatnonzero(sc >= sc.max() - tol)
        u_pick = float(u[chosen].mean())
        picks.append(names[int(cand[chosen[0]])])
        regrets.append(float(u[best] - u_pick))
        if u[best] > 0:
            ratios.append(u_pick / float(u[best]))
        else:
            excluded += 1
        if np.ptp(sc[np.isfinite(sc)]) > tol and len(cand) > 2:
            rho = spearmanr(sc, u).statistic
            rhos.append(float(rho))
    return SelectionMetrics(
        top1=float(np.mean(top1)), top3=float(np.mean(top3)),
        pct_oracle=float(np.mean(ratios)) if ratios else float("nan"),
        max_regret=float(np.max(regrets)), mean_regret=float(np.mean(regrets)),
        spearman=float(np.mean(rhos)) if rhos else float("nan"),
        n_targets=T, n_pct_excluded=excluded, picks=picks,
    )


def random_scores(T: int) -> np.ndarray:
    """Constant scores: the expectation of a uniformly random pick."""
    return np.zeros((T, T))


def ppl_similarity(mean_loss: Sequence[float]) -> np.ndarray:
    """PPL-similarity scores ``−|ℓ_s − ℓ_t|`` from each task's base log-perplexity (paper baseline)."""
    ell = np.asarray(mean_loss, dtype=np.float64)
    return -np.abs(ell[:, None] - ell[None, :])


@dataclass(frozen=True)
class SeedAgreement:
    """How well repeated measurements of one symmetric pair matrix agree (test–retest).

    Attributes
    ----------
    pairwise : float
        Mean Spearman correlation, over every two repeats, of their upper triangles.
    of_mean : float
        The same for the mean of all ``n`` repeats, by the Spearman–Brown formula
        ``n r / (1 + (n − 1) r)``.
    ceiling : float
        ``√of_mean``: the highest correlation any score can reach with the mean of the repeats when
        their disagreement is noise (the attenuation bound).
    n : int
        Repeats.
    """

    pairwise: float
    of_mean: float
    ceiling: float
    n: int


def seed_agreement(mats: Sequence[np.ndarray]) -> SeedAgreement:
    """Test–retest agreement of a pair matrix measured once per seed.

    Parameters
    ----------
    mats : sequence of ndarray, each shape (T, T)
        One measurement per seed; each is symmetrised, ``(M + Mᵀ) / 2``, and its T (T − 1) / 2 off-diagonal
        pairs compared.

    Returns
    -------
    SeedAgreement
        All NaN with fewer than two measurements.
    """
    n = len(mats)
    if n < 2:
        return SeedAgreement(float("nan"), float("nan"), float("nan"), n)
    iu = np.triu_indices(np.asarray(mats[0]).shape[0], 1)
    pairs = [((np.asarray(m) + np.asarray(m).T) / 2)[iu] for m in mats]
    r = float(np.mean([spearmanr(pairs[i], pairs[j]).statistic for i in range(n) for j in range(i + 1, n)]))
    of_mean = n * r / (1 + (n - 1) * r)
    return SeedAgreement(r, of_mean, float(np.sqrt(max(of_mean, 0.0))), n)
