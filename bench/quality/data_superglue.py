"""SuperGLUE rows for the quality experiments (``shared/data/superglue``) and experiment 2's
verbalizer-shift prompts built from them.

BoolQ, RTE and CB binarised (:func:`load_superglue_binary`; none of them is among the bundled model's training
rows, :mod:`bench.quality.data`); the fixed-prefix prompts and single-token verbalizer pairs of the paper's
identifiability stress test (:func:`verbalizer_prompts`, :func:`choose_verbalizers`, :func:`verbalized`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atlas.samples import Sample
from bench.quality.common import shared_data_dir
from bench.quality.data import read_jsonl


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
