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

Any other post-head transform is caught at load time by :func:`workers.model_checks.verify_head`
(the model's own logits are compared with ``transform(W a + b)``) and refused with a clear error.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import torch

if TYPE_CHECKING:
    from workers.batching import TokenBatch
    from workers.model_loading import LoadedModel

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


# ----------------------------------------------------------------------------------------------------
# Head input capture: run the transformer body, stop right before the output head

_capture = threading.local()
_hook_lock = threading.Lock()


class _HeadInputCaptured(Exception):
    """Raised by the pre-hook to stop the forward right before the output head."""


def _capture_pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    box = getattr(_capture, "box", None)
    if box is None or box.get("module") is not module:
        return  # not capturing in this thread: the model runs normally
    box["hidden"] = args[0] if args else next(iter(kwargs.values()))
    raise _HeadInputCaptured


def _ensure_hook(head: torch.nn.Module) -> None:
    with _hook_lock:
        if not getattr(head, "_fisher_atlas_hooked", False):
            head.register_forward_pre_hook(_capture_pre_hook, with_kwargs=True)
            setattr(head, "_fisher_atlas_hooked", True)  # noqa: B010  (a flag on a foreign module)


def capture_head_input(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Run the transformer body and return the input of the output embedding module.

    A forward pre-hook on ``model.get_output_embeddings()`` records the head input and aborts the
    forward, so no logits are computed. The hook is active only inside this call and only in the
    calling thread (other threads may use the same model normally or capture concurrently).

    Parameters
    ----------
    model : transformers.PreTrainedModel
    input_ids : Tensor, shape (B, T), int64
    attention_mask : Tensor, shape (B, T)
    position_ids : Tensor, shape (B, T), or None

    Returns
    -------
    Tensor, shape (B, T, H)
        Head input in the model dtype.

    Raises
    ------
    RuntimeError
        The forward finished without calling the output embedding module, or returned a head input of
        an unexpected shape.
    """
    head = model.get_output_embeddings()
    _ensure_hook(head)
    box: dict[str, Any] = {"module": head}
    kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    _capture.box = box
    try:
        with torch.no_grad():
            model(**kwargs)
    except _HeadInputCaptured:
        pass
    finally:
        _capture.box = None
    hidden = box.get("hidden")
    if hidden is None:
        raise RuntimeError("the model forward never called its output embedding module")
    if tuple(hidden.shape[:2]) != tuple(input_ids.shape):
        raise RuntimeError(f"head input has shape {tuple(hidden.shape)}, expected {tuple(input_ids.shape)} + (H,)")
    return hidden


# ----------------------------------------------------------------------------------------------------
# One forward, (a, e) in chunks of positions


@dataclass
class HeadBatch:
    """Per-token head activations and errors for one chunk of counted positions.

    Attributes
    ----------
    a : Tensor, shape (n, d), float32
        Head inputs, with a trailing 1 when the head has a bias (d = H + 1).
    e : Tensor, shape (n, K), float32
        ``dL/dz`` per token (softmax − onehot, with the chain rule of any post-head transform).
    sample_ids : Tensor, shape (n,), int64, on the CPU
        A sample's positions are contiguous and may continue in the next chunk of the same batch.
    token_loss : Tensor, shape (n,), float32
        Cross-entropy of each token (nats).
    last_token_mask : Tensor, shape (n,), bool, on the CPU
        True at each sample's last counted position.
    targets : Tensor, shape (n,), int64
        Next-token ids.

    ``a``, ``e``, ``token_loss`` and ``targets`` live on the model's device.
    has_bias : bool
    """

    a: torch.Tensor
    e: torch.Tensor
    sample_ids: torch.Tensor
    token_loss: torch.Tensor
    last_token_mask: torch.Tensor
    targets: torch.Tensor
    has_bias: bool = False

    @property
    def hidden(self) -> torch.Tensor:
        """Head inputs without the bias column, shape (n, H), float32."""
        return self.a[:, :-1] if self.has_bias else self.a

    def __len__(self) -> int:
        return int(self.a.shape[0])


def chunk_bounds(n: int, logits_chunk: int) -> list[tuple[int, int]]:
    """Split ``n`` positions into consecutive chunks of at most ``logits_chunk`` (samples may be cut).

    Parameters
    ----------
    n : int
    logits_chunk : int

    Returns
    -------
    list of (start, stop)
    """
    return [(s, min(s + logits_chunk, n)) for s in range(0, n, logits_chunk)]


def iter_head_batches(lm: LoadedModel, batch: TokenBatch, logits_chunk: int = 256,
                      timings: dict[str, float] | None = None) -> Iterator[HeadBatch]:
    """Forward one token batch and yield its counted positions' (a, e) in chunks.

    Parameters
    ----------
    lm : LoadedModel
    batch : TokenBatch
        On any device (moved to ``lm.device``).
    logits_chunk : int
        Positions per chunk; at most ``logits_chunk × K`` logits exist at a time.
    timings : dict, optional
        Accumulates seconds under ``"forward_s"`` and ``"head_s"``.

    Yields
    ------
    HeadBatch
        Chunks in sample order, each with at most ``logits_chunk`` positions; a sample may be cut over
        consecutive chunks (sketch them with ``sketcher.stream(state)``, which handles that).
    """
    meta = batch  # host copy: sample ids and masks stay on the CPU (the sketcher hashes ids there)
    batch = batch.to(lm.device)
    t0 = time.perf_counter()
    hidden = capture_head_input(lm.model, batch.input_ids, batch.attention_mask, batch.position_ids)
    a_all = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.flat_positions)  # (n, H)
    del hidden
    if timings is not None:
        timings["forward_s"] = timings.get("forward_s", 0.0) + time.perf_counter() - t0
    head = lm.head
    weight = cast(torch.Tensor, head.weight)
    bias = getattr(head, "bias", None)
    n = a_all.shape[0]
    for s, stop in chunk_bounds(n, logits_chunk):
        t1 = time.perf_counter()
        a_c = a_all[s:stop]
        targets = batch.targets[s:stop]
        with torch.no_grad():
            e, loss = head_errors(head_logits(a_c, weight, bias), targets, lm.logit_transform)
            a32 = a_c.float()
            if bias is not None:
                a32 = torch.cat([a32, a32.new_ones(a32.shape[0], 1)], dim=1)
        hb = HeadBatch(a=a32, e=e, sample_ids=meta.sample_ids[s:stop], token_loss=loss,
                       last_token_mask=meta.last_token_mask[s:stop], targets=targets,
                       has_bias=bias is not None)
        if timings is not None:
            timings["head_s"] = timings.get("head_s", 0.0) + time.perf_counter() - t1
        yield hb
        del hb, e, a32
