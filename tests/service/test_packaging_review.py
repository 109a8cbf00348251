"""Found by a packaging review (2026-12-07): the `gpu` extra installed faiss-gpu and nothing could ask for it; the
distributions carried no licence text."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fisher_atlas import Atlas

ROOT = Path(__file__).resolve().parents[2]


def test_index_gpu_is_passed_to_the_index_and_falls_back_to_the_cpu_with_a_warning(
        tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``FISHER_ATLAS_INDEX_GPU`` (a packaging review: the `gpu` extra installed faiss-gpu, and nothing could ask
    for it). Without faiss-gpu or a CUDA device: a warning, and the CPU."""
    with caplog.at_level("WARNING"), Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256,
                                           device="cpu", index_gpu=True) as atlas:
        assert atlas.settings.index_gpu is True
        assert "faiss-gpu is not available; searching on the CPU" in caplog.text
        atlas.add("words", [f"alpha beta gamma delta sample {i}" for i in range(12)], progress=False)
        assert atlas.route("alpha beta gamma delta sample 40", threshold=-1.0).matches[0].name == "words"


def test_the_licence_and_the_notices_of_the_shipped_weights_are_in_the_distributions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    for name in project["license-files"]:
        assert (ROOT / name).is_file(), name  # setuptools puts them in the wheel's dist-info/licenses
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    notices = (ROOT / "THIRD_PARTY_NOTICES.md").read_text()
    card = (ROOT / "workers" / "bundled_model" / "MODEL_CARD.md").read_text()
    for source in ("char-rnn", "BIG-Bench-Hard", "chemprop", "icml18-jtnn", "CPython"):
        assert source in card and source in notices, source  # every MIT/PSF source of the weights has its notice
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert "graft tests" in manifest and "alembic.ini" in manifest and "LICENSE" in manifest
