"""Dataset builders for the quality experiments, all from ``shared/data``: the rules every builder follows
(the bundled model's training rows, seeded splits), the natural text domains and the instruction tasks.

Rows the bundled model was trained on are never used. ``scripts/train_bundled_model.py`` (and the
model card) fix its training subset by a hash of each row's key::

    bucket(key) = int(sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10,  training rows: bucket < 4

for these sources: multidomain_text ``literature_shakespeare``, ``academic_paper_titles`` and the
NCBI-disease rows of ``biomedical_abstracts`` (key = text); multitask_instructions BIG-Bench-Hard and
MMLU (key = input); molecules HIV, MUV, Tox21 and the ZINC subset (key = SMILES). The builders here and
those of experiment 6's SMILES domains (:mod:`bench.quality.data_smiles`) drop those rows (:func:`trained_on`,
:func:`trained_smiles`) whatever model is evaluated, so every model sees the same rows. SuperGLUE rows (none of
them training rows) and experiment 2's verbalizer prompts: :mod:`bench.quality.data_superglue`.

Every split is a deterministic function of a seed (``numpy.random.default_rng(seed)`` permutations).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from bench.quality.common import shared_data_dir

# ----------------------------------------------------------------------------------------------------
# The bundled model's training rows

TRAIN_BUCKETS = 4
_TRAINED_TEXT_DOMAINS = ("literature_shakespeare", "academic_paper_titles")
_TRAINED_QA_SOURCES = ("BIG-Bench-Hard", "MMLU (hendrycks/test)")
_TRAINED_SMILES_FILES = ("moleculenet_hiv.jsonl", "moleculenet_muv.jsonl", "moleculenet_tox21.jsonl",
                         "zinc_jtnn_subset.jsonl")


def bucket(key: str) -> int:
    """Hash bucket (0–9) of a row key, as in ``scripts/bundled_training/sources.py`` (the training script's)."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10


def trained_on(dataset: str, row: dict[str, Any], file: str = "") -> bool:
    """Whether the bundled model was trained on ``row``.

    Parameters
    ----------
    dataset : {"multidomain_text", "multitask_instructions", "molecules_smiles", "superglue"}
    row : dict
        The JSON row.
    file : str
        File name (molecules only).

    Returns
    -------
    bool
    """
    if dataset == "multidomain_text":
        trained = row["domain"] in _TRAINED_TEXT_DOMAINS or (
            row["domain"] == "biomedical_abstracts" and str(row.get("source", "")).startswith("NCBI-disease"))
        return trained and bucket(row["text"]) < TRAIN_BUCKETS
    if dataset == "multitask_instructions":
        return row.get("source") in _TRAINED_QA_SOURCES and bucket(row["input"]) < TRAIN_BUCKETS
    if dataset == "molecules_smiles":
        return file in _TRAINED_SMILES_FILES and bucket(row["smiles"].strip()) < TRAIN_BUCKETS
    return False


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the objects of a JSONL file."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


@cache
def trained_smiles() -> frozenset[str]:
    """SMILES strings the bundled model was trained on (from any of its training files).

    A molecule staged in several files counts as trained when it is a training row of one of them, so
    a copy in an untrained file (e.g. BBBP) is excluded too.
    """
    root = shared_data_dir() / "molecules_smiles"
    out: set[str] = set()
    for name in _TRAINED_SMILES_FILES:
        for r in read_jsonl(root / name):
            if trained_on("molecules_smiles", r, name):
                out.add(r["smiles"].strip())
    return frozenset(out)


def disjoint_splits(n: int, sizes: Sequence[int], seed: int) -> list[np.ndarray]:
    """Disjoint random index sets of the given sizes from ``range(n)``.

    Parameters
    ----------
    n : int
        Pool size.
    sizes : sequence of int
        Requested sizes; when they sum to more than ``n`` each is scaled down proportionally.
    seed : int

    Returns
    -------
    list of ndarray of int
    """
    sizes = [int(s) for s in sizes]
    total = sum(sizes)
    if total > n:
        sizes = [int(s * n / total) for s in sizes]
    perm = np.random.default_rng(seed).permutation(n)
    out: list[np.ndarray] = []
    start = 0
    for s in sizes:
        out.append(np.sort(perm[start:start + s]))
        start += s
    return out


# ----------------------------------------------------------------------------------------------------
# Experiment 3: natural text domains


@cache
def _multidomain_rows() -> tuple[dict[str, Any], ...]:
    path = shared_data_dir() / "multidomain_text" / "multidomain_text.jsonl"
    return tuple(r for r in read_jsonl(path) if not trained_on("multidomain_text", r))


@cache
def _multitask_rows() -> tuple[dict[str, Any], ...]:
    path = shared_data_dir() / "multitask_instructions" / "multitask.jsonl"
    return tuple(r for r in read_jsonl(path) if not trained_on("multitask_instructions", r))


def _unique(texts: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for t in texts:
        t = t.strip()
        if t and t not in seen:
            seen.add(t)
            out.append(t)
    return out


def text_domains(min_size: int = 0) -> dict[str, list[str]]:
    """Natural text domains: families × natural slices (31 domains).

    ==========  ===================================================================  ======
    family      slices                                                               source
    ==========  ===================================================================  ======
    news        world, sports, business, scitech (AG News topics)                    multidomain_text
    reviews     positive, negative (SST-2 polarity)                                  multidomain_text
    trec        HUM, LOC, DESC, NUM, ENTY (coarse TREC question class; ABBR too few)  multidomain_text
    scicite     background, method, result (citation intent)                         multidomain_text
    titles      7 MAG fields of study                                                multidomain_text
    biomed      NCBI-disease, BC5CDR sentences                                       multidomain_text
    single      cs_abstracts, wikipedia, shakespeare                                 multidomain_text
    superglue   boolq passages, rte premises, cb premises                            superglue
    other       mmlu questions (stems, no options), zinc smiles                      multitask, molecules
    ==========  ===================================================================  ======

    Parameters
    ----------
    min_size : int
        Domains with fewer unique texts are dropped.

    Returns
    -------
    dict of str to list of str
        Unique texts in file order, without the bundled model's training rows.
    """
    groups: dict[str, list[str]] = defaultdict(list)
    for r in _multidomain_rows():
        d = r["domain"]
        if d.startswith("news_"):
            groups[d].append(r["text"])
        elif d == "movie_reviews":
            groups[f"reviews_{r['label']}"].append(r["text"])
        elif d == "questions_trec":
            coarse = r["label"].split(":")[0]
            if coarse != "ABBR":
                groups[f"trec_{coarse}"].append(r["text"])
        elif d == "scientific_citations":
            groups[f"scicite_{r['label']}"].append(r["text"])
        elif d == "academic_paper_titles":
            groups[f"titles_{r['subdomain']}"].append(r["text"])
        elif d == "biomedical_abstracts":
            corpus = "ncbi" if r["source"].startswith("NCBI") else "bc5cdr"
            groups[f"biomed_{corpus}"].append(r["text"])
        elif d == "computer_science_abstracts":
            groups["cs_abstracts"].append(r["text"])
        elif d == "wikipedia":
            groups["wikipedia"].append(r["text"])
        elif d == "literature_shakespeare":
            groups["shakespeare"].append(r["text"])
    sg = shared_data_dir() / "superglue"
    groups["boolq_passages"] = [r["passage"] for r in read_jsonl(sg / "BoolQ_val.jsonl")]
    for name, files in (("rte_premises", ("RTE_train", "RTE_val", "RTE_test")),
                        ("cb_premises", ("CB_train", "CB_val", "CB_test"))):
        groups[name] = [r["premise"] for f in files for r in read_jsonl(sg / f"{f}.jsonl")]
    groups["mmlu_questions"] = [r["input"].split("\nA.")[0] for r in _multitask_rows()
                                if r["task"].startswith("mmlu_")]
    mol = shared_data_dir() / "molecules_smiles" / "zinc_jtnn_subset.jsonl"
    trained = trained_smiles()
    groups["zinc_smiles"] = [r["smiles"] for r in read_jsonl(mol) if r["smiles"].strip() not in trained]
    out = {k: _unique(v) for k, v in sorted(groups.items())}
    return {k: v for k, v in out.items() if len(v) >= min_size}


# ----------------------------------------------------------------------------------------------------
# Experiments 4 and 5: instruction tasks


@dataclass(frozen=True)
class TaskExample:
    """One instance of an instruction task."""

    input: str
    output: str

    @property
    def text(self) -> str:
        """The instance as a task sample: input, a space, the gold output."""
        return f"{self.input} {self.output}"


def instruction_tasks() -> dict[str, list[TaskExample]]:
    """The 105 multitask_instructions tasks, without the bundled model's training rows (file order).

    Instances whose ``input`` repeats an earlier one of the same task are dropped (LAMA relations
    repeat templates with the same subject), so a held-out prompt never also appears among the
    task's signature samples.
    """
    tasks: dict[str, list[TaskExample]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for r in _multitask_rows():
        key = (r["task"], r["input"].strip())
        if key in seen:
            continue
        seen.add(key)
        tasks[r["task"]].append(TaskExample(r["input"], r["output"]))
    return dict(sorted(tasks.items()))


@dataclass
class TaskSplit:
    """Signature samples and held-out prompts of one task."""

    signature: list[TaskExample]
    heldout: list[TaskExample]


def split_task(examples: Sequence[TaskExample], n_signature: int, n_heldout: int, seed: int) -> TaskSplit:
    """Held-out prompts first (``n_heldout``), then up to ``n_signature`` signature samples.

    Parameters
    ----------
    examples : sequence of TaskExample
    n_signature, n_heldout : int
    seed : int

    Returns
    -------
    TaskSplit
    """
    perm = np.random.default_rng(seed).permutation(len(examples))
    held = [examples[i] for i in perm[:n_heldout]]
    sig = [examples[i] for i in perm[n_heldout:n_heldout + n_signature]]
    return TaskSplit(signature=sig, heldout=held)
