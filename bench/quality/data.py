"""Dataset builders for the quality experiments, all from ``shared/data``.

Rows the bundled model was trained on are never used. ``scripts/train_bundled_model.py`` (and the
model card) fix its training subset by a hash of each row's key::

    bucket(key) = int(sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10,  training rows: bucket < 4

for these sources: multidomain_text ``literature_shakespeare``, ``academic_paper_titles`` and the
NCBI-disease rows of ``biomedical_abstracts`` (key = text); multitask_instructions BIG-Bench-Hard and
MMLU (key = input); molecules HIV, MUV, Tox21 and the ZINC subset (key = SMILES). The builders here drop
those rows (:func:`trained_on`) whatever model is evaluated, so every model sees the same rows.

Every split is a deterministic function of a seed (``numpy.random.default_rng(seed)`` permutations).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from atlas.samples import Sample
from bench.quality.common import shared_data_dir

# ----------------------------------------------------------------------------------------------------
# The bundled model's training rows

TRAIN_BUCKETS = 4
_TRAINED_TEXT_DOMAINS = ("literature_shakespeare", "academic_paper_titles")
_TRAINED_QA_SOURCES = ("BIG-Bench-Hard", "MMLU (hendrycks/test)")
_TRAINED_SMILES_FILES = ("moleculenet_hiv.jsonl", "moleculenet_muv.jsonl", "moleculenet_tox21.jsonl",
                         "zinc_jtnn_subset.jsonl")


def bucket(key: str) -> int:
    """Hash bucket (0–9) of a row key, as in ``scripts/train_bundled_model.py``."""
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
# Experiment 2: verbalizer shift (SuperGLUE)


@dataclass(frozen=True)
class Verbalizer:
    """A single-token label verbalizer pair.

    Attributes
    ----------
    name : str
        E.g. ``yes_no``; a flipped pair is named like ``no_yes``.
    true : str
        Completion for a positive label (leading space included).
    false : str
        Completion for a negative label.
    """

    name: str
    true: str
    false: str


VERBALIZER_CANDIDATES: tuple[Verbalizer, ...] = (
    Verbalizer("yes_no", " Yes", " No"),
    Verbalizer("true_false", " True", " False"),
    Verbalizer("correct_wrong", " Correct", " Wrong"),
    Verbalizer("right_wrong", " Right", " Wrong"),
    Verbalizer("positive_negative", " Positive", " Negative"),
    Verbalizer("yes_no", " yes", " no"),
    Verbalizer("true_false", " true", " false"),
    Verbalizer("correct_wrong", " correct", " wrong"),
    Verbalizer("right_wrong", " right", " wrong"),
    Verbalizer("positive_negative", " positive", " negative"),
    Verbalizer("correct_incorrect", " correct", " incorrect"),
    Verbalizer("good_bad", " good", " bad"),
    Verbalizer("agree_disagree", " agree", " disagree"),
    Verbalizer("high_low", " high", " low"),
    Verbalizer("in_out", " in", " out"),
    Verbalizer("one_zero", " 1", " 0"),
    Verbalizer("a_b", " A", " B"),
)
"""The paper's five pairs (Table tab:verbalizer-tokens) first, then their lower-case forms, then other
fallbacks; the first five valid names win (so ``correct_wrong`` and ``right_wrong`` share the token
" wrong"/" Wrong" as in the paper)."""


def single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when the tokenizer encodes it as exactly one token, else None."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return int(ids[0]) if len(ids) == 1 else None


def choose_verbalizers(tokenizer: Any, n_plain: int = 5) -> list[tuple[Verbalizer, int, int]]:
    """Pick ``n_plain`` single-token pairs plus the flipped first pair, as the paper's six.

    Candidates are tried in :data:`VERBALIZER_CANDIDATES` order; a pair counts when both words are
    single tokens and its name is not taken yet. The flipped pair swaps the first pair's tokens.

    Parameters
    ----------
    tokenizer : transformers tokenizer
    n_plain : int

    Returns
    -------
    list of (Verbalizer, true_id, false_id)

    Raises
    ------
    ValueError
        Fewer than ``n_plain`` valid pairs.
    """
    chosen: list[tuple[Verbalizer, int, int]] = []
    names: set[str] = set()
    for v in VERBALIZER_CANDIDATES:
        if v.name in names:
            continue
        t, f = single_token_id(tokenizer, v.true), single_token_id(tokenizer, v.false)
        if t is None or f is None or t == f:
            continue
        chosen.append((v, t, f))
        names.add(v.name)
        if len(chosen) == n_plain:
            break
    if len(chosen) < n_plain:
        raise ValueError(f"only {len(chosen)} single-token verbalizer pairs in this tokenizer")
    first, t, f = chosen[0]
    a, b = first.name.split("_", 1)
    chosen.append((Verbalizer(f"{b}_{a}", first.false, first.true), f, t))
    return chosen


PROMPT_TEMPLATE = "Passage: {passage}\n\nQuestion: {question}\n\nThe answer is"
"""The paper's fixed prefix (Appendix "Verbalizer-Shift Experiment Details")."""


@dataclass(frozen=True)
class LabeledPrompt:
    """One binary-labelled fixed-prefix prompt."""

    prompt: str
    label: bool


def load_superglue_binary(dataset: str) -> list[tuple[str, str, bool]]:
    """(passage, question, label) rows of BoolQ (val), RTE (train) or CB (train), binarised.

    BoolQ: passage/question, label as given (only the validation split is staged). RTE: premise →
    passage, hypothesis → question, ``entailment`` → True. CB: the same, ``entailment`` → True and
    ``contradiction``/``neutral`` → False (the paper's binarisation).
    """
    root = shared_data_dir() / "superglue"
    if dataset == "boolq":
        rows = list(read_jsonl(root / "BoolQ_val.jsonl"))
        q = [r["question"].strip() for r in rows]
        return [(r["passage"], qq[:1].upper() + qq[1:] + ("" if qq.endswith("?") else "?"), bool(r["label"]))
                for r, qq in zip(rows, q, strict=True)]
    file = {"rte": "RTE_train.jsonl", "cb": "CB_train.jsonl"}[dataset]
    return [(r["premise"], r["hypothesis"], r["label"] == "entailment") for r in read_jsonl(root / file)]


def truncate_tokens(tokenizer: Any, text: str, max_tokens: int) -> str:
    """``text`` cut to its first ``max_tokens`` tokens (decoded back to a string)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    return tokenizer.decode(ids[:max_tokens]).rstrip()


def verbalizer_prompts(dataset: str, tokenizer: Any, passage_tokens: int) -> list[LabeledPrompt]:
    """All fixed-prefix prompts of a dataset, passages cut to ``passage_tokens`` tokens."""
    out = []
    for passage, question, label in load_superglue_binary(dataset):
        p = truncate_tokens(tokenizer, passage, passage_tokens)
        q = truncate_tokens(tokenizer, question, max(16, passage_tokens // 3))
        out.append(LabeledPrompt(PROMPT_TEMPLATE.format(passage=p, question=q), label))
    return out


def verbalized(prompts: Sequence[LabeledPrompt], v: Verbalizer) -> list[Sample]:
    """Completion-mode samples: the prompt and the label's verbalizer token."""
    return [Sample(prompt=p.prompt, completion=v.true if p.label else v.false) for p in prompts]


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


# ----------------------------------------------------------------------------------------------------
# Experiment 6: SMILES domains

_SMILES_TOKEN = re.compile(r"\[[^\]]+\]|Br|Cl|%\d{2}|[BCNOPSFIbcnops]|[()=#\-+\\/:.~@?*$]|\d")
_BRACKET_ELEMENT = re.compile(r"\[\d*([A-Z][a-z]?|[a-z][a-z]?)")
_ORGANIC = {"B", "C", "N", "O", "P", "S", "F", "I", "Br", "Cl"}
_AROMATIC = {"b", "c", "n", "o", "p", "s", "se", "as"}
_HALOGENS = ("F", "Cl", "Br", "I")


@dataclass(frozen=True)
class MoleculeStats:
    """Atom counts of one SMILES string (hydrogens not counted).

    Attributes
    ----------
    heavy : int
        Heavy atoms.
    elements : Counter
        Element symbol (capitalised, aromatic atoms folded in) → count.
    aromatic : int
        Aromatic atoms (lower-case symbols).
    fragments : int
        Dot-separated fragments.
    """

    heavy: int
    elements: Counter[str]
    aromatic: int
    fragments: int


def molecule_stats(smiles: str) -> MoleculeStats | None:
    """Count the atoms of a SMILES string with a regex tokenizer (no RDKit).

    Returns None for strings with characters outside the SMILES grammar handled here.
    """
    pos = 0
    elements: Counter[str] = Counter()
    aromatic = 0
    for m in _SMILES_TOKEN.finditer(smiles):
        if m.start() != pos:
            return None
        pos = m.end()
        tok = m.group(0)
        if tok.startswith("["):
            em = _BRACKET_ELEMENT.match(tok)
            if em is None:
                return None
            sym = em.group(1)
            if sym == "H":
                continue
            if sym in _AROMATIC:
                aromatic += 1
                sym = sym.capitalize()
            elements[sym] += 1
        elif tok in _ORGANIC:
            elements[tok] += 1
        elif tok in _AROMATIC:
            aromatic += 1
            elements[tok.upper()] += 1
    if pos != len(smiles):
        return None
    return MoleculeStats(heavy=sum(elements.values()), elements=elements, aromatic=aromatic,
                         fragments=smiles.count(".") + 1)


SMILES_DOMAINS = ("multi_halogen", "brominated", "chlorinated", "fluorinated", "sulfur_containing",
                  "nitrogen_heavy", "highly_aromatic", "large_complex", "simple_aliphatic")
"""The paper's nine domains, in the priority order :func:`smiles_domain` assigns them."""


def smiles_domain(stats: MoleculeStats) -> str | None:
    """Assign a molecule to one of the nine domains (first matching rule wins, so domains are disjoint).

    Only single-fragment molecules with 4–60 heavy atoms of the elements C, N, O, S, P, F, Cl, Br, I
    are assigned. Rules, in order:

    1. ``multi_halogen`` — at least two different halogens (F, Cl, Br, I);
    2. ``brominated`` — contains Br; 3. ``chlorinated`` — contains Cl; 4. ``fluorinated`` — contains F;
    5. ``sulfur_containing`` — contains S (and no halogen);
    6. ``nitrogen_heavy`` — at least 4 N atoms and N ≥ 25 % of heavy atoms;
    7. ``highly_aromatic`` — at least 14 aromatic atoms and ≥ 60 % of heavy atoms aromatic;
    8. ``large_complex`` — at least 35 heavy atoms;
    9. ``simple_aliphatic`` — no aromatic atom and at most 12 heavy atoms;

    anything else is unassigned (None).
    """
    el = stats.elements
    if stats.fragments != 1 or not 4 <= stats.heavy <= 60:
        return None
    if set(el) - {"C", "N", "O", "S", "P", "F", "Cl", "Br", "I"}:
        return None
    halogens = [h for h in _HALOGENS if el.get(h, 0) > 0]
    if len(halogens) >= 2:
        return "multi_halogen"
    if "Br" in halogens:
        return "brominated"
    if "Cl" in halogens:
        return "chlorinated"
    if "F" in halogens:
        return "fluorinated"
    if halogens:  # iodine alone: not one of the nine
        return None
    if el.get("S", 0) > 0:
        return "sulfur_containing"
    if el.get("N", 0) >= 4 and el.get("N", 0) >= 0.25 * stats.heavy:
        return "nitrogen_heavy"
    if stats.aromatic >= 14 and stats.aromatic >= 0.6 * stats.heavy:
        return "highly_aromatic"
    if stats.heavy >= 35:
        return "large_complex"
    if stats.aromatic == 0 and stats.heavy <= 12:
        return "simple_aliphatic"
    return None


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


def smiles_domains() -> dict[str, list[str]]:
    """All staged unique SMILES (minus the bundled model's training rows) grouped by :func:`smiles_domain`.

    Returns
    -------
    dict of str to list of str
        Domain → SMILES strings, in file order (files sorted by name), every domain of
        :data:`SMILES_DOMAINS` present (possibly empty).
    """
    root = shared_data_dir() / "molecules_smiles"
    trained = trained_smiles()
    seen: set[str] = set()
    out: dict[str, list[str]] = {d: [] for d in SMILES_DOMAINS}
    for path in sorted(root.glob("*.jsonl")):
        for r in read_jsonl(path):
            s = r["smiles"].strip()
            if not s or s in seen:
                continue
            seen.add(s)
            if s in trained:
                continue
            stats = molecule_stats(s)
            if stats is None:
                continue
            dom = smiles_domain(stats)
            if dom is not None:
                out[dom].append(s)
    return out
