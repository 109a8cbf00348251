"""Library mode answers bad input, bad settings and use after ``close()`` with domain errors, as REST does."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from atlas.errors import AtlasError, InvalidInput
from atlas.samples import Sample
from fisher_atlas import Atlas, AtlasClosed


def test_bad_samples_and_settings_are_invalid_input(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Each of these raised a non-domain error (pydantic ValidationError, OSError, UnicodeEncodeError) or, for
    samples of the other mode, created a task whose job then failed; REST refuses them all with 422."""
    # a misspelt setting was silently ignored; data_dir= beside the path raised a TypeError
    for bad in ({"sketch_dimm": 256}, {"sketch_dim": 3}, {"data_dir": tmp_path}):
        with pytest.raises(InvalidInput):
            Atlas(tmp_path / "unused", model=str(tiny_model_dir), device="cpu", **bad)
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        cases: list[tuple[Any, str]] = [
            ([{"txt": "hello world again"}], "text"),                   # wrong key
            ([{"text": 5}], "text"),                                    # not a string
            (["hello \ud800 world", "more words here"], "text"),        # lone surrogate
            ("hello world " * 40, "text"),                              # a text, not a path (name too long)
            (["a text for a completion task", "another one"], "completion"),
            ([Sample(text="a text sample here")], "completion"),
            ([{"prompt": "Q?", "completion": " A"}], "chat"),            # no such mode
        ]
        for samples, mode in cases:
            with pytest.raises(InvalidInput):
                atlas.add("bad", samples, mode=mode, progress=False)
        assert atlas.tasks() == []  # nothing was stored
        task = atlas.add("good", [{"prompt": "Is it?", "completion": " yes it is", "id": 1}], mode="completion",
                         progress=False)  # extra fields are ignored, as in an upload
        assert task.status == "ready"


def test_use_after_close_raises_instead_of_hanging(tmp_path: Path, tiny_model_dir: Path) -> None:
    atlas = Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu")
    atlas.close()
    atlas.close()  # idempotent
    raised: list[BaseException] = []

    def add() -> None:
        try:
            atlas.add("late", ["some words to sketch here"], progress=False)
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=add, daemon=True)  # add() after close() once waited forever
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "add() after close() hangs"
    assert len(raised) == 1 and isinstance(raised[0], AtlasClosed) and isinstance(raised[0], AtlasError)
    with pytest.raises(AtlasClosed):
        atlas.tasks()
