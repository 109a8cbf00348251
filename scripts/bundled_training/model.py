"""The bundled GPT-2 model: its configuration and the (optional) bf16 autocast context it runs under."""

from __future__ import annotations

import argparse
import contextlib

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from .constants import EOT, VOCAB_SIZE


def build_model(tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace) -> GPT2LMHeadModel:
    """Create a freshly initialised GPT-2 model of the bundled configuration.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerFast
        Tokenizer giving the special-token id.
    args : argparse.Namespace
        Parsed command-line arguments (``n_layer``, ``n_embd``, ``n_head``).

    Returns
    -------
    GPT2LMHeadModel
        Randomly initialised model with tied input/output embeddings (dropout ``args.dropout`` while
        training; the saved config has dropout 0).
    """
    eot_id = tokenizer.convert_tokens_to_ids(EOT)
    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=512,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        tie_word_embeddings=True,
    )
    return GPT2LMHeadModel(config)


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager[object]:
    """Return a bf16 autocast context on CUDA when asked, else a no-op context.

    Parameters
    ----------
    device : torch.device
        Device the model runs on.
    bf16 : bool
        Whether to use bfloat16 autocast (CUDA only; float32 weights and optimiser state are kept).

    Returns
    -------
    contextlib.AbstractContextManager
        The context manager.
    """
    if bf16 and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
