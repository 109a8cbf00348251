"""A completion-mode task's novelty test (docs/SCORES.md, "Open set: novelty test"): its job keeps its *prompts'*
novelty vectors (from the prompt-side pass), so the open set tests a completion task on its prompts as it tests a
text task on its samples. The tiny model, the library on SQLite, real jobs."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from atlas.novelty import MIN_NOVELTY_SAMPLES
from atlas.samples import Sample, sample_id
from fisher_atlas import Atlas
from tests.service.test_template_api import _free, _native


def _pairs(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"prompt": p, "completion": rng.choice([" English", " French", " Czech"])} for p in _native(n, seed)]


def test_a_completion_task_is_novelty_tested_on_its_prompts(tmp_path: Path, tiny_model_dir: Path) -> None:
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu",
               route_template=False) as atlas:
        atlas.add("native", _pairs(40, seed=1), mode="completion", progress=False)
        atlas.add("free", _free(60, seed=3), progress=False)
        info = atlas.routing("native")
        assert info.prompt_side is True
        assert info.novelty_samples == len({sample_id(Sample(**p)) for p in _pairs(40, seed=1)})  # one a prompt
        atlas.append("native", _pairs(30, seed=2), progress=False)
        distinct = {sample_id(Sample(**p)) for p in _pairs(40, seed=1) + _pairs(30, seed=2)}
        assert atlas.routing("native").novelty_samples == len(distinct)  # appends merge (bottom-k, up to 128)

        own = atlas.route(_native(30, seed=9), k=2)
        assert [a.matches[0].name for a in own].count("native") >= 27  # completion tasks receive their prompts
        own_novel = np.mean([a.novelty_rejects for a in own])
        assert own_novel <= 0.1  # its 2.5 % budget, and the noise of 30 prompts

        # Prompts of another wording that the completion task answers: its novelty test now rejects them.
        foreign = [p.replace("native language", "native tongue") for p in _native(30, seed=5)]
        answers = atlas.route(foreign, k=2)
        by_native = [a for a in answers if a.matches[0].name == "native"]
        assert by_native, "the test needs foreign prompts answered by the completion task"
        assert all(a.none for a in by_native if a.novelty_rejects)
        assert np.mean([a.novelty_rejects for a in by_native]) >= 0.5
        assert MIN_NOVELTY_SAMPLES <= 40
