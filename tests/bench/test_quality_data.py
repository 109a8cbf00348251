"""Tests of the quality harness's dataset rules (no shared data needed unless stated)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from bench.quality import data, data_smiles, data_superglue
from bench.quality.report import table, update_section


@pytest.mark.parametrize(
    ("smiles", "domain"),
    [
        ("FC(F)(F)c1ccc(Cl)cc1", "multi_halogen"),
        ("Brc1ccccc1", "brominated"),
        ("Clc1ccc(cc1)C(=O)O", "chlorinated"),
        ("Fc1ccccc1", "fluorinated"),
        ("CCSCC", "sulfur_containing"),
        ("Nc1nc(N)nc(N)n1", "nitrogen_heavy"),
        ("c1ccc2cc3ccccc3cc2c1", "highly_aromatic"),
        ("CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC(=O)O", "large_complex"),
        ("CC(C)CO", "simple_aliphatic"),
        ("c1ccccc1CCO", None),  # aromatic but not highly: unassigned
        ("[Na+].[Cl-]", None),  # two fragments
        ("CCI", None),  # iodine alone is none of the nine
    ],
)
def test_smiles_domain_rules(smiles: str, domain: str | None) -> None:
    stats = data_smiles.molecule_stats(smiles)
    assert stats is not None
    assert data_smiles.smiles_domain(stats) == domain


def test_molecule_stats_counts_atoms() -> None:
    s = data_smiles.molecule_stats("[NH3+]C[C@@H](Br)c1ccccn1")
    assert s is not None
    assert s.elements["N"] == 2 and s.elements["Br"] == 1 and s.elements["C"] == 7
    assert s.aromatic == 6 and s.heavy == 10 and s.fragments == 1
    assert data_smiles.molecule_stats("C1CC!1") is None  # not SMILES


def test_disjoint_splits_are_disjoint_deterministic_and_scaled() -> None:
    a = data.disjoint_splits(100, (50, 30, 10), seed=3)
    b = data.disjoint_splits(100, (50, 30, 10), seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert [len(x) for x in a] == [50, 30, 10]
    assert len(set(np.concatenate(a).tolist())) == 90
    small = data.disjoint_splits(45, (50, 30, 10), seed=3)
    assert [len(x) for x in small] == [25, 15, 5]


def test_bucket_matches_the_training_script_rule() -> None:
    for key in ("CCO", "hello world", "Find all c in Z_3"):
        expected = int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10
        assert data.bucket(key) == expected
    row = {"domain": "literature_shakespeare", "text": "x", "source": "s"}
    assert data.trained_on("multidomain_text", row) == (data.bucket("x") < 4)
    assert not data.trained_on("multidomain_text", {"domain": "news_world", "text": "x", "source": "s"})
    assert not data.trained_on("superglue", {"premise": "x"})


class _WordTokenizer:
    """Splits on spaces; ' Yes' etc. are single tokens only when listed."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = {w: i for i, w in enumerate(vocab)}

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        if text in self.vocab:
            return {"input_ids": [self.vocab[text]]}
        return {"input_ids": [0] * max(2, len(text))}


def test_choose_verbalizers_takes_five_and_flips_the_first() -> None:
    tok = _WordTokenizer([" Yes", " No", " True", " False", " Right", " Wrong", " yes", " no", " good", " bad",
                          " high", " low"])
    chosen = data_superglue.choose_verbalizers(tok)
    names = [v.name for v, _, _ in chosen]
    assert names == ["yes_no", "true_false", "right_wrong", "good_bad", "high_low", "no_yes"]
    flipped, t, f = chosen[-1]
    assert (flipped.true, flipped.false) == (" No", " Yes") and (t, f) == (1, 0)
    with pytest.raises(ValueError):
        data_superglue.choose_verbalizers(_WordTokenizer([" Yes", " No"]))


def test_update_section_replaces_generated_block_and_keeps_reading(tmp_path: Path) -> None:
    path = tmp_path / "quality.md"
    update_section("exp", "1. Exp", "first body", path=path)
    text = path.read_text()
    assert "first body" in text and "<!-- quality:exp:reading -->" in text
    path.write_text(text.replace("_(to be written after the run)_", "My reading."))
    update_section("exp", "1. Exp", "second body", path=path)
    text = path.read_text()
    assert "second body" in text and "first body" not in text and "My reading." in text
    assert text.count("## 1. Exp") == 1
    update_section("zero", "0. First", "zero body", path=path)
    text = path.read_text()
    assert text.index("## 0. First") < text.index("## 1. Exp") and "My reading." in text


def test_table_shape_is_checked() -> None:
    assert table(["a", "b"], [[1, 2]]).splitlines()[1] == "|:---|---:|"
    with pytest.raises(ValueError):
        table(["a", "b"], [[1]])
