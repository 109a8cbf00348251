"""Source rows of the training corpus: which files and rows are read, their hash bucket and the split.

Every row becomes a :class:`Document`; its key string decides its bucket (train, validation, held-out).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .constants import HELDOUT_BUCKET, N_BUCKETS, TRAIN_BUCKETS, VAL_BUCKET

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
