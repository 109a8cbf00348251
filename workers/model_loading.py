"""Load any Hugging Face causal LM (offline-capable) and describe its output head.

:func:`load_causal_lm` accepts

* ``"bundled"`` — the small model shipped in :data:`BUNDLED_MODEL_DIR`;
* a local directory holding ``save_pretrained`` output (``config.json``, weights, tokenizer files);
* a hub name (``"gpt2"``, ``"meta-llama/Llama-3.1-8B"``), resolved from the local Hugging Face cache
  when ``HF_HUB_OFFLINE=1`` (or when the hub cannot be reached).

Whatever goes wrong, the caller gets one :class:`atlas.errors.ModelUnavailable` naming what is missing
and how to supply it. The model is in eval mode with gradients off; it is checked once
(:mod:`workers.model_checks`: its output head reproduces its logits, and it is causal). States are tagged
with the model's :class:`workers.model_identity.ModelFingerprint` (its content, not its path); different
fingerprints never mix.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from torch import nn

from atlas.errors import InvalidInput, ModelUnavailable
from workers.head import IDENTITY, LogitTransform, detect_logit_transform
from workers.model_checks import verify_causal, verify_head
from workers.model_identity import (
    ModelFingerprint,
    config_sha256,
    content_key,
    head_sha256,
    library_config_sha256,
    previous_key,
    tokenizer_sha256,
    weights_sha256,
)

if TYPE_CHECKING:
    from atlas.settings import Settings
    from fishersketch import Sketcher, SketchSpec

log = logging.getLogger(__name__)

BUNDLED_MODEL_DIR: Path = Path(__file__).parent / "bundled_model"
"""Directory of the bundled default model (``save_pretrained`` output of model and tokenizer)."""

BUNDLED_NAME = "bundled"
"""Model name that resolves to :data:`BUNDLED_MODEL_DIR`."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}

@dataclass
class LoadedModel:
    """A causal LM ready for extraction.

    Attributes
    ----------
    model : transformers.PreTrainedModel
        In eval mode, ``requires_grad`` off.
    tokenizer : transformers.PreTrainedTokenizerBase
        With a pad token (the EOS token when the tokenizer had none).
    device : torch.device
    dtype : torch.dtype
        Weights' dtype; errors ``e`` are always float32.
    hidden_size : int
        H, the width of the head input.
    d : int
        Activation dimension: ``H + 1`` when the head has a bias (a is augmented with 1), else H.
    K : int
        Output rows of the head (vocabulary size including any padding rows).
    fingerprint : ModelFingerprint
    logit_transform : LogitTransform
        Post-head transform handled by the chain rule (identity for most models).
    max_positions : int or None
        The model's maximum sequence length when the config declares one.
    """

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    hidden_size: int
    d: int
    K: int
    fingerprint: ModelFingerprint
    logit_transform: LogitTransform = IDENTITY
    max_positions: int | None = None

    @property
    def head(self) -> nn.Module:
        """The output embedding module (``model.get_output_embeddings()``)."""
        return self.model.get_output_embeddings()

    @property
    def has_bias(self) -> bool:
        """Whether the head has a bias (then ``a`` carries a trailing 1)."""
        return getattr(self.head, "bias", None) is not None

    @property
    def name(self) -> str:
        """The model name as in the fingerprint."""
        return self.fingerprint.name

    def make_spec(self, m: int = 4096, seed: int = 0, error_projection: Literal["auto", "srht", "dense"] = "auto",
                  granularity: Literal["token", "sequence"] = "token") -> SketchSpec:
        """Sketch spec for this model's (d, K).

        Parameters
        ----------
        m : int
            Sketch dimension.
        seed : int
            Projection seed.
        error_projection : {"auto", "srht", "dense"}
        granularity : {"token", "sequence"}
        """
        from fishersketch import SketchSpec

        return SketchSpec(d=self.d, K=self.K, m=m, seed=seed, error_projection=error_projection,
                          granularity=granularity)

    def make_sketcher(self, spec: SketchSpec) -> Sketcher:
        """A sketcher of ``spec`` on this model's device, its activation GEMM in :func:`sketch_dtype`."""
        from fishersketch import Sketcher

        return Sketcher(spec, device=self.device, dtype=sketch_dtype(self.dtype, self.device))

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, name: str, revision: str | None = None,
                   resolved_revision: str | None = None, verify: bool = True,
                   config_file: Path | None = None) -> LoadedModel:
        """Wrap an already-built model (e.g. random weights for tests and benchmarks).

        Parameters
        ----------
        model : transformers.PreTrainedModel
            A causal LM on its target device (not moved); put in eval mode with gradients off.
        tokenizer : transformers.PreTrainedTokenizerBase
        name : str
            Name recorded in the fingerprint.
        revision : str or None
            The requested hub revision.
        resolved_revision : str or None
            The commit the hub cache resolved it to, when known (descriptive).
        verify : bool
            Run :func:`verify_head` and :func:`verify_causal`.
        config_file : Path, optional
            The ``config.json`` the model was loaded from: its fingerprint's config digest is taken over it
            (:func:`workers.model_identity.config_sha256`).

        Raises
        ------
        ModelUnavailable
            The model has no usable output head or an unsupported post-head logit transform.
        """
        model.eval()
        model.requires_grad_(False)
        _ensure_pad_token(tokenizer)
        head = model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        if head is None or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ModelUnavailable(
                f"model {name!r} has no linear output head (get_output_embeddings() returned "
                f"{type(head).__name__}); only causal LMs with an nn.Linear-like head are supported",
                detail={"model": name},
            )
        bias = getattr(head, "bias", None)
        K, H = int(weight.shape[0]), int(weight.shape[1])
        embeddings = model.get_input_embeddings()
        rows = int(getattr(embeddings, "num_embeddings", 0) or getattr(getattr(embeddings, "weight", None), "shape",
                                                                         (K,))[0])
        # a token the model has no row for: samples dropped ("token_out_of_range"), jobs failed, prompts refused
        # (the pad token is not counted: one added without resizing the model is never fed to it — padding uses an
        # id the model has; a BOS, EOS or other special token is fed, and is counted)
        pad = getattr(tokenizer, "pad_token_id", None)
        highest = max((i for i in tokenizer.get_vocab().values() if i != pad), default=-1)
        if highest >= min(rows, K):
            raise ModelUnavailable(
                f"model {name!r}: its tokenizer has text tokens up to id {highest} but the model has {min(rows, K)} "
                "rows of vocabulary (input embeddings or output head); the tokenizer is not this model's",
                detail={"model": name, "tokenizer_tokens": len(tokenizer), "model_vocabulary": min(rows, K)})
        try:
            transform = detect_logit_transform(model.config)
        except ValueError as ex:
            raise ModelUnavailable(f"model {name!r}: unsupported logit transform: {ex}",
                                   detail={"model": name}) from None
        head_digest, weights_digest, tokenizer_digest = (head_sha256(weight, bias), weights_sha256(model),
                                                         tokenizer_sha256(tokenizer))
        library_digest = library_config_sha256(model.config)  # the keys before 2026-12-07 took it
        fingerprint = ModelFingerprint(
            name=name, revision=resolved_revision or revision, config_sha256=config_sha256(model.config, config_file),
            head_sha256=head_digest, weights_sha256=weights_digest, tokenizer_sha256=tokenizer_digest,
            previous_keys=(content_key("fp2", library_digest, head_digest, weights_digest, tokenizer_digest),
                           previous_key(name, revision, library_digest, head_digest)),
        )
        max_positions = None
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            value = getattr(model.config, attr, None)
            if isinstance(value, int) and value > 0:
                max_positions = value
                break
        lm = cls(model=model, tokenizer=tokenizer, device=weight.device, dtype=weight.dtype, hidden_size=H,
                 d=H + (1 if bias is not None else 0), K=K, fingerprint=fingerprint,
                 logit_transform=transform, max_positions=max_positions)
        if verify:
            verify_head(lm)
            verify_causal(lm)
        return lm



@contextlib.contextmanager
def _quiet_unless_terminal() -> Iterator[None]:
    """transformers' "Loading weights" bar only on a terminal: a service's log, a notebook or a script's redirected
    stderr got a bar at every start."""
    from transformers.utils import logging as hf_logging

    if sys.stderr is not None and sys.stderr.isatty():
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()

def load_causal_lm(name: str, revision: str | None = None, device: str = "auto", dtype: str = "float32",
                   *, verify: bool = True, trust_remote_code: bool = False) -> LoadedModel:
    """Load a causal LM and its tokenizer by name, hub id or local directory.

    Parameters
    ----------
    name : str
        ``"bundled"``, a local directory, or a Hugging Face hub id.
    revision : str or None
        Hub revision (branch, tag or commit); ignored for local directories.
    device : {"auto", "cpu", "cuda", "cuda:N"}
        ``auto`` picks CUDA when available.
    dtype : {"float32", "bfloat16", "float16"} (or "fp32", "bf16", "fp16")
        Weight dtype. Errors are computed in float32 regardless.
    verify : bool
        Check once that ``transform(W a + b)`` reproduces the model's logits (see :func:`verify_head`).
    trust_remote_code : bool
        Passed to transformers; off by default.

    Returns
    -------
    LoadedModel

    Raises
    ------
    InvalidInput
        Unknown dtype or device string.
    ModelUnavailable
        The model or tokenizer cannot be found or loaded (message says what is missing and how to supply
        it), CUDA was requested but is not available, or the head is unsupported.
    """
    torch_dtype = _parse_dtype(dtype)
    torch_device = resolve_device(device)
    source, fp_name, is_local = _resolve_source(name)
    fp_revision = None if is_local else revision
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if not is_local:
        kwargs["revision"] = revision
        if _hub_offline() or not _hub_reachable():
            kwargs["local_files_only"] = True

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        AutoConfig.from_pretrained(source, **kwargs)
    except Exception as ex:
        raise _unavailable(name, revision, is_local, "model files (config.json)", ex) from ex
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception as ex:  # transformers raises OSError, ValueError, KeyError, ... depending on what is missing
        raise _unavailable(name, revision, is_local, "tokenizer", ex) from ex
    if not _tokenizer_usable(tokenizer):
        raise _unavailable(name, revision, is_local, "tokenizer",
                           ValueError("the tokenizer files are missing or the tokenizer is empty"))
    load_kwargs = dict(kwargs)
    if torch_device.type == "cuda" and importlib.util.find_spec("accelerate") is not None:
        load_kwargs["device_map"] = str(torch_device)  # load straight onto the GPU, no full CPU copy
    try:
        with _quiet_unless_terminal():
            loaded: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, output_loading_info=True,
                                                               **load_kwargs)
        model, loading = loaded  # with output_loading_info: (model, {"missing_keys": [...], ...})
    except Exception as ex:
        raise _unavailable(name, revision, is_local, "model weights", ex) from ex
    missing = sorted(loading.get("missing_keys") or [])
    if missing:  # transformers fills them with random values: a random head gave a new fingerprint at every start
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelUnavailable(
            f"cannot load the weights of model {name!r}: the checkpoint lacks {len(missing)} of the model's tensors "
            f"({shown}); a base model saved without its language-model head, or a damaged checkpoint, cannot be "
            "served", detail={"model": name, "revision": revision, "missing": "model weights",
                              "missing_tensors": missing[:50]})
    cast(Any, model).to(torch_device)
    resolved = None if is_local else _cached_commit(source, revision)
    if fp_revision is None and not is_local:  # as the key of before took it (set by transformers 4, not 5)
        fp_revision = getattr(model.config, "_commit_hash", None)
    return LoadedModel.from_model(model, tokenizer, name=fp_name, revision=fp_revision, resolved_revision=resolved,
                                  verify=verify, config_file=_config_file(source, kwargs))


def _config_file(source: str, kwargs: dict[str, Any]) -> Path | None:
    """The ``config.json`` a model was loaded from (a local directory's, or the hub cache's copy; ``None`` when it
    cannot be found: the fingerprint then reads the loaded config)."""
    local = Path(source) / "config.json"
    if local.is_file():
        return local
    try:
        from transformers.utils import cached_file

        found = cached_file(source, "config.json", revision=kwargs.get("revision"), local_files_only=True)
    except Exception:  # any failure means "not found": the loaded config is read instead
        return None
    return Path(found) if found else None


def sketch_dtype(model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The sketch's activation GEMM dtype: bf16 (tensor cores, float32 accumulation, output rounded to bf16)
    for a bf16 model on a GPU, else float32 — a float16 GEMM of ``d`` activations overflows (65504) once their
    RMS passes about 65504/√d."""
    return torch.bfloat16 if model_dtype == torch.bfloat16 and device.type == "cuda" else torch.float32


def resolve_device(device: str) -> torch.device:
    """Turn ``"auto" | "cpu" | "cuda" | "cuda:N"`` into a ``torch.device``.

    Raises
    ------
    InvalidInput
        Unparseable device string.
    ModelUnavailable
        CUDA requested but not available.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidInput(f"unknown device {device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelUnavailable(f"device {device!r} requested but CUDA is not available; use device='cpu' or 'auto'")
    if dev.type not in ("cpu", "cuda"):
        raise InvalidInput(f"unsupported device {device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return dev


def _parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif dtype in DTYPES:
        return DTYPES[dtype]
    raise InvalidInput(f"unsupported dtype {dtype!r}; use 'float32', 'bfloat16' or 'float16'")


def _hub_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "") or os.environ.get("TRANSFORMERS_OFFLINE", "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers at all (one HEAD request, any HTTP status counts). Without a
    network each ``from_pretrained`` call retries for half a minute before it falls back to the local
    cache; one probe makes that a few seconds, and the load then reads the cache only."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session  # the hub client's own session: its proxies and headers

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout_s)
    except Exception as ex:  # requests' or httpx's connection errors, by hub version
        log.warning("the Hugging Face hub (%s) is not reachable (%s): loading from the local cache only; set "
                    "HF_HUB_OFFLINE=1 to skip this check", constants.ENDPOINT, type(ex).__name__)
        return False
    return True


def _cached_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit the local hub cache resolves ``revision`` of ``repo_id`` to (None when not cached)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # a malformed repo id or cache: the commit is descriptive only
        return None
    parts = Path(path).parts if isinstance(path, str) else ()
    return parts[-2] if len(parts) >= 3 and parts[-3] == "snapshots" else None


def _looks_like_path(name: str) -> bool:
    return (name.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name in (".", "..")
            or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"))


def _resolve_source(name: str) -> tuple[str, str, bool]:
    """Return (what to pass to from_pretrained, fingerprint name, is_local)."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("model name must be a non-empty string ('bundled', a hub id or a local directory)")
    if name == BUNDLED_NAME:
        if not (BUNDLED_MODEL_DIR / "config.json").is_file():
            raise ModelUnavailable(
                f"the bundled model is missing: no config.json in {BUNDLED_MODEL_DIR}. Reinstall fisher-atlas "
                "from a complete wheel/checkout, or pass a hub id or a local model directory instead of 'bundled'",
                detail={"model": name, "path": str(BUNDLED_MODEL_DIR)},
            )
        return str(BUNDLED_MODEL_DIR), BUNDLED_NAME, True
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelUnavailable(
                f"model directory {str(path)!r} has no config.json; it must hold save_pretrained() output "
                "(config.json, weights and tokenizer files)",
                detail={"model": name, "path": str(path.resolve())},
            )
        return str(path), str(path.resolve()), True
    if path.exists() or _looks_like_path(name):
        raise ModelUnavailable(
            f"model directory {name!r} does not exist (or is not a directory); pass a directory holding "
            "save_pretrained() output, a hub id, or 'bundled'",
            detail={"model": name, "path": str(path)},
        )
    return name, name, False


def _unavailable(name: str, revision: str | None, is_local: bool, what: str, ex: Exception) -> ModelUnavailable:
    cause = f"{type(ex).__name__}: {str(ex).strip().splitlines()[0] if str(ex).strip() else ''}"
    detail = {"model": name, "revision": revision, "missing": what, "cause": cause}
    if "trust_remote_code" in cause or "custom code" in cause:
        hint = ("models that need their own code (auto_map, trust_remote_code) are not supported: FisherAtlas "
                "never runs code shipped with a model")
    elif "Unrecognized" in cause or "does not recognize this architecture" in cause:
        hint = ("this transformers version has no causal-LM class for the model's config; FisherAtlas needs a "
                "causal (decoder-only) language model that AutoModelForCausalLM knows")
    elif is_local:
        hint = "the directory must hold complete save_pretrained() output of both model and tokenizer"
    else:
        hint = ""
    if is_local or hint:
        where = "from its directory" if is_local else f"from the hub or its cache (revision {revision!r})"
        return ModelUnavailable(f"cannot load the {what} of model {name!r} {where} ({cause}); {hint}", detail=detail)
    from huggingface_hub import constants

    rev = f" (revision {revision!r})" if revision else ""
    return ModelUnavailable(
        f"model {name!r}{rev} is not available: its {what} could not be loaded ({cause}). No network/hub is "
        f"reachable or HF_HUB_OFFLINE is set, and it is not in the Hugging Face cache at "
        f"{constants.HF_HUB_CACHE}. Supply it by (1) passing a local directory with save_pretrained() output "
        f"of model and tokenizer, or (2) running `huggingface-cli download {name}` on a connected machine and "
        f"copying the cache into HF_HOME here, or (3) allowing network access and unsetting HF_HUB_OFFLINE",
        detail=detail,
    )


def _tokenizer_usable(tokenizer: Any) -> bool:
    """A tokenizer with no files behind it can still be built (empty vocabulary): reject that."""
    try:
        ids = tokenizer("The quick brown fox.", add_special_tokens=False)["input_ids"]
        return len(tokenizer) > 1 and len(ids) > 0
    except Exception:
        return False


def _ensure_pad_token(tokenizer: Any) -> None:
    if getattr(tokenizer, "pad_token_id", None) is not None:
        return
    if getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    elif getattr(tokenizer, "unk_token", None) is not None:
        tokenizer.pad_token = tokenizer.unk_token
    # else: no pad token at all; extraction pads with id 0 under an attention mask


def load_configured_model(settings: Settings) -> LoadedModel:
    """Load the model that ``settings`` names (model, revision, device, dtype).

    Also applies ``settings.torch_threads`` (intra-op threads of this process) when it is set: on
    small shared CPUs fewer threads than cores is often faster.
    """
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    return load_causal_lm(settings.model, revision=settings.model_revision, device=settings.device,
                          dtype=settings.dtype)
