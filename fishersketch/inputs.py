"""Checks of the sketcher's inputs before any work: tensors, shapes, dtypes, sample ids and flags, and
finiteness.

NaN/Inf are detected without scanning the (n, K) errors: any NaN/Inf in ``a`` or ``e`` makes a float64 sum
of the call's features non-finite (:func:`all_finite`); only then are the inputs scanned once to name the
culprit (:func:`nonfinite_message`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fishersketch.errors import SketchError
from fishersketch.spec import SketchSpec

__all__ = ["all_finite", "as_tensor", "check_flags", "check_starts", "check_tokens", "nonfinite_message"]


def nonfinite_message(a: torch.Tensor, e: torch.Tensor) -> str:
    """Why features came out non-finite: NaN/Inf in an input, or float overflow."""
    if not bool(torch.isfinite(a).all()):
        return "a contains NaN or Inf"
    if not bool(torch.isfinite(e).all()):
        return "e contains NaN or Inf"
    return "features overflow (inputs too large for the compute dtype)"


def all_finite(x: torch.Tensor) -> bool:
    """True if every entry is finite (one float64 reduction; exact for float32 and smaller dtypes)."""
    if x.numel() == 0:
        return True
    if bool(torch.isfinite(x.sum(dtype=torch.float64))):
        return True
    return bool(torch.isfinite(x).all()) if x.dtype == torch.float64 else False


def as_tensor(x: Any, name: str) -> torch.Tensor:
    """``x`` as a tensor (numpy arrays share memory; a tensor that requires grad detached: a sketch needs no
    gradient, and head inputs captured by a hook during training raised torch's own errors); a
    :class:`SketchError` for what is not array-like."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    try:
        return torch.as_tensor(np.asarray(x))
    except (TypeError, ValueError) as exc:
        raise SketchError(f"{name} must be a tensor or array, got {type(x).__name__}") from exc



def check_tokens(spec: SketchSpec, a: Any, e: Any,
                 sample_ids: Any | None) -> tuple[torch.Tensor, torch.Tensor, np.ndarray | None]:
    """Activations ``a`` (n, d) and errors ``e`` (n, K) as floating tensors, ``sample_ids`` (n,) as int64.

    Raises
    ------
    SketchError
        Not array-like, wrong shapes, non-floating ``a``/``e``, non-integer ids.
    """
    a = as_tensor(a, "a")
    e = as_tensor(e, "e")
    d, K = spec.d, spec.K
    if a.ndim != 2 or a.shape[1] != d:
        raise SketchError(f"a must have shape (n, {d}), got {tuple(a.shape)}")
    if e.ndim != 2 or e.shape[1] != K:
        raise SketchError(f"e must have shape (n, {K}), got {tuple(e.shape)}")
    if a.shape[0] != e.shape[0]:
        raise SketchError(f"a and e must have the same number of rows, got {a.shape[0]} and {e.shape[0]}")
    if not a.is_floating_point() or not e.is_floating_point():
        raise SketchError(f"a and e must be floating point, got {a.dtype} and {e.dtype}")
    ids = None
    if sample_ids is not None:
        if isinstance(sample_ids, torch.Tensor):
            if sample_ids.is_floating_point() or sample_ids.is_complex() or sample_ids.dtype == torch.bool:
                raise SketchError(f"sample_ids must be integers, got {sample_ids.dtype}")
            ids = sample_ids.detach().cpu().numpy()
        else:
            ids = np.asarray(sample_ids)
            if ids.size == 0:
                ids = ids.astype(np.int64)
        if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
            raise SketchError(f"sample_ids must be integers, got {ids.dtype}")
        if ids.shape != (a.shape[0],):
            raise SketchError(f"sample_ids must have shape ({a.shape[0]},), got {ids.shape}")
        ids = ids.astype(np.int64, copy=False)
    return a, e, ids


def check_flags(flags: Any, ids: np.ndarray, name: str) -> np.ndarray:
    """``flags`` as a bool array of the shape of ``ids``."""
    if isinstance(flags, torch.Tensor):
        flags = flags.detach().cpu().numpy()
    flags = np.asarray(flags)
    if flags.dtype != np.bool_:
        raise SketchError(f"{name} must be booleans, got {flags.dtype}")
    if flags.shape != ids.shape:
        raise SketchError(f"{name} must have shape {ids.shape}, got {flags.shape}")
    checked: np.ndarray = flags
    return checked


def check_starts(sample_starts: Any, ids: np.ndarray) -> np.ndarray:
    """Validate ``sample_starts``: booleans, one per token, True wherever the sample id changes.

    Parameters
    ----------
    sample_starts : array_like of bool, (n,)
    ids : np.ndarray of int, (n,)
        The tokens' sample ids.

    Returns
    -------
    np.ndarray of bool, (n,)
    """
    starts = check_flags(sample_starts, ids, "sample_starts")
    if ids.size > 1 and bool(np.any((ids[1:] != ids[:-1]) & ~starts[1:])):
        raise SketchError("sample_starts must be True wherever the sample id changes "
                          "(the tokens of a sample are contiguous)")
    return starts
