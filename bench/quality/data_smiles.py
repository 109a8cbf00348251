"""Experiment 6's SMILES domains: the staged molecules (``shared/data/molecules_smiles``) grouped into the
paper's nine rule-based domains.

Atoms are counted with a regex tokenizer (:func:`molecule_stats`, no RDKit) and each molecule goes to the first
matching rule (:func:`smiles_domain`); the bundled model's training molecules are dropped
(:func:`bench.quality.data.trained_smiles`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from bench.quality.common import shared_data_dir
from bench.quality.data import read_jsonl, trained_smiles

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
