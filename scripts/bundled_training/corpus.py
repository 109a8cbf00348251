"""The tokenised corpus: per-domain token streams of the train, held-out and validation splits.

Built from the source rows (:func:`build_corpus`) or read from a prepared ``.npz`` file
(:func:`save_corpus` / :func:`read_corpus`, the two-stage use of the training script).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from .constants import DOMAINS, EOT, HELDOUT_BUCKET, TRAIN_BUCKETS
from .sources import Document, bucket, load_code, load_prose, load_qa, load_smiles, split_documents
from .tokenizer import train_tokenizer


def pack(docs: list[Document], tokenizer: PreTrainedTokenizerFast) -> dict[str, np.ndarray]:
    """Tokenize documents and concatenate them per domain, separated by ``<|endoftext|>``.

    Parameters
    ----------
    docs : list[Document]
        Documents to pack, in the order they should appear.
    tokenizer : PreTrainedTokenizerFast
        The trained tokenizer.

    Returns
    -------
    dict[str, numpy.ndarray]
        Domain name to a 1-D ``int64`` token stream.
    """
    eot_id = tokenizer.convert_tokens_to_ids(EOT)
    streams: dict[str, list[int]] = {domain: [] for domain in DOMAINS}
    texts = [doc.text for doc in docs]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    for doc, ids in zip(docs, encoded, strict=True):
        streams[doc.domain].extend(ids)
        streams[doc.domain].append(eot_id)
    return {domain: np.asarray(ids, dtype=np.int64) for domain, ids in streams.items()}


@dataclass
class Corpus:
    """Tokenised training, validation and held-out streams plus the source manifest.

    Attributes
    ----------
    sources : dict
        Per-source row and character counts.
    train, heldout, val : dict[str, numpy.ndarray]
        Domain to token stream (``uint16``/``int64``) of buckets < 4, == 9 and == 8.
    stdlib_dir : str or None
        The CPython standard library the code rows came from (kept in a prepared corpus, so a summary written
        on another machine names the library that was read, not its own).
    """

    sources: dict[str, dict[str, int | str]]
    train: dict[str, np.ndarray]
    heldout: dict[str, np.ndarray]
    val: dict[str, np.ndarray]
    stdlib_dir: str | None = None


def build_corpus(
    args: argparse.Namespace, tokenizer: PreTrainedTokenizerFast | None
) -> tuple[Corpus, PreTrainedTokenizerFast]:
    """Read the sources, split them by bucket, train or reuse the tokenizer and pack the streams.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments (``data_dir``, ``stdlib_dir``, ``tokenizer_chars``).
    tokenizer : PreTrainedTokenizerFast or None
        Tokenizer to reuse; ``None`` trains one on the training rows.

    Returns
    -------
    tuple[Corpus, PreTrainedTokenizerFast]
        The corpus and the tokenizer used.
    """
    docs = (
        load_prose(args.data_dir, args.stdlib_dir)
        + load_code(args.stdlib_dir)
        + load_qa(args.data_dir)
        + load_smiles(args.data_dir)
    )
    train_docs, heldout_docs, val_docs = split_documents(docs)
    sources: dict[str, dict[str, int | str]] = {}
    for doc in docs:
        entry = sources.setdefault(
            doc.source, {"domain": doc.domain, "rows": 0, "train_rows": 0, "train_chars": 0, "heldout_rows": 0}
        )
        entry["rows"] = int(entry["rows"]) + 1
        b = bucket(doc.key)
        if b < TRAIN_BUCKETS:
            entry["train_rows"] = int(entry["train_rows"]) + 1
            entry["train_chars"] = int(entry["train_chars"]) + len(doc.text)
        elif b == HELDOUT_BUCKET:
            entry["heldout_rows"] = int(entry["heldout_rows"]) + 1
    if tokenizer is None:
        tokenizer = train_tokenizer(train_docs, args.tokenizer_chars)
    corpus = Corpus(sources, pack(train_docs, tokenizer), pack(heldout_docs, tokenizer), pack(val_docs, tokenizer),
                    str(args.stdlib_dir))
    return corpus, tokenizer


def save_corpus(corpus: Corpus, path: Path) -> None:
    """Write a corpus as a compressed ``.npz`` of ``uint16`` streams plus the JSON manifest."""
    arrays = {f"{split}_{d}": getattr(corpus, split)[d].astype(np.uint16) for split in ("train", "heldout", "val")
              for d in DOMAINS}
    np.savez_compressed(path, sources=np.array(json.dumps(corpus.sources)),
                        stdlib_dir=np.array(corpus.stdlib_dir or ""), **arrays)


def read_corpus(path: Path) -> Corpus:
    """Read a corpus written by :func:`save_corpus`."""
    data = np.load(path)
    streams = {split: {d: data[f"{split}_{d}"] for d in DOMAINS} for split in ("train", "heldout", "val")}
    stdlib = str(data["stdlib_dir"]) if "stdlib_dir" in data.files else ""
    return Corpus(json.loads(str(data["sources"])), streams["train"], streams["heldout"], streams["val"],
                  stdlib or None)
