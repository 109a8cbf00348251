"""Alignment matrices and the atlas map are computed once per set of stored states: the dashboard asks for the
same map and matrix at every view, and each, of 256 tasks, cost about a second of CPU (a review, 2026-12-07).

Real parts: ``Atlas`` over SQLite with the tiny GPT-2 saved on disk; the cache's key is the states' task ids and
row versions, so an append (a new version) or a delete answers anew.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atlas import analysis
from fisher_atlas import Atlas

TEXTS = {"fox": ["the quick brown fox jumps over the lazy dog", "a brown fox runs past the sleeping dog",
                 "the dog sleeps while the fox runs"],
         "sums": ["one plus one is two", "two times three is six", "ten minus four is six"],
         "code": ["def f(x): return x + 1", "for i in range(3): print(i)", "import numpy as np"]}


def test_matrix_and_map_are_computed_once_per_set_of_states(tmp_path: Path, tiny_model_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[int] = []
    real = analysis.alignment_matrix

    def counted(tasks: Any) -> analysis.Matrices:
        computed.append(len(tasks))
        return real(tasks)

    monkeypatch.setattr(analysis, "alignment_matrix", counted)  # atlas_layout calls it too
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        for name, texts in TEXTS.items():
            atlas.add(name, texts, progress=False)
        first = atlas.matrix()
        assert computed == [3]
        again = atlas.matrix()
        assert computed == [3]  # from the cache
        np.testing.assert_array_equal(again.fisher, first.fisher)
        assert again.names == first.names == list(TEXTS)
        again.fisher[0, 1] = 42.0  # the caller's copy: the next answer is unchanged
        assert atlas.matrix().fisher[0, 1] == first.fisher[0, 1]
        pair = atlas.matrix(["sums", "fox"])  # another set (order included): computed
        assert computed == [3, 2] and pair.names == ["sums", "fox"]

        amap = atlas.atlas()
        assert computed == [3, 2, 3]
        assert atlas.atlas() == amap and computed == [3, 2, 3]

        # an append writes a new state version: both answer anew, as a fresh computation does
        atlas.append("fox", ["a red fox and a brown dog", "the fox hides from the dog"], progress=False)
        after = atlas.matrix()
        assert computed == [3, 2, 3, 3]
        fresh = real(_stored_states(atlas))
        np.testing.assert_array_equal(after.fisher, fresh.fisher)
        assert not np.allclose(after.fisher, first.fisher)
        atlas.atlas()
        assert computed == [3, 2, 3, 3, 3]

        atlas.delete("code")
        assert atlas.matrix().names == ["fox", "sums"]
        assert [p.name for p in atlas.atlas().points] == ["fox", "sums"]
        assert computed == [3, 2, 3, 3, 3, 2, 2]


def _stored_states(atlas: Atlas) -> list[analysis.TaskState]:
    """The tasks' stored states now, in the order of ``tasks()``."""
    store = atlas._c.require_store()
    with store.read() as session:
        space = store.default_space(session)
        loaded = atlas._c.state_loader.load(session, space, [t.id for t in atlas.tasks()])
    return [analysis.TaskState(x.task_id, x.name, x.state) for x in loaded]
