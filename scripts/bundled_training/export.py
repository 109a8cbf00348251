"""Export of the trained model and its tokenizer as a ``save_pretrained`` directory."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast


def save_model(model: GPT2LMHeadModel, tokenizer: PreTrainedTokenizerFast, out: Path, dtype: str) -> None:
    """Save weights (``dtype``, dropout 0 in the config) and tokenizer as ``save_pretrained`` output."""
    model = model.to("cpu").to(getattr(torch, dtype))
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        setattr(model.config, key, 0.0)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # AutoTokenizer of transformers 4.x does not know the 5.x class name "TokenizersBackend";
    # "PreTrainedTokenizerFast" loads the same tokenizer.json in both major versions.
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text(encoding="utf-8"))
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
    for path in out.iterdir():
        if path.is_file():
            path.chmod(0o644)
