"""Train the bundled default model of FisherAtlas: a small GPT-2 causal LM with its own BPE tokenizer.

The model is trained from scratch on CPU on a mixed corpus of four domains (prose, code,
question/answer, SMILES) drawn only from sources whose licences allow shipping derived weights.
Every row of every source is assigned to a bucket by a hash of its key string, so the training
subset is fixed, documented and can be excluded by later evaluations:

``bucket(key) = int(sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10``

Rows with ``bucket < 4`` are training rows (about 40 %). Rows with ``bucket == 9`` are the held-out
rows used by this script to report per-domain loss. Rows with bucket 4-9 are never trained on.
The key is the ``smiles`` field for molecules, the ``text`` field for ``multidomain_text``, the
``input`` field for ``multitask_instructions``, the path relative to the standard library for CPython
source files and the topic name for the Python reference topics (``pydoc_data/topics.py``).

Usage
-----
``python scripts/train_bundled_model.py --data-dir ../shared/data --out workers/bundled_model --seed 0``

``--steps N`` fixes the number of optimiser steps (fully reproducible). Without it, ``--minutes M``
times a few probe steps and picks the number of steps that fits the budget on this machine;
``--time-schedule`` instead runs the learning-rate schedule on wall-clock progress through ``--minutes``
(robust when the machine is shared; the steps done are recorded).

GPU / two-stage use (the accelerator machine has no ``shared/data`` and another CPython)::

    # here: tokenise once with the shipped tokenizer into a compact corpus file
    python scripts/train_bundled_model.py --data-dir ../shared/data --tokenizer-dir workers/bundled_model \
        --prepare-corpus corpus.npz
    # there: train from it on CUDA with bf16 autocast, checkpointing every 500 steps
    python scripts/train_bundled_model.py --corpus corpus.npz --tokenizer-dir workers/bundled_model \
        --out out_dir --device cuda --bf16 --batch-size 128 --n-layer 6 --n-embd 384 --n-head 6 \
        --minutes 8 --time-schedule --checkpoint-dir ckpt --save-dtype float16
    # continue an interrupted run (model, optimiser, step, sampler and torch RNG states)
    python scripts/train_bundled_model.py ... --resume ckpt

``--tokenizer-dir`` keeps an existing tokenizer (so ``K`` = 8192 and the token ids stay the same);
without it the BPE is trained from the training rows as before. Rows with ``bucket == 8`` are a
validation split used only to pick the best checkpoint (``--eval-every``); bucket 9 stays the report split.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

EOT = "<|endoftext|>"
VOCAB_SIZE = 8192
SEQ_LEN = 256
N_BUCKETS = 10
TRAIN_BUCKETS = 4
HELDOUT_BUCKET = 9
VAL_BUCKET = 8
DOMAINS = ("prose", "code", "qa", "smiles")

# Directories of the CPython standard library that are left out of the code corpus (tests, GUI
# demos, vendored or generated files).
STDLIB_SKIP_PARTS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "site-packages",
        "lib2to3",
        "pydoc_data",
        "turtledemo",
        "__pycache__",
        "ensurepip",
        "tkinter",
    }
)
STDLIB_MAX_FILE_BYTES = 300_000

# shared/data multidomain_text domains that are used (licence allows shipping derived weights).
# NCBI-disease sentences only; BC5CDR rows of the same domain are left out (research-use licence).
PROSE_DOMAINS = ("literature_shakespeare", "academic_paper_titles", "biomedical_abstracts")
PROSE_SOURCE_PREFIX = {"biomedical_abstracts": "NCBI-disease"}

# shared/data molecule files that are used: US-government public-domain assays and the ZINC subset.
SMILES_FILES = (
    "moleculenet_hiv.jsonl",
    "moleculenet_muv.jsonl",
    "moleculenet_tox21.jsonl",
    "zinc_jtnn_subset.jsonl",
)

# shared/data multitask_instructions families that are used (MIT licensed).
QA_SOURCES = ("BIG-Bench-Hard", "MMLU (hendrycks/test)")


@dataclass(frozen=True)
class Document:
    """One unit of training text.

    Attributes
    ----------
    domain : str
        One of ``DOMAINS``.
    source : str
        Short source name used in the corpus manifest.
    key : str
        The string whose hash decides the bucket (see module docstring).
    text : str
        The text fed to the model (an end-of-text token is appended when packing).
    """

    domain: str
    source: str
    key: str
    text: str


def bucket(key: str) -> int:
    """Return the hash bucket (0-9) of a row key.

    Parameters
    ----------
    key : str
        The key string of the row (for example the SMILES string or the text).

    Returns
    -------
    int
        ``int(sha256(key)[:8 hex], 16) % 10``.
    """
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % N_BUCKETS


def read_jsonl(path: Path) -> Iterator[dict]:
    """Yield the JSON objects of a JSONL file.

    Parameters
    ----------
    path : Path
        File with one JSON object per line.

    Yields
    ------
    dict
        One parsed row.
    """
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def load_prose(data_dir: Path, stdlib_dir: Path) -> list[Document]:
    """Load the prose documents.

    Parameters
    ----------
    data_dir : Path
        The ``shared/data`` directory.
    stdlib_dir : Path
        The CPython standard-library directory (for the Python reference manual topics).

    Returns
    -------
    list[Document]
        Shakespeare speeches, MAG paper titles, NCBI-disease sentences and Python reference topics.
    """
    docs: list[Document] = []
    for row in read_jsonl(data_dir / "multidomain_text" / "multidomain_text.jsonl"):
        domain = row["domain"]
        if domain not in PROSE_DOMAINS:
            continue
        prefix = PROSE_SOURCE_PREFIX.get(domain)
        if prefix is not None and not row["source"].startswith(prefix):
            continue
        docs.append(Document("prose", f"multidomain_text/{domain}", row["text"], row["text"]))
    namespace: dict[str, dict[str, str]] = {}
    exec((stdlib_dir / "pydoc_data" / "topics.py").read_text(encoding="utf-8"), namespace)
    for topic, text in sorted(namespace["topics"].items()):
        docs.append(Document("prose", "cpython/pydoc_data/topics", topic, text.strip()))
    return docs


def load_code(stdlib_dir: Path) -> list[Document]:
    """Load Python source files of the CPython standard library.

    Parameters
    ----------
    stdlib_dir : Path
        The CPython standard-library directory.

    Returns
    -------
    list[Document]
        One document per ``.py`` file; the key is the path relative to ``stdlib_dir``.
    """
    docs: list[Document] = []
    for path in sorted(stdlib_dir.rglob("*.py")):
        rel = path.relative_to(stdlib_dir)
        if any(part in STDLIB_SKIP_PARTS for part in rel.parts):
            continue
        if path.stat().st_size > STDLIB_MAX_FILE_BYTES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        docs.append(Document("code", "cpython/Lib", rel.as_posix(), text))
    return docs


def load_qa(data_dir: Path) -> list[Document]:
    """Load question/answer documents (BIG-Bench Hard and MMLU).

    Parameters
    ----------
    data_dir : Path
        The ``shared/data`` directory.

    Returns
    -------
    list[Document]
        ``definition``, the question and its gold answer; the key is the ``input`` field.
    """
    docs: list[Document] = []
    for row in read_jsonl(data_dir / "multitask_instructions" / "multitask.jsonl"):
        if row["source"] not in QA_SOURCES:
            continue
        if row["source"].startswith("MMLU"):
            text = f"{row['definition']}\n\n{row['input']} {row['output']}"
        else:
            text = f"{row['definition']}\n\nQ: {row['input']}\nA: {row['output']}"
        docs.append(Document("qa", f"multitask_instructions/{row['source']}", row["input"], text))
    return docs


def load_smiles(data_dir: Path) -> list[Document]:
    """Load SMILES strings, one document per unique string.

    Parameters
    ----------
    data_dir : Path
        The ``shared/data`` directory.

    Returns
    -------
    list[Document]
        One document per unique SMILES string; the key is the string itself.
    """
    docs: list[Document] = []
    seen: set[str] = set()
    for name in SMILES_FILES:
        for row in read_jsonl(data_dir / "molecules_smiles" / name):
            smiles = row["smiles"].strip()
            if smiles and smiles not in seen:
                seen.add(smiles)
                docs.append(Document("smiles", f"molecules_smiles/{name}", smiles, smiles))
    return docs


def split_documents(docs: list[Document]) -> tuple[list[Document], list[Document], list[Document]]:
    """Split documents into training rows and held-out rows by hash bucket.

    Parameters
    ----------
    docs : list[Document]
        All documents of all domains.

    Returns
    -------
    tuple[list[Document], list[Document], list[Document]]
        ``(train, heldout, val)``: ``bucket < TRAIN_BUCKETS``, ``bucket == HELDOUT_BUCKET`` and
        ``bucket == VAL_BUCKET``, each sorted by the hash of its key so the order does not depend on
        file order.
    """

    def order(doc: Document) -> str:
        return hashlib.sha256(doc.key.encode("utf-8")).hexdigest()

    train = sorted((d for d in docs if bucket(d.key) < TRAIN_BUCKETS), key=order)
    heldout = sorted((d for d in docs if bucket(d.key) == HELDOUT_BUCKET), key=order)
    val = sorted((d for d in docs if bucket(d.key) == VAL_BUCKET), key=order)
    return train, heldout, val


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


def eval_windows(stream: np.ndarray, max_windows: int) -> torch.Tensor:
    """Cut a token stream into non-overlapping windows of ``SEQ_LEN`` tokens.

    Parameters
    ----------
    stream : numpy.ndarray
        1-D token stream.
    max_windows : int
        Maximum number of windows.

    Returns
    -------
    torch.Tensor
        ``(n, SEQ_LEN)`` tensor of token ids.
    """
    n = min(max_windows, len(stream) // SEQ_LEN)
    return torch.from_numpy(stream[: n * SEQ_LEN].reshape(n, SEQ_LEN).copy())


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


@torch.no_grad()
def mean_loss(model: GPT2LMHeadModel, windows: torch.Tensor, batch_size: int = 16, bf16: bool = False) -> float:
    """Return the mean next-token cross-entropy (nats) of a model on evaluation windows.

    Parameters
    ----------
    model : GPT2LMHeadModel
        Model to evaluate (put in eval mode here, back in train mode by the caller if needed).
    windows : torch.Tensor
        ``(n, SEQ_LEN)`` token ids.
    batch_size : int
        Windows per forward pass.
    bf16 : bool
        Evaluate under bf16 autocast (CUDA only).

    Returns
    -------
    float
        Token-weighted mean loss.
    """
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size].to(device)
        with autocast(device, bf16):
            loss = model(input_ids=batch, labels=batch).loss
        n_tokens = batch.shape[0] * (batch.shape[1] - 1)
        total += float(loss) * n_tokens
        count += n_tokens
    return total / max(count, 1)


class BatchSampler:
    """Sampler of training batches from the per-domain token streams, with a saveable state.

    Each sequence picks a domain with probability ``weights[domain]`` and then a uniformly random
    window of ``SEQ_LEN`` tokens of that domain's stream.

    Parameters
    ----------
    streams : dict[str, numpy.ndarray]
        Domain to token stream.
    weights : dict[str, float]
        Domain mixture weights (normalised here).
    batch_size : int
        Sequences per batch.
    seed : int
        Seed of the sampler's random generator.
    """

    def __init__(self, streams: dict[str, np.ndarray], weights: dict[str, float], batch_size: int, seed: int) -> None:
        self.streams = streams
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)
        self.names = list(DOMAINS)
        probs = np.array([weights[name] for name in self.names], dtype=np.float64)
        self.probs = probs / probs.sum()

    def __call__(self) -> torch.Tensor:
        """Return a ``(batch_size, SEQ_LEN)`` int64 tensor of token ids."""
        rows = []
        for idx in self.rng.choice(len(self.names), size=self.batch_size, p=self.probs):
            stream = self.streams[self.names[idx]]
            start = int(self.rng.integers(0, len(stream) - SEQ_LEN))
            rows.append(stream[start : start + SEQ_LEN].astype(np.int64))
        return torch.from_numpy(np.stack(rows))

    def state(self) -> dict[str, object]:
        """Return the random generator's state (JSON-serialisable)."""
        return dict(self.rng.bit_generator.state)

    def set_state(self, state: dict[str, object]) -> None:
        """Restore a state returned by :meth:`state`."""
        self.rng.bit_generator.state = state


def make_batch_sampler(
    streams: dict[str, np.ndarray], weights: dict[str, float], batch_size: int, seed: int
) -> BatchSampler:
    """Build a :class:`BatchSampler` (kept for callers of the earlier function API).

    Parameters
    ----------
    streams : dict[str, numpy.ndarray]
        Domain to token stream.
    weights : dict[str, float]
        Domain mixture weights.
    batch_size : int
        Sequences per batch.
    seed : int
        Seed of the sampler's random generator.

    Returns
    -------
    BatchSampler
        Callable returning one batch per call.
    """
    return BatchSampler(streams, weights, batch_size, seed)


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


def make_optimizer(model: GPT2LMHeadModel, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases and layer norms).

    Parameters
    ----------
    model : GPT2LMHeadModel
        Model to optimise.
    lr : float
        Peak learning rate.
    weight_decay : float
        Decoupled weight decay of the matrices.

    Returns
    -------
    torch.optim.AdamW
        The optimiser.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10 % of the peak learning rate.

    Parameters
    ----------
    step : int
        Current step (0-based).
    total : int
        Total number of steps.
    peak : float
        Peak learning rate.
    warmup : int
        Warm-up steps.

    Returns
    -------
    float
        Learning rate for this step.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


def train_step(
    model: GPT2LMHeadModel, optimizer: torch.optim.AdamW, batch: torch.Tensor, lr: float, bf16: bool = False
) -> float:
    """Run one optimiser step and return the batch loss.

    Parameters
    ----------
    model : GPT2LMHeadModel
        Model in training mode.
    optimizer : torch.optim.AdamW
        Its optimiser.
    batch : torch.Tensor
        ``(batch_size, SEQ_LEN)`` token ids.
    lr : float
        Learning rate for this step.
    bf16 : bool
        Forward under bf16 autocast (CUDA only).

    Returns
    -------
    float
        Mean next-token loss of the batch.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    device = next(model.parameters()).device
    batch = batch.to(device, non_blocking=True)
    with autocast(device, bf16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().item()


def probe_seconds_per_step(
    tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace, sample: Callable[[], torch.Tensor]
) -> float:
    """Time a few training steps on a throw-away model to size the run to ``--minutes``.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerFast
        Trained tokenizer.
    args : argparse.Namespace
        Parsed command-line arguments.
    sample : Callable[[], torch.Tensor]
        Batch sampler (a separate one from the training sampler).

    Returns
    -------
    float
        Mean seconds per step after two warm-up steps.
    """
    model = build_model(tokenizer, args).to(args.device)
    model.train()
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    for _ in range(2):
        train_step(model, optimizer, sample(), args.lr, args.bf16)
    start = time.perf_counter()
    n_probe = 5
    for _ in range(n_probe):
        train_step(model, optimizer, sample(), args.lr, args.bf16)
    return (time.perf_counter() - start) / n_probe


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Parameters
    ----------
    argv : list[str] or None
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    argparse.Namespace
        The parsed arguments.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None, help="the shared/data directory")
    parser.add_argument("--corpus", type=Path, default=None, help="pre-tokenised corpus (.npz from --prepare-corpus)")
    parser.add_argument("--prepare-corpus", type=Path, default=None, help="write the tokenised corpus here and exit")
    parser.add_argument("--tokenizer-dir", type=Path, default=None, help="reuse this tokenizer instead of training one")
    parser.add_argument("--out", type=Path, default=None, help="output save_pretrained directory")
    parser.add_argument(
        "--stdlib-dir",
        type=Path,
        default=Path(sysconfig.get_paths()["stdlib"]),
        help="CPython standard library used for the code and Python-reference text (default: this Python's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget used when --steps is not given")
    parser.add_argument("--steps", type=int, default=None, help="fixed number of optimiser steps (reproducible)")
    parser.add_argument(
        "--time-schedule",
        action="store_true",
        help="run the LR schedule on wall-clock progress through --minutes and stop at --minutes",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="hard stop of the training loop (the run is then shorter than --steps; recorded in the summary)",
    )
    parser.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        help="stop after this many steps of the --steps schedule (replays a run cut short by --max-minutes)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="sequences of 256 tokens per step")
    parser.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=50, help="linear warm-up steps")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout while training (saved config has 0)")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--init-from", type=Path, default=None, help="start from these weights (same config)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:0")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on CUDA (fp32 master weights)")
    parser.add_argument("--save-dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="write resumable checkpoints here")
    parser.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints")
    parser.add_argument("--resume", type=Path, default=None, help="resume from this checkpoint directory")
    parser.add_argument("--eval-every", type=int, default=0, help="steps between validation evals (keep best)")
    parser.add_argument("--eval-windows", type=int, default=48, help="held-out windows of 256 tokens per domain")
    parser.add_argument(
        "--tokenizer-chars", type=int, default=2_000_000, help="characters per domain used to train the BPE"
    )
    return parser.parse_args(argv)


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


def save_checkpoint(path: Path, model: GPT2LMHeadModel, optimizer: torch.optim.AdamW, sampler: BatchSampler,
                    meta: dict[str, object]) -> None:
    """Write a resumable checkpoint: model and optimiser states, sampler and torch RNG, step and schedule.

    Parameters
    ----------
    path : Path
        Checkpoint directory (replaced atomically enough for a single writer: written to a temp file first).
    model, optimizer : GPT2LMHeadModel, torch.optim.AdamW
        Training state.
    sampler : BatchSampler
        Batch sampler whose RNG state is saved.
    meta : dict
        Step counters, schedule and best-so-far information (JSON-serialisable).
    """
    path.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "sampler": sampler.state(),
        "meta": meta,
    }
    tmp = path / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(path / "state.pt")
    (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def load_checkpoint(path: Path, model: GPT2LMHeadModel, optimizer: torch.optim.AdamW,
                    sampler: BatchSampler) -> dict[str, object]:
    """Restore a checkpoint written by :func:`save_checkpoint` and return its ``meta``."""
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    sampler.set_state(state["sampler"])
    return dict(state["meta"])


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


def main(argv: list[str] | None = None) -> None:
    """Build the corpus, train tokenizer and model, evaluate and save to ``--out``."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    t_start = time.perf_counter()

    tokenizer = load_tokenizer(args.tokenizer_dir) if args.tokenizer_dir is not None else None
    if args.corpus is not None:
        if tokenizer is None:
            raise SystemExit("--corpus needs --tokenizer-dir (the tokenizer the corpus was packed with)")
        corpus = read_corpus(args.corpus)
    else:
        if args.data_dir is None:
            raise SystemExit("give --data-dir or --corpus")
        corpus, tokenizer = build_corpus(args, tokenizer)
    for name, entry in corpus.sources.items():
        print(f"[corpus] {name}: {entry}", flush=True)
    print(f"[tokenizer] vocab={len(tokenizer)} ({time.perf_counter() - t_start:.0f}s)", flush=True)
    if args.prepare_corpus is not None:
        save_corpus(corpus, args.prepare_corpus)
        print(f"[corpus] written to {args.prepare_corpus}", flush=True)
        return
    if args.out is None:
        raise SystemExit("--out is required for training")
    train_streams = corpus.train
    train_tokens = {d: len(s) for d, s in train_streams.items()}
    print(f"[corpus] train tokens per domain: {train_tokens}", flush=True)
    heldout_eval = {d: eval_windows(corpus.heldout[d].astype(np.int64), args.eval_windows) for d in DOMAINS}
    train_eval = {d: eval_windows(train_streams[d].astype(np.int64), args.eval_windows) for d in DOMAINS}
    val_eval = {d: eval_windows(corpus.val[d].astype(np.int64), args.eval_windows) for d in DOMAINS}

    # Equal mixture of the four domains: each domain gets a quarter of the training tokens.
    weights = dict.fromkeys(DOMAINS, 1.0)
    sample = make_batch_sampler(train_streams, weights, args.batch_size, args.seed)

    torch.manual_seed(args.seed)
    model = build_model(tokenizer, args)
    if args.init_from is not None:
        init = GPT2LMHeadModel.from_pretrained(args.init_from, dtype=torch.float32)
        model.load_state_dict(init.state_dict())
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())

    def losses(windows: dict[str, torch.Tensor]) -> dict[str, float]:
        return {d: mean_loss(model, windows[d], 64 if device.type == "cuda" else 16, args.bf16) for d in DOMAINS}

    loss_random_heldout = losses(heldout_eval)
    loss_random_train = losses(train_eval)
    print(f"[model] params={n_params} initial held-out loss={loss_random_heldout}", flush=True)

    steps = args.steps
    if steps is None and not args.time_schedule:
        probe_sample = make_batch_sampler(train_streams, weights, args.batch_size, args.seed + 1)
        sec = probe_seconds_per_step(tokenizer, args, probe_sample)
        steps = max(100, int(args.minutes * 60 * 0.92 / sec))
        print(f"[schedule] {sec:.3f}s/step -> {steps} steps for {args.minutes} min", flush=True)

    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    meta: dict[str, object] = {"step": 0, "train_seconds": 0.0, "best_val": None, "best_step": None}
    if args.resume is not None:
        meta = load_checkpoint(args.resume, model, optimizer, sample)
        print(f"[resume] from {args.resume} at step {meta['step']}", flush=True)
    start_step = int(meta["step"])  # type: ignore[call-overload]
    seconds_before = float(meta["train_seconds"])  # type: ignore[arg-type]
    best_val = meta.get("best_val")
    best_state: dict[str, torch.Tensor] | None = None
    if args.resume is not None and (args.resume / "best.pt").exists():
        best_state = torch.load(args.resume / "best.pt", map_location="cpu")
    budget_s = args.minutes * 60

    model.train()
    t_train = time.perf_counter()
    running: list[float] = []
    step = start_step
    while True:
        elapsed = seconds_before + time.perf_counter() - t_train
        if args.time_schedule:
            if elapsed >= budget_s:
                break
            if step < args.warmup:
                lr = args.lr * (step + 1) / args.warmup
            else:  # cosine to 10 % of peak over the wall-clock budget
                frac = min(elapsed / budget_s, 1.0)
                lr = args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))
        else:
            assert steps is not None
            if step >= steps:
                break
            if args.stop_at_step is not None and step >= args.stop_at_step:
                print(f"[train] --stop-at-step: stopped after {step} of {steps} steps", flush=True)
                break
            if args.max_minutes is not None and elapsed > args.max_minutes * 60:
                print(f"[train] --max-minutes reached: stopped after {step} of {steps} steps", flush=True)
                break
            lr = lr_at(step, steps, args.lr, args.warmup)
        running.append(train_step(model, optimizer, sample(), lr, args.bf16))
        step += 1
        if step % 50 == 0:
            elapsed = seconds_before + time.perf_counter() - t_train
            tok_s = (step - start_step) * args.batch_size * SEQ_LEN / max(time.perf_counter() - t_train, 1e-9)
            recent = sum(running[-50:]) / len(running[-50:])
            print(f"[train] step {step} loss {recent:.3f} lr {lr:.2e} {tok_s:.0f} tok/s {elapsed:.0f}s", flush=True)
        if args.eval_every and step % args.eval_every == 0:
            val = sum(losses(val_eval).values()) / len(DOMAINS)
            model.train()
            if best_val is None or val < float(best_val):  # type: ignore[arg-type]
                best_val, meta["best_step"] = val, step
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            print(f"[val] step {step} mean val loss {val:.4f} (best {float(best_val):.4f} @ {meta['best_step']})",
                  flush=True)
        if args.checkpoint_dir is not None and step % args.checkpoint_every == 0:
            meta.update(step=step, train_seconds=seconds_before + time.perf_counter() - t_train, best_val=best_val)
            save_checkpoint(args.checkpoint_dir, model, optimizer, sample, meta)
            if best_state is not None:
                torch.save(best_state, args.checkpoint_dir / "best.pt")
    train_seconds = seconds_before + time.perf_counter() - t_train
    steps_done = step
    if args.checkpoint_dir is not None:
        meta.update(step=step, train_seconds=train_seconds, best_val=best_val)
        save_checkpoint(args.checkpoint_dir, model, optimizer, sample, meta)

    if args.eval_every:
        last_val = sum(losses(val_eval).values()) / len(DOMAINS)
        if best_state is not None and best_val is not None and float(best_val) < last_val:  # type: ignore[arg-type]
            model.load_state_dict(best_state)
            print(f"[val] using best step {meta['best_step']} (val {float(best_val):.4f} < last {last_val:.4f})",
                  flush=True)
        else:
            meta["best_step"] = steps_done
    loss_heldout = losses(heldout_eval)
    loss_train = losses(train_eval)
    print(f"[eval] trained held-out loss={loss_heldout}", flush=True)
    print(f"[eval] trained train-row loss={loss_train}", flush=True)

    save_model(model, tokenizer, args.out, args.save_dtype)
    summary = {
        "bucket_rule": "int(sha256(key.encode('utf-8')).hexdigest()[:8], 16) % 10; train: < 4; held-out: == 9"
        + ("; validation (checkpoint choice): == 8" if args.eval_every else ""),
        "sources": corpus.sources,
        "train_tokens_per_domain": train_tokens,
        "n_params": n_params,
        "n_layer": args.n_layer,
        "n_embd": args.n_embd,
        "n_head": args.n_head,
        "steps": steps if steps is not None else steps_done,
        "steps_done": steps_done,
        "weights_step": meta.get("best_step", steps_done) if args.eval_every else steps_done,
        "batch_size": args.batch_size,
        "seq_len": SEQ_LEN,
        "tokens_trained": steps_done * args.batch_size * SEQ_LEN,
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - t_start, 1),
        "seed": args.seed,
        "lr": args.lr,
        "dropout": args.dropout,
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "bf16_autocast": bool(args.bf16 and device.type == "cuda"),
        "save_dtype": args.save_dtype,
        "init_from": str(args.init_from) if args.init_from else None,
        "time_schedule_minutes": args.minutes if args.time_schedule else None,
        "torch": torch.__version__,
        "eval_windows_per_domain": {d: int(heldout_eval[d].shape[0]) for d in DOMAINS},
        "loss_initial_heldout": loss_random_heldout,
        "loss_initial_train": loss_random_train,
        "loss_heldout": loss_heldout,
        "loss_train": loss_train,
        "best_val_loss": best_val,
        "stdlib_dir": corpus.stdlib_dir,
    }
    (args.out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"[done] saved to {args.out} in {summary['total_seconds']}s", flush=True)


if __name__ == "__main__":
    main()
