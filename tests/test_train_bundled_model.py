"""The bundled-model training script: a run cut and resumed equals an uncut run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from workers.model_loading import BUNDLED_MODEL_DIR

SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS_DIR / "train_bundled_model.py"


def _load_script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("train_bundled_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_resume_continues_the_same_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS_DIR))  # the script's bundled_training package sits beside it
    tb = _load_script()
    from bundled_training.constants import DOMAINS
    from bundled_training.corpus import Corpus, save_corpus

    rng = np.random.default_rng(1)
    streams = {d: rng.integers(1, 8192, size=3000).astype(np.uint16) for d in DOMAINS}
    corpus = Corpus({"synthetic": {"domain": "prose", "rows": 1}}, streams, streams, streams, "/elsewhere/lib")
    save_corpus(corpus, tmp_path / "c.npz")
    common = ["--corpus", str(tmp_path / "c.npz"), "--tokenizer-dir", str(BUNDLED_MODEL_DIR), "--steps", "6",
              "--warmup", "2", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "2",
              "--eval-windows", "1", "--threads", "1", "--dropout", "0.1"]
    tb.main([*common, "--out", str(tmp_path / "full")])
    tb.main([*common, "--out", str(tmp_path / "cut"), "--stop-at-step", "3", "--checkpoint-dir", str(tmp_path / "ck")])
    assert json.loads((tmp_path / "ck" / "meta.json").read_text())["step"] == 3
    tb.main([*common, "--out", str(tmp_path / "resumed"), "--resume", str(tmp_path / "ck")])
    full = load_file(tmp_path / "full" / "model.safetensors")
    cut = load_file(tmp_path / "cut" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert full.keys() == resumed.keys()
    assert any(not torch.equal(full[k], cut[k]) for k in full)  # the cut run really stopped early
    for key in full:
        torch.testing.assert_close(resumed[key], full[key], rtol=0, atol=0)
    summary = json.loads((tmp_path / "resumed" / "training_summary.json").read_text())
    assert summary["steps_done"] == 6
    assert summary["stdlib_dir"] == "/elsewhere/lib"  # the corpus's library, not this machine's
    assert json.loads((tmp_path / "resumed" / "config.json").read_text())["resid_pdrop"] == 0.0
