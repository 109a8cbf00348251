"""Checks a loaded model must pass before its signatures can be trusted (run once per load).

* :func:`verify_head`: ``transform(W a + b)`` of the captured head input reproduces the model's logits, so
  the errors ``e`` are exactly the gradients of the model's own loss;
* :func:`verify_causal`: the head input at a position does not see later tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from atlas.errors import ModelUnavailable
from workers.head import capture_head_input, head_logits

if TYPE_CHECKING:
    from workers.model_loading import LoadedModel


def verify_head(lm: LoadedModel, n_tokens: int = 8) -> None:
    """Check that the captured head input reproduces the model's logits.

    Runs the model once on ``n_tokens`` token ids with full logits, captures the head input with the
    same forward pre-hook extraction uses, and compares ``transform(W a + b)`` with the model's logits.

    Raises
    ------
    ModelUnavailable
        The forward never calls the output embedding module, or the logits differ (an unsupported
        post-head transform: refusing is better than silently wrong errors).
    """
    K = lm.K
    ids = torch.arange(1, n_tokens + 1, device=lm.device).remainder(K).unsqueeze(0)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        out = lm.model(input_ids=ids, attention_mask=mask, use_cache=False)
        logits = getattr(out, "logits", None)
        try:
            hidden = capture_head_input(lm.model, ids, mask)
        except RuntimeError as ex:
            raise ModelUnavailable(f"model {lm.name!r} is not supported: {ex}", detail={"model": lm.name}) from ex
        head = lm.head
        weight = cast(torch.Tensor, head.weight)
        ours = lm.logit_transform.apply(head_logits(hidden[0], weight, getattr(head, "bias", None)))
    if logits is None or tuple(logits.shape[-2:]) != tuple(ours.shape):
        raise ModelUnavailable(
            f"model {lm.name!r}: its logits (shape {None if logits is None else tuple(logits.shape)}) do not "
            f"match the output head's shape {tuple(ours.shape)}; unsupported architecture",
            detail={"model": lm.name},
        )
    ref = logits[0].float()
    scale = float(ref.abs().max().clamp_min(1.0))
    tol = 1e-4 if lm.dtype == torch.float32 else 3e-2
    err = float((ours - ref).abs().max()) / scale
    if not err <= tol:
        raise ModelUnavailable(
            f"model {lm.name!r} transforms its logits after the output head in a way FisherAtlas does not "
            f"handle (handled: {lm.logit_transform.describe()}; relative mismatch {err:.2e}). Supported: plain "
            "heads, final_logit_softcapping, logit_scale, logits_scaling, lm_head_multiplier",
            detail={"model": lm.name, "mismatch": err},
        )


def verify_causal(lm: LoadedModel, n_tokens: int = 8) -> None:
    """Check that the head input at a position does not see later tokens (the model is causal).

    A masked (bidirectional) LM — a BERT-like ``*ForMaskedLM`` folder that ``AutoModelForCausalLM`` builds
    into an ``*LMHeadModel`` — would see the token it is to predict, so its signatures would be meaningless.
    The probe runs the body on ``n_tokens`` ids and again with the second half changed: the first half's
    head inputs must not move while the second half's do.

    Raises
    ------
    ModelUnavailable
        Earlier positions' head inputs change with later tokens.
    """
    half = n_tokens // 2
    ids = torch.arange(1, n_tokens + 1, device=lm.device).remainder(lm.K).unsqueeze(0)
    other = ids.clone()
    other[:, half:] = (other[:, half:] + lm.K // 2 + 1).remainder(lm.K)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a = capture_head_input(lm.model, ids, mask)[0].float()
        b = capture_head_input(lm.model, other, mask)[0].float()
    early = float((a[:half] - b[:half]).abs().max())
    late = float((a[half:] - b[half:]).abs().max())
    if early > 1e-3 * max(late, 1e-6):
        raise ModelUnavailable(
            f"model {lm.name!r} is not a causal LM: the head input at a position changes with later tokens "
            f"({early:.2e}, against {late:.2e} where the tokens changed). FisherAtlas needs a causal (decoder-only) "
            "language model; masked or encoder models (BERT, RoBERTa, T5 encoders) are not supported",
            detail={"model": lm.name, "early_change": early, "late_change": late},
        )
