"""Resumable checkpoints: model and optimiser states, batch-sampler and torch RNG states, step and schedule."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import GPT2LMHeadModel

from .training import BatchSampler


def save_checkpoint(path: Path, model: GPT2LMHeadModel, optimizer: torch.optim.AdamW, sampler: BatchSampler,
                    meta: dict[str, object]) -> None:
    """Write a resumable checkpoint: model and optimiser states, sampler and torch RNG, step and schedule.

    Parameters
    ----------
    path : Path
        Checkpoint directory (replaced atomically enough for a single writer: written to a temp file first).
    model, optimizer : GPT2LMHeadModel, torch.optim.AdamW
        Training state.
    sampler : BatchSampler
        Batch sampler whose RNG state is saved.
    meta : dict
        Step counters, schedule and best-so-far information (JSON-serialisable).
    """
    path.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "sampler": sampler.state(),
        "meta": meta,
    }
    tmp = path / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(path / "state.pt")
    (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def load_checkpoint(path: Path, model: GPT2LMHeadModel, optimizer: torch.optim.AdamW,
                    sampler: BatchSampler) -> dict[str, object]:
    """Restore a checkpoint written by :func:`save_checkpoint` and return its ``meta``."""
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    sampler.set_state(state["sampler"])
    return dict(state["meta"])
