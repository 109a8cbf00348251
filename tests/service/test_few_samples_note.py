"""A task of a few samples is told so by its job's notes (REST's ``result.notes``, the CLI, the library's warning).

A review of routes of 5-15 utterances (a team moving from semantic-router, 2026-12-08) found a 1-utterance route
receiving 0 of 20 of its own prompts, a 3-utterance one 3 of 20 — the ranking's minimum-evidence prior at work, by
design — while its job's notes were empty, so nothing told the user.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fisher_atlas import Atlas
from workers.extraction_results import FEW_SAMPLES, sample_notes

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs.",
         "The brown fox and the dog are friends.", "The fox jumps over the fence by the road.",
         "A fox and a dog walk down the road.", "The dog barks at the fox by the fence."]


@given(n=st.one_of(st.integers(-3, 40), st.none(), st.booleans(), st.floats(0, 10), st.text(max_size=3)))
def test_the_note_names_a_task_of_few_samples_and_only_it(n: object) -> None:
    notes = sample_notes({"samples_used": 3, "samples_skipped": 0, "task_samples": n})
    few = isinstance(n, int) and not isinstance(n, bool) and 0 < n <= FEW_SAMPLES
    assert any("receives a prompt only when" in x for x in notes) == few, (n, notes)
    if few:
        assert f"the task has {n} sample" in notes[0]


def test_a_small_task_is_told_and_an_append_past_the_limit_is_not(serve: Any, tiny_lm: Any, tiny_model_dir: Path,
                                                                  tmp_path: Path) -> None:
    from service.client import AtlasClient

    served = serve(lm=tiny_lm, sketch_dim=128)
    with AtlasClient(served.url) as client:
        added = client.add_task("tiny", samples=TEXTS[:2], wait=True)
        job = client.get_job(added.job.id)
        assert job.result is not None
        assert any("the task has 2 samples" in n for n in job.result.notes), job.result.notes
        more = client.append(added.task.id, samples=TEXTS[2:], wait=True)
        appended = client.get_job(more.id)
        assert appended.result is not None and appended.result.notes == [], appended.result.notes
    with Atlas(tmp_path / "lib", model=str(tiny_model_dir), sketch_dim=128, device="cpu") as atlas:
        atlas.add("one", TEXTS[:1], progress=False)
        (job_of_one,) = atlas.jobs("one")
        assert job_of_one.result is not None
        assert any("the task has 1 sample:" in n for n in job_of_one.result.notes)
