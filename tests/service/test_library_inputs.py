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


def test_query_arguments_and_files_are_checked_as_rest_checks_them(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Each of these passed unchecked in library mode (REST's schemas refuse them): a NaN threshold answered every
    prompt with a NaN confidence, k = -1 returned all sources but the last, an empty store's matrix raised
    IndexError; files, samples and fit examples of the wrong shape raised bare Python errors."""
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        with pytest.raises(InvalidInput):
            atlas.matrix()  # no ready task
        texts = ["rain and clouds over the hills today", "a storm with wind and heavy rain tonight",
                 "sunny skies and a warm breeze by noon", "fog in the valley until the morning"]
        atlas.add("weather", texts, progress=False)
        atlas.add("cooking", ["bake the bread in a hot oven", "stir the soup and add some salt",
                              "chop the onions finely", "roast the vegetables for an hour"], progress=False)
        for threshold in (float("nan"), 5.0, -1.5, float("inf")):
            with pytest.raises(InvalidInput):
                atlas.route("rain over the hills", threshold=threshold)
        assert atlas.route("rain over the hills", threshold=1.0).none  # the range's ends are allowed
        for k in (0, -1):
            with pytest.raises(InvalidInput):
                atlas.recommend("weather", k=k)
        for k in (101, 200, 2.0, "3", True):  # REST's bound and types: k = 200 was taken, "1..256" was said
            with pytest.raises(InvalidInput, match=r"k must be an integer in 1\.\.100"):
                atlas.recommend("weather", k=k)  # type: ignore[arg-type]
        assert len(atlas.recommend("weather", k=100)) == 1
        bad_calls: list[Any] = [
            lambda: atlas.add("x", None, progress=False),  # type: ignore[arg-type]
            lambda: atlas.add("x", 5, progress=False),  # type: ignore[arg-type]
            lambda: atlas.add("x", b"rain cloud", progress=False),  # type: ignore[arg-type]
            lambda: atlas.import_(tmp_path / "missing.jsonl"),
            lambda: atlas.export(tmp_path),  # a directory
            lambda: atlas.fit([("rain cloud",)]),  # type: ignore[list-item]
            lambda: atlas.fit([(None, "weather")]),  # type: ignore[list-item]  # was routed as the text "None"
            lambda: atlas.set_false_reject_rate("weather", "x"),  # type: ignore[arg-type]
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInput):
                call()
        with pytest.raises(InvalidInput, match=r"one of text, completion$"):
            atlas.add("x", ["words"], mode="chat", progress=False)
        assert [t.name for t in atlas.tasks()] == ["weather", "cooking"]


def test_a_model_that_does_not_load_is_named_as_the_cause(tmp_path: Path) -> None:
    """On a fresh directory, a model that fails to load made ``add`` say "start a worker for model … (or the
    embedded service)" — in library mode the caller is the embedded service; the reason was only logged. Since a
    review of library mode (2026-12-07) ``Atlas(...)`` itself raises, with the reason: every add and route failed
    after a constructor that returned."""
    from atlas.errors import ModelUnavailable

    def syncing() -> int:
        return sum(t.name == "atlas-index-sync" and t.is_alive() for t in threading.enumerate())

    missing = tmp_path / "no-such-model"
    before = syncing()
    with pytest.raises(ModelUnavailable, match=r"cannot be loaded: model directory .* does not exist") as raised:
        Atlas(tmp_path / "atlas", model=str(missing), sketch_dim=256, device="cpu")
    assert "start a worker" not in str(raised.value)
    assert syncing() == before  # the store it opened is closed again


def test_the_default_progress_bar_writes_nothing_to_stdout(tmp_path: Path, tiny_model_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``add`` with the default ``progress=True`` wrote a blank line per call to the caller's stdout (rich's
    default console), which corrupts a script printing JSON there; the bar goes to stderr, and only on a terminal."""
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("prose", ["The fox jumps over the dog.", "A cat sleeps on the warm mat."])
        atlas.append("prose", ["The dog barks at the moon."])
        assert atlas.task("prose").status == "ready"
    out = capsys.readouterr()
    assert out.out == ""


def test_wrongly_typed_arguments_are_invalid_input(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Found by a review of library mode: each raised a Python error (AttributeError, TypeError, FileExistsError)
    or did something else than asked (bytes routed byte by byte, a dict by its keys, a name read by characters)."""
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(InvalidInput, match="is a file, not a data directory"):
        Atlas(tmp_path / "a-file", model=str(tiny_model_dir), sketch_dim=256, device="cpu")
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("prose", ["The fox jumps over the dog.", "A cat sleeps on the warm mat."], progress=False)
        atlas.add("code", ["def add(a, b): return a + b", "x = [i for i in range(9)]"], progress=False)
        calls: list[tuple[Any, tuple[Any, ...]]] = [
            (atlas.task, (1,)), (atlas.align, (1, 2)), (atlas.route, (None,)), (atlas.route, (b"hello world",)),
            (atlas.route, ({"a": 1},)), (atlas.matrix, ("prose",)),
            (atlas.fit, ([("The fox jumps over the dog.", 1.5)],)),  # (None is "none", as in semantic-router)
        ]
        for call, args in calls:
            with pytest.raises(InvalidInput):
                call(*args)
        assert atlas.route(("The fox jumps over the dog.", "def f(): pass"))[0].matches  # a tuple is a list
        assert atlas.matrix(["prose", "code"]).fisher.shape == (2, 2)
