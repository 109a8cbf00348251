"""Evaluation of the model: fixed windows of a token stream and the mean next-token loss on them."""

from __future__ import annotations

import numpy as np
import torch
from transformers import GPT2LMHeadModel

from .constants import SEQ_LEN
from .model import autocast


def eval_windows(stream: np.ndarray, max_windows: int) -> torch.Tensor:
    """Cut a token stream into non-overlapping windows of ``SEQ_LEN`` tokens.

    Parameters
    ----------
    stream : numpy.ndarray
        1-D token stream.
    max_windows : int
        Maximum number of windows.

    Returns
    -------
    torch.Tensor
        ``(n, SEQ_LEN)`` tensor of token ids.
    """
    n = min(max_windows, len(stream) // SEQ_LEN)
    return torch.from_numpy(stream[: n * SEQ_LEN].reshape(n, SEQ_LEN).copy())


@torch.no_grad()
def mean_loss(model: GPT2LMHeadModel, windows: torch.Tensor, batch_size: int = 16, bf16: bool = False) -> float:
    """Return the mean next-token cross-entropy (nats) of a model on evaluation windows.

    Parameters
    ----------
    model : GPT2LMHeadModel
        Model to evaluate (put in eval mode here, back in train mode by the caller if needed).
    windows : torch.Tensor
        ``(n, SEQ_LEN)`` token ids.
    batch_size : int
        Windows per forward pass.
    bf16 : bool
        Evaluate under bf16 autocast (CUDA only).

    Returns
    -------
    float
        Token-weighted mean loss.
    """
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size].to(device)
        with autocast(device, bf16):
            loss = model(input_ids=batch, labels=batch).loss
        n_tokens = batch.shape[0] * (batch.shape[1] - 1)
        total += float(loss) * n_tokens
        count += n_tokens
    return total / max(count, 1)
