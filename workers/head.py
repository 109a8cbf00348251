"""Output-head math: logits from the captured head input, and the error e = dL/dz.

The model's output embedding module (``model.get_output_embeddings()``, an ``nn.Linear``-like module
with ``weight`` of shape (K, H) and optional ``bias`` (K,)) maps the head input ``h`` (H,) to the raw
logits ``z_raw = W h + b`` (K,). Some architectures transform the logits after the head:

* Gemma-2/3 style soft-capping, ``config.final_logit_softcapping = c``: ``z = c·tanh(z_raw / c)``;
* Cohere style ``config.logit_scale = s``: ``z = s·z_raw``;
* Granite style ``config.logits_scaling = s``: ``z = z_raw / s``;
* Falcon-H1 style ``config.lm_head_multiplier = s``: ``z = s·z_raw``.

The token loss is ``L = −log softmax(z)[y]``, and the error this module returns is the gradient with
respect to the *head output* ``z_raw`` (chain rule), in float32::

    e = (softmax(z) − onehot(y)) · dz/dz_raw

Any other post-head transform is caught at load time by :func:`workers.model_loading.verify_head`
(the model's own logits are compared with ``transform(W a + b)``) and refused with a clear error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

TransformKind = Literal["identity", "softcap", "scale"]

# Config attributes of known post-head logit transforms: name -> (kind, how the value maps to a factor).
_SCALE_ATTRS: dict[str, bool] = {
    # attribute name -> True when logits are multiplied by it, False when divided by it
    "logit_scale": True,  # Cohere, Cohere2
    "lm_head_multiplier": True,  # Falcon-H1
    "logits_scaling": False,  # Granite, GraniteMoe
}


@dataclass(frozen=True)
class LogitTransform:
    """A post-head logit transform ``z = f(z_raw)`` handled by the chain rule.

    Attributes
    ----------
    kind : {"identity", "softcap", "scale"}
        ``identity``: ``z = z_raw``; ``softcap``: ``z = value·tanh(z_raw/value)``;
        ``scale``: ``z = value·z_raw``.
    value : float
        The cap ``c`` (softcap) or the multiplicative factor ``s`` (scale); 1.0 for identity.
    source : str
        The config attribute it came from (for reports), empty for identity.
    """

    kind: TransformKind = "identity"
    value: float = 1.0
    source: str = ""

    def apply(self, z_raw: torch.Tensor) -> torch.Tensor:
        """Return ``z = f(z_raw)``, same shape and dtype as ``z_raw`` (a new tensor unless identity)."""
        if self.kind == "softcap":
            return torch.tanh(z_raw / self.value) * self.value
        if self.kind == "scale":
            return z_raw * self.value
        return z_raw

    def describe(self) -> str:
        """Short human-readable form, e.g. ``"softcap(30.0) from final_logit_softcapping"``."""
        if self.kind == "identity":
            return "identity"
        return f"{self.kind}({self.value:g}) from {self.source}"


IDENTITY = LogitTransform()


def detect_logit_transform(config: Any) -> LogitTransform:
    """Find a known post-head logit transform in a transformers config.

    Parameters
    ----------
    config
        A ``transformers.PretrainedConfig`` (or any object with the attributes).

    Returns
    -------
    LogitTransform
        The transform; ``IDENTITY`` when the config declares none.

    Raises
    ------
    ValueError
        When several transforms are declared at once or a value is not a finite positive number
        (callers turn this into a user-facing error).
    """
    found: list[LogitTransform] = []
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is not None:
        found.append(LogitTransform("softcap", _positive(cap, "final_logit_softcapping"), "final_logit_softcapping"))
    for name, multiply in _SCALE_ATTRS.items():
        raw = getattr(config, name, None)
        if raw is None:
            continue
        value = _positive(raw, name)
        if value == 1.0:
            continue
        found.append(LogitTransform("scale", value if multiply else 1.0 / value, name))
    if len(found) > 1:
        raise ValueError("several post-head logit transforms declared: " + ", ".join(t.source for t in found))
    return found[0] if found else IDENTITY


def _positive(raw: Any, name: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"config.{name} = {raw!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"config.{name} = {raw!r} must be a finite positive number")
    return value


def head_logits(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Raw head logits ``z_raw = a Wᵀ + b`` in float32.

    Parameters
    ----------
    a : Tensor, shape (n, H)
        Head inputs in the model dtype (without the bias column).
    weight : Tensor, shape (K, H)
    bias : Tensor, shape (K,), or None

    Returns
    -------
    Tensor, shape (n, K), float32
        Computed in the model dtype (exactly the op the head runs) and then upcast.
    """
    return torch.nn.functional.linear(a, weight, bias).float()


def head_errors(
    z_raw: torch.Tensor, targets: torch.Tensor, transform: LogitTransform = IDENTITY
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token errors and losses from raw head logits, in float32.

    Parameters
    ----------
    z_raw : Tensor, shape (n, K), float32
        Raw head outputs for ``n`` positions (consumed: may be overwritten in place).
    targets : Tensor, shape (n,), int64
        Next-token ids ``y``.
    transform : LogitTransform
        Post-head transform of the model.

    Returns
    -------
    e : Tensor, shape (n, K), float32
        ``dL_t/dz_raw,t`` = ``(softmax(z) − onehot(y)) · f'(z_raw)`` for each position.
    loss : Tensor, shape (n,), float32
        Token cross-entropy ``−log softmax(z)[y]`` (nats).
    """
    z_raw = z_raw.float()
    z = transform.apply(z_raw)
    logp = torch.log_softmax(z, dim=-1)
    rows = torch.arange(targets.shape[0], device=z.device)
    loss = -logp[rows, targets]
    e = logp.exp_()
    e[rows, targets] -= 1.0
    if transform.kind == "softcap":
        # z = c tanh(z_raw/c)  =>  dz/dz_raw = 1 − tanh² = 1 − (z/c)²
        e.mul_(1.0 - (z / transform.value).square_())
    elif transform.kind == "scale":
        e.mul_(transform.value)
    return e, loss
