"""Routing quality in a space large enough to be whitened (issue 13, docs/SCORES.md "Ranking").

Library mode (the service's jobs, calibration, index and whitening cache, SQLite on disk) with the
bundled model at the service's m = 4096: 35 multitask-instruction tasks of 16 samples each (every third
of the 105, so the space holds at least ``WHITEN_MIN_TASKS``), plus three tasks of 1, 2 and 3 samples
taken from three other tasks. Their held-out prompts (4 per task) are routed in one batch:

* the whitened ranking is engaged (``rank_score`` on every match) and routes most prompts right;
* a task of 1–3 samples never takes the top-1 of a well-populated task's own held-out prompts;
* a prompt is held to the threshold of its nearest task as well as to that of the answered one
  (docs/SCORES.md "Open set"), and indexed prompts are rarely answered "none" (the calibrated 5 %).
"""

from __future__ import annotations

from pathlib import Path

from atlas.whitening import WHITEN_MIN_TASKS
from fisher_atlas import Atlas
from tests.shared_data import require_shared_data

N_SIGNATURE, N_HELD = 16, 4


def test_small_tasks_never_capture_prompts_in_a_whitened_space(tmp_path: Path) -> None:
    require_shared_data("multitask_instructions")
    from bench.quality.data import instruction_tasks, split_task

    tasks = instruction_tasks()
    names = list(tasks)
    big, spare = names[::3], [n for i, n in enumerate(names) if i % 3 == 1]
    assert len(big) >= WHITEN_MIN_TASKS
    held: dict[str, list[str]] = {}
    with Atlas(tmp_path / "atlas", model="bundled", device="cpu") as atlas:
        for k, name in enumerate(big):
            split = split_task(tasks[name], N_SIGNATURE, N_HELD, seed=k)
            atlas.add(name, [x.input for x in split.signature], progress=False)
            held[name] = [x.input for x in split.heldout]
        small = {f"small{n}": [x.input for x in tasks[src][:n]] for n, src in zip((1, 2, 3), spare, strict=False)}
        for name, texts in small.items():
            atlas.add(name, texts, progress=False)
        prompts = [(name, p) for name, ps in held.items() for p in ps]
        answers = atlas.route([p for _, p in prompts], k=3)
        outside = [n for i, n in enumerate(names) if i % 3 == 2][::2]
        unseen = atlas.route([x.input for n in outside for x in split_task(tasks[n], 0, N_HELD, seed=7).heldout], k=3)
    assert all(m.rank_score is not None for a in answers for m in a.matches)  # the whitened ranking is on
    tops = [a.matches[0].name for a in answers]
    right = sum(top == name for (name, _), top in zip(prompts, tops, strict=True)) / len(prompts)
    taken = [(name, top) for (name, _), top in zip(prompts, tops, strict=True) if top in small]
    print(f"whitened space of {len(big) + len(small)} tasks: top-1 {right:.0%} of {len(prompts)} held-out prompts; "
          f"small tasks took {len(taken)}")
    assert right >= 0.6
    assert not taken, taken
    by_threshold = [a.best_score is not None and a.best_score < a.threshold for a in unseen]
    nearest = [a.nearest_rejects or a.template_rejects or a.novelty_rejects for a in unseen]
    assert all(a.none == (t or n) for a, t, n in zip(unseen, by_threshold, nearest, strict=True))
    none_unseen, none_thr = sum(a.none for a in unseen) / len(unseen), sum(by_threshold) / len(unseen)
    none_indexed = sum(a.none for a in answers) / len(answers)
    indexed_thr = sum(a.best_score is not None and a.best_score < a.threshold for a in answers) / len(answers)
    print(f"none on {len(unseen)} prompts of {len(outside)} tasks outside the space: {none_unseen:.0%} "
          f"(answered task's threshold alone {none_thr:.0%}); on indexed prompts {none_indexed:.0%} "
          f"(alone {indexed_thr:.0%})")
    assert none_indexed <= 0.1
