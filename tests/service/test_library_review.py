"""Library mode as a notebook user meets it, found by a review of library mode (2026-12-07).

* An ``Atlas`` dropped unclosed (a notebook cell re-run) kept its threads, files and ~50 MB for good.
* ``task().metadata`` was SQLAlchemy's ``MetaData``, not the task's metadata; routing settings were bare dicts.
* ``service.plots`` could not draw a library (or client) answer: ``'AtlasMap' object has no attribute 'get'``.
* Under mypy a user's script got ``Any`` or a union where the README promised an answer (no ``py.typed``).
* ``set_template_test(name, "false")`` turned the test on; a dict of samples was read by its keys (a failed task
  stored); ``add(5, ...)`` an ``AttributeError``; ``Atlas("~/x")`` made a folder named ``~``; a bad model was
  accepted and every later call failed; a file of gigabytes was read whole before its size was checked.
"""

from __future__ import annotations

import gc
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from mypy import api

import fisher_atlas
from fisher_atlas import Atlas, InvalidInput, PayloadTooLarge, RoutingInfo, TaskOut

ROOT = Path(__file__).resolve().parents[2]
PROSE = ["The fox jumps over the lazy dog.", "A cat sleeps on the warm mat.", "The dog barks at the moon.",
         "Birds sing in the tall green trees.", "The horse runs across the open field."]
CODE = ["def add(a, b): return a + b", "x = [i for i in range(9)]", "for k in d: print(k)",
        "class A: pass", "import os, sys"]


def _threads(name: str) -> int:
    return sum(t.name == name and t.is_alive() for t in threading.enumerate())


def test_an_atlas_dropped_unclosed_is_closed_with_a_resource_warning(tmp_path: Path, tiny_model_dir: Path) -> None:
    before = _threads("atlas-index-sync")
    atlas = Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu")
    assert _threads("atlas-index-sync") == before + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del atlas
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "unclosed Atlas" in str(w.message) for w in caught)
    assert _threads("atlas-index-sync") == before  # its threads stopped
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu"):
        pass  # closed by its with block: no warning at collection
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert not any("unclosed Atlas" in str(w.message) for w in caught)


def test_answers_are_the_api_types_and_library_answers_plot(tmp_path: Path, tiny_model_dir: Path) -> None:
    pytest.importorskip("matplotlib")
    from service import plots

    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        seen: list[Any] = []
        task = atlas.add("prose", PROSE, metadata={"source": "review"}, progress=seen.append)
        assert isinstance(task, TaskOut) and task.metadata == {"source": "review"} and task.status == "ready"
        assert seen and isinstance(seen[-1], fisher_atlas.JobOut) and seen[-1].progress.samples_total == len(PROSE)
        atlas.add("code", CODE, progress=False)
        assert atlas.task("prose").model_dump()["metadata"] == {"source": "review"}
        assert [t.name for t in atlas.tasks()] == ["prose", "code"]
        info = atlas.routing("prose")
        assert isinstance(info, RoutingInfo) and info.source == "calibrated"
        # the shapes before 2026-12-07 (a stored row's .meta, a routing dict) still read, with a warning, one release
        with pytest.warns(DeprecationWarning, match="read .metadata"):
            assert task.meta == {"source": "review"}
        with pytest.warns(DeprecationWarning, match="read .threshold"):
            assert info["threshold"] == info.threshold
        with pytest.raises(KeyError), pytest.warns(DeprecationWarning):
            info["no_such_field"]
        assert atlas.set_threshold("prose", 0.2).threshold == pytest.approx(0.2)
        for switch in (atlas.set_template_test, atlas.set_novelty_test):
            for bad in ("false", 0, None):
                with pytest.raises(InvalidInput, match="True or False"):
                    switch("prose", bad)  # type: ignore[arg-type]
        assert atlas.routing("prose").template_test is True  # "false" did not turn anything on or off
        assert atlas.set_template_test("prose", False).template_test is False

        written = [plots.save_atlas(atlas.atlas(), tmp_path / "map.png", title="library"),
                   plots.save_matrix(atlas.matrix(["prose", "code"]), tmp_path / "matrix.svg", title="library"),
                   plots.save_factors(atlas.recommend("prose", k=1), tmp_path / "sources.png", title="library")]
        assert all(p.stat().st_size > 1000 for p in written)
        assert "code" in (tmp_path / "matrix.svg").read_text()  # the names are drawn
        with pytest.raises(plots.PlotError, match="cannot draw a int"):
            plots.save_atlas(5, tmp_path / "x.png", title="no")

        # inputs that did something else than asked
        bad_calls: list[tuple[Any, ...]] = [
            (atlas.add, "dict", {"text": "a long enough sentence", "domain": "x"}),  # read by its keys
            (atlas.add, 5, ["aa bb", "cc dd"]),                                     # AttributeError
            (atlas.route, {"the fox", "the cat"}),                                  # answers in no order
        ]
        for fn, *args in bad_calls:
            with pytest.raises(InvalidInput):
                fn(*args)
        with pytest.raises(InvalidInput, match="progress"):
            atlas.add("yes", PROSE, progress="yes")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="at least one"):
            atlas.matrix([])
        one = atlas.matrix(["prose"])  # 1 x 1, as the REST API and the client answer (refused here before)
        assert one.names == ["prose"] and one.fisher[0][0] == pytest.approx(1.0, abs=1e-6)
        assert [t.name for t in atlas.tasks()] == ["prose", "code"]  # none of them stored a task


def test_home_paths_size_limits_and_a_bad_model(tmp_path: Path, tiny_model_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas.errors import ModelUnavailable

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with Atlas("~/atlases/x", model=str(tiny_model_dir), sketch_dim=256, device="cpu", max_upload_bytes=2000) as atlas:
        assert atlas.settings.data_dir == tmp_path / "home" / "atlases" / "x"
        big = tmp_path / "big.jsonl"
        big.write_text("".join(f'{{"text": "sample number {i} of a file over the limit"}}\n' for i in range(100)))
        with pytest.raises(PayloadTooLarge, match="upload limit is 2000"):
            atlas.add("big", big)
    assert (tmp_path / "home" / "atlases" / "x" / "atlas.sqlite").is_file()
    # made for its owner only: it holds every upload and the keys' hashes (a security review, 2026-12-07)
    assert (tmp_path / "home" / "atlases" / "x").stat().st_mode & 0o077 == 0
    assert not (tmp_path / "~").exists()
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text("{}")
    with pytest.raises(ModelUnavailable, match="cannot be loaded"):
        Atlas(tmp_path / "y", model=str(not_a_model), device="cpu")
    # opened anyway for what needs no model (an offline machine, a copied directory); a write says why it fails
    with Atlas(tmp_path / "home" / "atlases" / "x", model=str(not_a_model), device="cpu",
               require_model=False) as offline:
        assert offline.tasks() == []
        with pytest.raises(ModelUnavailable, match="not loaded"):
            offline.add("t", ["some words to add", "and a few more"], progress=None)


def test_a_script_using_the_library_is_type_checked(tmp_path: Path) -> None:
    for package in ("fishersketch", "atlas", "workers", "service", "fisher_atlas"):
        assert (ROOT / package / "py.typed").is_file(), package  # installed, mypy reads the packages' types
    script = tmp_path / "notebook.py"
    script.write_text(
        "from fisher_atlas import Atlas, InvalidInput, TaskOut\n"
        "with Atlas('./x') as atlas:\n"
        "    reveal_type(atlas.route('a prompt').matches[0].name)\n"
        "    reveal_type(atlas.route(['a', 'b']))\n"
        "    reveal_type(atlas.task('x').metadata)\n"
        "    reveal_type(atlas.routing('x').threshold)\n"
        "    atlas.set_template_test('x', 'false')\n"
    )
    # the project's own cache (the CI's mypy step fills it, before the tests): a fresh one re-read torch and
    # transformers, 90-180 s of the suite for a 2-second check; mypy re-checks whatever changed since
    out, err, status = api.run(["--cache-dir", str(ROOT / ".mypy_cache"), "--ignore-missing-imports",
                                "--no-error-summary", str(script)])
    lines = out.splitlines()
    assert any(':3: note: Revealed type is "str"' in line for line in lines), out
    assert any(':4: note: Revealed type is "list[atlas.route_answer.RouteAnswer]"' in line
               for line in lines), out
    assert any(':5: note: Revealed type is "dict[str, Any]"' in line for line in lines), out
    assert any(':6: note: Revealed type is "float"' in line for line in lines), out
    assert any(":7: error:" in line and "arg-type" in line for line in lines), out
    assert status == 1, (out, err)
