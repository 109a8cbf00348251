"""Many independent states from one batch: the batched form of ``Sketcher.sketch`` for routing.

A routing micro-batch holds the tokens of many prompts, and every prompt needs a state of its own.
Sketching them one call per prompt pays the chunk padding and the projection set-up once per prompt;
:func:`sketch_groups` projects the whole batch chunk by chunk (one GEMM per chunk) and scatters the
feature sums into one (state, split) slot per token (``index_add_``, float64). Each state equals
``sketcher.sketch`` of its group's tokens alone, up to float32 rounding of the projections (the
feature sums are float64 either way).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fishersketch.errors import SketchError
from fishersketch.rng import split_of_array
from fishersketch.sketcher import Sketcher
from fishersketch.state import SketchState

__all__ = ["sketch_groups"]


def _slot_sums(x: torch.Tensor, slot: torch.Tensor, sums: torch.Tensor, sq: torch.Tensor) -> None:
    """Add Σψ and Σ‖ψ‖² of draws ``x`` (c, 3, m) float64 into rows ``slot`` (c,) of ``sums`` / ``sq``."""
    sums.index_add_(0, slot, x.reshape(x.shape[0], -1))
    sq.index_add_(0, slot, torch.linalg.vector_norm(x, dim=2).square_())

def sketch_groups(sketcher: Sketcher, a: Any, e: Any, group_ids: Any, n_groups: int, *,
                  sample_ids: Any | None = None) -> list[SketchState]:
    """One fresh state per group of tokens, each holding one sample.

    Parameters
    ----------
    sketcher : Sketcher
    a : tensor, (n, d)
        Head inputs of all tokens of the batch.
    e : tensor, (n, K)
        Errors of all tokens.
    group_ids : array of int, (n,)
        The group (output state) of each token, in ``[0, n_groups)``; a group's tokens need not be
        contiguous.
    n_groups : int
        Number of states to return (a group without tokens gives an empty state).
    sample_ids : array of int, (n_groups,), optional
        The sample id of each group, which decides its A/B split (default 0 for every group). With the
        id a group's tokens would carry in ``Sketcher.sketch``, state ``g`` equals sketching the group
        alone.

    Returns
    -------
    list of SketchState
        ``n_groups`` states; state ``g`` counts one sample if group ``g`` has tokens.

    Raises
    ------
    SketchError
        Bad shapes or group ids, NaN/Inf in ``a`` or ``e``.
    """
    a, e, _ = sketcher._check(a, e, None)
    groups = np.asarray(group_ids.cpu().numpy() if isinstance(group_ids, torch.Tensor) else group_ids)
    n = a.shape[0]
    if groups.shape != (n,) or not np.issubdtype(groups.dtype, np.integer):
        raise SketchError(f"group_ids must be {n} integers, got shape {groups.shape} and dtype {groups.dtype}")
    if n_groups < 0 or (n and (groups.min() < 0 or groups.max() >= n_groups)):
        raise SketchError(f"group ids must lie in [0, {n_groups})")
    spec, device, m = sketcher.spec, sketcher.device, sketcher.spec.m
    if sample_ids is None:
        gsid = np.zeros(n_groups, dtype=np.int64)
    else:  # ids decide the A/B split: 1.7 read as 1 moved a sample to another split without a word
        given = np.asarray(sample_ids)
        if given.size and not np.issubdtype(given.dtype, np.integer):
            raise SketchError(f"sample_ids must be integers, got dtype {given.dtype}")
        gsid = given.astype(np.int64)
    if gsid.shape != (n_groups,):
        raise SketchError(f"sample_ids must hold one id per group ({n_groups}), got shape {gsid.shape}")
    split_g = split_of_array(gsid, spec.seed).astype(np.int64)  # (G,)
    slots = 2 * n_groups
    sums = torch.zeros(slots, 3 * m, dtype=torch.float64, device=device)
    sq = torch.zeros(slots, 3, dtype=torch.float64, device=device)
    groups64 = groups.astype(np.int64)
    group_t = torch.from_numpy(groups64).to(device)
    if n and spec.granularity == "token":
        buf = torch.empty(sketcher.chunk_rows, 3, m, dtype=torch.float64, device=device)
        slot_t = group_t * 2 + torch.from_numpy(split_g).to(device)[group_t]
        for lo, hi, u, u2, v, v2 in sketcher._iter_projections(a, e):
            x = sketcher._token_features(u, u2, v, v2, buf[: hi - lo])
            _slot_sums(x, slot_t[lo:hi], sums, sq)
    elif n:
        feats = sketcher._sequence_features(sketcher._sequence_sums(a, e, group_t, n_groups))  # (G, 3, m)
        slot_g = torch.arange(n_groups, device=device) * 2 + torch.from_numpy(split_g).to(device)
        _slot_sums(feats, slot_g, sums, sq)
    sums_np = sums.view(n_groups, 2, 3, m).cpu().numpy()
    sq_np = sq.view(n_groups, 2, 3).cpu().numpy()
    if not (np.all(np.isfinite(sq_np)) and np.all(np.isfinite(sums_np))):
        raise SketchError("non-finite features (NaN/Inf in the activations or errors, or overflow)")
    tokens = np.bincount(groups64, minlength=n_groups) if n else np.zeros(n_groups, dtype=np.int64)
    states = []
    for g in range(n_groups):
        state = SketchState.empty(spec)
        token_counts = np.zeros(2, dtype=np.int64)
        sample_counts = np.zeros(2, dtype=np.int64)
        if tokens[g]:
            token_counts[split_g[g]] = tokens[g]
            sample_counts[split_g[g]] = 1
            # A sequence-granularity group is one draw: its empty split stays empty.
        state._accumulate(sums_np[g], sq_np[g], token_counts, sample_counts)
        states.append(state)
    return states
