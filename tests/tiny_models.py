"""Tiny real transformers models, built from a config and saved to disk, for tests.

No hub is reachable: every test model is created here with random weights, a real byte-level BPE
tokenizer trained on a few sentences, and saved with ``save_pretrained`` so that the code under test
loads it with ``from_pretrained`` exactly as it would load a downloaded model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TOKENIZER_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Question: is the sky blue? Answer: yes.",
    "CC(=O)OC1=CC=CC=C1C(=O)O",
    "Fisher alignment compares the geometry of tasks through their head gradients.",
    "A vector database stores signatures and answers nearest-neighbour queries.",
] * 4


def build_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """Train a tiny byte-level BPE tokenizer with an ``<|endoftext|>`` token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TOKENIZER_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def save_tiny_gpt2(path: Path, *, seed: int = 0, n_embd: int = 32, n_layer: int = 2) -> Path:
    """Save a tiny random GPT-2 (tied head, no bias) and its tokenizer to ``path``."""
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_embd=n_embd, n_layer=n_layer, n_head=2, n_positions=256,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    model = GPT2LMHeadModel(config).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_llama(path: Path, *, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Save a tiny random Llama-architecture model (untied head) and its tokenizer to ``path``."""
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
