"""The byte-level BPE tokenizer: trained on the training rows, or an existing one loaded from disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from .constants import DOMAINS, EOT, VOCAB_SIZE
from .sources import Document


def train_tokenizer(docs: list[Document], max_chars_per_domain: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (GPT-2 style) on the training documents.

    Parameters
    ----------
    docs : list[Document]
        Training documents; at most ``max_chars_per_domain`` characters of each domain are used so
        that no domain dominates the merges.
    max_chars_per_domain : int
        Character budget per domain.

    Returns
    -------
    PreTrainedTokenizerFast
        Tokenizer with ``<|endoftext|>`` (id 0) as bos, eos and pad token.
    """
    budget = dict.fromkeys(DOMAINS, max_chars_per_domain)

    def texts() -> Iterator[str]:
        for doc in docs:
            if budget[doc.domain] > 0:
                budget[doc.domain] -= len(doc.text)
                yield doc.text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        model_max_length=512,
    )


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """Load an existing tokenizer (``tokenizer.json``) with ``<|endoftext|>`` as bos, eos and pad.

    Parameters
    ----------
    path : Path
        Directory holding ``tokenizer.json``.

    Returns
    -------
    PreTrainedTokenizerFast
        The tokenizer.
    """
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"), bos_token=EOT, eos_token=EOT, pad_token=EOT, model_max_length=512
    )
