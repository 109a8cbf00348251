"""What makes two loaded models the same model: :class:`ModelFingerprint` and the digests behind it.

States (and the spaces that hold them) are tagged with the fingerprint's :meth:`ModelFingerprint.key`;
two keys are equal exactly when the signatures of the two models can be compared. The key is taken over
what the signatures depend on — the architecture (config), every weight, the output head and the
tokenizer — and over nothing else: not the directory a model was loaded from, nor how a hub revision
was spelled. So a model directory moved or copied to another machine keeps its spaces, and a model
retrained in place, or given another tokenizer, gets a space of its own.

Earlier keys, :attr:`ModelFingerprint.previous_keys`, so that a space stored under one is re-keyed once
(:func:`atlas.space_repository.get_or_create_space`) instead of being left behind:

* until 2026-11-25 the key was taken over (name or resolved path, requested revision, config, head);
* until 2026-12-07 the config's digest was taken over ``config.to_dict()``, which holds the defaults the installed
  transformers fills in (4.x adds some 38 generation defaults that 5.x does not): the same model files under
  another transformers version had another key, and a worker or replica of another version served an empty space.
  The digest is now over the model's own ``config.json`` (:func:`config_sha256`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Config keys that change with the library version, the load path or the load dtype, not the model.
_VOLATILE_CONFIG_KEYS = frozenset({
    "transformers_version", "_name_or_path", "name_or_path", "torch_dtype", "dtype", "_commit_hash",
    "_attn_implementation", "_attn_implementation_autoset", "_attn_implementation_internal",
    "attn_implementation", "_experts_implementation", "use_cache", "output_hidden_states",
    "output_attentions", "return_dict",
})

WEIGHT_SAMPLES_PER_TENSOR = 4096
"""Elements read from every parameter tensor for :func:`weights_sha256` (evenly strided)."""

_TOKENIZER_PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    "  Leading spaces,\ttabs\nand new lines\r\n",
    "Question: is 3.14 > 22/7? Answer: no.",
    "def add(a, b):\n    return a + b  # code",
    "CC(=O)OC1=CC=CC=C1C(=O)O",
    "Ünïcödé, 中文字符, العربية, emoji 🙂, ＦＵＬＬＷＩＤＴＨ",
)
"""Texts whose token ids (special tokens included) go into :func:`tokenizer_sha256`."""


@dataclass(frozen=True)
class ModelFingerprint:
    """Identity of a model for the purpose of comparing signatures.

    Attributes
    ----------
    name : str
        ``"bundled"``, the hub name, or the resolved local directory (descriptive: not in the key).
    revision : str or None
        The requested hub revision, else the commit the hub cache resolved, else None (descriptive).
    config_sha256 : str
        :func:`config_sha256`: the model's own ``config.json`` without volatile keys (library version, load path,
        dtype, attention implementation).
    head_sha256 : str
        SHA-256 of the output-head weight (and bias) as little-endian float32, with shapes.
    weights_sha256 : str
        :func:`weights_sha256` of every parameter (a strided sample of each).
    tokenizer_sha256 : str
        :func:`tokenizer_sha256`: the vocabulary and the ids of fixed probe texts.
    previous_keys : tuple of str
        The keys this model had under earlier schemes (see the module docstring), newest first, used once to
        re-key a space stored under one of them.
    """

    name: str
    revision: str | None
    config_sha256: str
    head_sha256: str
    weights_sha256: str
    tokenizer_sha256: str
    previous_keys: tuple[str, ...] = ()

    def key(self) -> str:
        """Short stable key (20 hex chars) over the content digests; equal keys ⇔ comparable states."""
        return content_key("fp3", self.config_sha256, self.head_sha256, self.weights_sha256, self.tokenizer_sha256)

    def to_dict(self) -> dict[str, str | None]:
        """Plain dict (JSON-serialisable)."""
        return {"name": self.name, "revision": self.revision, "config_sha256": self.config_sha256,
                "head_sha256": self.head_sha256, "weights_sha256": self.weights_sha256,
                "tokenizer_sha256": self.tokenizer_sha256, "key": self.key()}


def content_key(scheme: str, config_digest: str, head_digest: str, weights_digest: str, tokenizer_digest: str) -> str:
    """A content key (20 hex chars) of one scheme: ``"fp3"`` now, ``"fp2"`` with :func:`library_config_sha256`
    before 2026-12-07."""
    blob = json.dumps([scheme, config_digest, head_digest, weights_digest, tokenizer_digest])
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


def previous_key(name: str, revision: str | None, config_digest: str, head_digest: str) -> str:
    """The key of the fingerprint before content digests: over (name, revision, config, head), the config's digest
    :func:`library_config_sha256`."""
    blob = json.dumps([name, revision, config_digest, head_digest])
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


def _strip_volatile(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _strip_volatile(v) for k, v in obj.items() if k not in _VOLATILE_CONFIG_KEYS}
    if isinstance(obj, (list, tuple)):
        return [_strip_volatile(v) for v in obj]
    return obj


def config_sha256(config: Any, config_file: Path | None = None) -> str:
    """SHA-256 (hex) of the model's configuration as its files state it: the canonical JSON of ``config_file`` (its
    ``config.json``) without volatile keys; for a model built in memory (no file), of ``config.to_diff_dict()``,
    what ``save_pretrained`` would write. Not ``config.to_dict()``, which holds the defaults the installed transformers
    fills in: they change with its version (the module docstring)."""
    stated: Any = None
    if config_file is not None:
        try:
            stated = json.loads(Path(config_file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stated = None
    if not isinstance(stated, dict):
        stated = config.to_diff_dict()
    return _canonical_sha256(stated)


def library_config_sha256(config: Any) -> str:
    """The config digest of the keys before 2026-12-07: over ``config.to_dict()`` (the installed library's
    defaults included), for :attr:`ModelFingerprint.previous_keys`."""
    return _canonical_sha256(config.to_dict())


def _canonical_sha256(config_dict: dict[str, Any]) -> str:
    canonical = json.dumps(_strip_volatile(config_dict), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def head_sha256(weight: torch.Tensor, bias: torch.Tensor | None, rows_per_step: int = 8192) -> str:
    """SHA-256 (hex) of the head weight (K, H) and bias (K,) as little-endian float32, with shapes.

    Hashed in row blocks so no float32 copy of a large head is ever made whole.
    """
    h = hashlib.sha256()
    h.update(json.dumps({"weight": list(weight.shape), "bias": None if bias is None else list(bias.shape)}).encode())
    with torch.no_grad():
        for tensor in (weight, bias):
            if tensor is None:
                continue
            flat = tensor.detach().reshape(tensor.shape[0], -1)
            for start in range(0, flat.shape[0], rows_per_step):
                block = flat[start:start + rows_per_step].to(device="cpu", dtype=torch.float32).contiguous()
                h.update(block.numpy().astype("<f4", copy=False).tobytes())
    return h.hexdigest()


def weights_sha256(model: torch.nn.Module, samples_per_tensor: int = WEIGHT_SAMPLES_PER_TENSOR) -> str:
    """SHA-256 (hex) over every parameter of ``model``: its shape and ``samples_per_tensor`` evenly strided
    elements as float32 (all of them when it has fewer).

    Independent of parameter names and order (the per-tensor digests are sorted before hashing), so a
    library version that renames modules keeps the digest. Training changes nearly every element of a
    tensor it touches, so a sample of each tensor tells retrained weights apart without reading all of a
    large model (an 8B model's ~300 tensors: a few milliseconds on its device).
    """
    digests = []
    with torch.no_grad():
        for p in model.parameters():
            flat = p.detach().reshape(-1)
            n = flat.numel()
            if n > samples_per_tensor:
                idx = torch.arange(samples_per_tensor, device=flat.device, dtype=torch.int64) * n // samples_per_tensor
                flat = flat.index_select(0, idx)
            values = flat.to(device="cpu", dtype=torch.float32).contiguous().numpy().astype("<f4", copy=False)
            h = hashlib.sha256(json.dumps(list(p.shape)).encode())
            h.update(values.tobytes())
            digests.append(h.hexdigest())
    return hashlib.sha256("".join(sorted(digests)).encode()).hexdigest()


def tokenizer_sha256(tokenizer: Any) -> str:
    """SHA-256 (hex) of the tokenizer's vocabulary (token → id) and of the ids it gives fixed probe texts
    with its special tokens (so normalisation, merges and added BOS/EOS count). The pad token does not
    count: padded positions are masked out of every signature."""
    h = hashlib.sha256()
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    h.update(json.dumps(vocab, ensure_ascii=True).encode())
    for text in _TOKENIZER_PROBES:
        h.update(json.dumps(list(tokenizer(text, add_special_tokens=True)["input_ids"])).encode())
    return h.hexdigest()
