"""The pieces of the training loop: batch sampler, optimiser, learning-rate schedule, one step, step timing."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
import torch
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

from .constants import DOMAINS, SEQ_LEN
from .model import autocast, build_model


class BatchSampler:
    """Sampler of training batches from the per-domain token streams, with a saveable state.

    Each sequence picks a domain with probability ``weights[domain]`` and then a uniformly random
    window of ``SEQ_LEN`` tokens of that domain's stream.

    Parameters
    ----------
    streams : dict[str, numpy.ndarray]
        Domain to token stream.
    weights : dict[str, float]
        Domain mixture weights (normalised here).
    batch_size : int
        Sequences per batch.
    seed : int
        Seed of the sampler's random generator.
    """

    def __init__(self, streams: dict[str, np.ndarray], weights: dict[str, float], batch_size: int, seed: int) -> None:
        self.streams = streams
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)
        self.names = list(DOMAINS)
        probs = np.array([weights[name] for name in self.names], dtype=np.float64)
        self.probs = probs / probs.sum()

    def __call__(self) -> torch.Tensor:
        """Return a ``(batch_size, SEQ_LEN)`` int64 tensor of token ids."""
        rows = []
        for idx in self.rng.choice(len(self.names), size=self.batch_size, p=self.probs):
            stream = self.streams[self.names[idx]]
            start = int(self.rng.integers(0, len(stream) - SEQ_LEN))
            rows.append(stream[start : start + SEQ_LEN].astype(np.int64))
        return torch.from_numpy(np.stack(rows))

    def state(self) -> dict[str, object]:
        """Return the random generator's state (JSON-serialisable)."""
        return dict(self.rng.bit_generator.state)

    def set_state(self, state: dict[str, object]) -> None:
        """Restore a state returned by :meth:`state`."""
        self.rng.bit_generator.state = state


def make_batch_sampler(
    streams: dict[str, np.ndarray], weights: dict[str, float], batch_size: int, seed: int
) -> BatchSampler:
    """Build a :class:`BatchSampler` (kept for callers of the earlier function API).

    Parameters
    ----------
    streams : dict[str, numpy.ndarray]
        Domain to token stream.
    weights : dict[str, float]
        Domain mixture weights.
    batch_size : int
        Sequences per batch.
    seed : int
        Seed of the sampler's random generator.

    Returns
    -------
    BatchSampler
        Callable returning one batch per call.
    """
    return BatchSampler(streams, weights, batch_size, seed)


def make_optimizer(model: GPT2LMHeadModel, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases and layer norms).

    Parameters
    ----------
    model : GPT2LMHeadModel
        Model to optimise.
    lr : float
        Peak learning rate.
    weight_decay : float
        Decoupled weight decay of the matrices.

    Returns
    -------
    torch.optim.AdamW
        The optimiser.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10 % of the peak learning rate.

    Parameters
    ----------
    step : int
        Current step (0-based).
    total : int
        Total number of steps.
    peak : float
        Peak learning rate.
    warmup : int
        Warm-up steps.

    Returns
    -------
    float
        Learning rate for this step.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


def train_step(
    model: GPT2LMHeadModel, optimizer: torch.optim.AdamW, batch: torch.Tensor, lr: float, bf16: bool = False
) -> float:
    """Run one optimiser step and return the batch loss.

    Parameters
    ----------
    model : GPT2LMHeadModel
        Model in training mode.
    optimizer : torch.optim.AdamW
        Its optimiser.
    batch : torch.Tensor
        ``(batch_size, SEQ_LEN)`` token ids.
    lr : float
        Learning rate for this step.
    bf16 : bool
        Forward under bf16 autocast (CUDA only).

    Returns
    -------
    float
        Mean next-token loss of the batch.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    device = next(model.parameters()).device
    batch = batch.to(device, non_blocking=True)
    with autocast(device, bf16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().item()


def probe_seconds_per_step(
    tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace, sample: Callable[[], torch.Tensor]
) -> float:
    """Time a few training steps on a throw-away model to size the run to ``--minutes``.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerFast
        Trained tokenizer.
    args : argparse.Namespace
        Parsed command-line arguments.
    sample : Callable[[], torch.Tensor]
        Batch sampler (a separate one from the training sampler).

    Returns
    -------
    float
        Mean seconds per step after two warm-up steps.
    """
    model = build_model(tokenizer, args).to(args.device)
    model.train()
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    for _ in range(2):
        train_step(model, optimizer, sample(), args.lr, args.bf16)
    start = time.perf_counter()
    n_probe = 5
    for _ in range(n_probe):
        train_step(model, optimizer, sample(), args.lr, args.bf16)
    return (time.perf_counter() - start) / n_probe
