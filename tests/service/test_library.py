"""Library mode: ``Atlas(path)`` in-process, then a server on the same directory gives the same answers.

Also runs the README's library example as written (the block after ``<!-- library-example -->``).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fisher_atlas import Atlas

ROOT = Path(__file__).resolve().parents[2]
WORDS = {
    "weather": ["rain", "cloud", "storm", "wind", "sunny", "cold", "forecast", "snow"],
    "cooking": ["bake", "flour", "oven", "salt", "butter", "simmer", "recipe", "sugar"],
    "numbers": ["one", "two", "three", "seven", "eleven", "twenty", "hundred", "zero"],
}


def _texts(topic: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS[topic]) for _ in range(rng.randint(4, 12))) for _ in range(n)]


def test_library_then_server_same_answers(tmp_path: Path, tiny_model_dir: Path, tiny_lm: Any, serve: Any) -> None:
    data = tmp_path / "atlas"
    prompts = [p for topic in WORDS for p in _texts(topic, 3, seed=99)]
    with Atlas(data, model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        for topic in WORDS:
            seen: list[Any] = []
            task = atlas.add(topic, _texts(topic, 25, seed=1), progress=seen.append)
            assert task.status == "ready" and seen and seen[-1].status == "succeeded"
        atlas.append("weather", _texts("weather", 5, seed=2), progress=False)
        lib_routes = atlas.route(prompts, k=3, threshold=-1.0)
        lib_sources = atlas.recommend("weather", k=2)
        lib_align = atlas.align("weather", "cooking")
        assert atlas.matrix().fisher.shape == (3, 3)
        assert len(atlas.atlas().points) == 3
        export = atlas.export(tmp_path / "space.jsonl")
    assert export.stat().st_size > 0
    svc = serve(lm=tiny_lm, data_dir=data, sketch_dim=256)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        for p, lib in zip(prompts, lib_routes, strict=True):
            got = http.post("/v1/route", json={"prompt": p, "k": 3, "threshold": -1}).json()
            assert [m["name"] for m in got["matches"]] == [m.name for m in lib.matches]
            np.testing.assert_allclose([m["score"] for m in got["matches"]], [m.score for m in lib.matches],
                                       atol=1e-6)
            np.testing.assert_allclose([m["lexical"] for m in got["matches"]], [m.lexical for m in lib.matches],
                                       atol=1e-9)  # the stored terms are fused in, from both front ends
        tasks = {t["name"]: t["id"] for t in http.get("/v1/tasks").json()["items"]}
        assert tasks["weather"] and http.get(f"/v1/tasks/{tasks['weather']}").json()["n_samples"] == 30
        src = http.get(f"/v1/tasks/{tasks['weather']}/sources", params={"k": 2}).json()["sources"]
        assert [s["name"] for s in src] == [s.name for s in lib_sources]
        np.testing.assert_allclose([s["fisher"] for s in src], [s.factors.fisher for s in lib_sources], atol=1e-6)
        al = http.get("/v1/align", params={"a": tasks["weather"], "b": tasks["cooking"]}).json()
        assert al["fisher"] == pytest.approx(lib_align.fisher, abs=1e-6)
        assert al["flags"] == list(lib_align.flags)  # the estimator's caveats, both front ends
        assert [s["flags"] for s in src] == [list(s.factors.flags) for s in lib_sources]
        same = http.get("/v1/align", params={"a": tasks["weather"], "b": tasks["weather"]}).json()
        assert "identical" in same["flags"] and same["rho"] == 1.0
    # The export imports into a fresh library directory with the same answers.
    with Atlas(tmp_path / "copy", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as copy:
        assert copy.import_(export) == 3
        again = copy.route(prompts, k=3, threshold=-1.0)
        assert [[m.name for m in a.matches] for a in again] == [[m.name for m in a.matches] for a in lib_routes]
        # the export carries each task's term counts: the copy fuses the same lexical evidence
        assert [[m.lexical for m in a.matches] for a in again] == [[m.lexical for m in a.matches] for a in lib_routes]
        assert all(m.lexical is not None for a in again for m in a.matches)


def test_library_fit_and_per_task_routing_controls(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``fit`` (dry run, then stored), the routing view and its overrides, from the library as over REST."""
    from atlas.errors import InvalidInput, NotFound

    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        for topic in WORDS:
            atlas.add(topic, _texts(topic, 25, seed=1), progress=False)
        before = {topic: atlas.routing(topic) for topic in WORDS}
        assert all(r.source == "calibrated" and r.calibration_scores > 0 for r in before.values())
        other = ["pencil paper stapler folder", "guitar drum violin piano", "train bus tram ferry bicycle"]
        examples = [(p, topic) for topic in WORDS for p in _texts(topic, 6, seed=7)] + [(p, "none") for p in other * 3]
        dry = atlas.fit(examples, dry_run=True)
        assert not dry.stored and set(dry.thresholds) <= set(WORDS)
        assert 0.0 <= dry.accuracy_before <= dry.accuracy_after <= 1.0
        assert {t: atlas.routing(t).source for t in WORDS} == {t: "calibrated" for t in WORDS}  # nothing stored
        done = atlas.fit(examples)
        assert done.stored and done.thresholds == dry.thresholds
        for name, thr in done.thresholds.items():
            info = atlas.routing(name)
            assert info.source == "override" and info.threshold == pytest.approx(thr)
        info = atlas.set_threshold("cooking", 0.25)
        assert info.source == "override" and info.threshold == pytest.approx(0.25)
        assert atlas.route(_texts("cooking", 1, seed=3)[0], threshold=None).threshold == pytest.approx(0.25)
        cleared = atlas.set_threshold("cooking", None)
        assert cleared.source == "calibrated"
        assert cleared.threshold == pytest.approx(before["cooking"].threshold)
        looser = atlas.set_false_reject_rate("cooking", 0.25)  # re-calibrated from the stored held-out scores
        assert looser.source == "calibrated" and looser.false_reject_rate == 0.25
        assert looser.threshold >= before["cooking"].threshold
        again = atlas.set_false_reject_rate("cooking", 0.05).threshold
        assert again == pytest.approx(before["cooking"].threshold)
        for bad_rate in (0.0, 0.75, float("nan")):
            with pytest.raises(InvalidInput):
                atlas.set_false_reject_rate("cooking", bad_rate)
        assert atlas.set_template_test("weather", False).template_test is False
        assert atlas.routing("weather").template_test is False
        assert atlas.set_template_test("weather", True).template_test is True
        for bad in (1.5, -2.0, float("nan")):
            with pytest.raises(InvalidInput):
                atlas.set_threshold("cooking", bad)
        with pytest.raises(NotFound):
            atlas.routing("no such task")
        with pytest.raises(InvalidInput):
            atlas.fit([])
        for bad_k in (0, -1, 101):  # the REST bounds, in library mode too (k = 0 once raised IndexError)
            with pytest.raises(InvalidInput):
                atlas.route("a pot of soup", k=bad_k)


def test_readme_library_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- library-example -->\s*```python\n(.*?)```", readme, flags=re.S)
    assert match, "README lost its library example"
    script = tmp_path / "example.py"
    script.write_text(match.group(1))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "chemistry" in out.stdout
    assert "skipped" not in out.stderr, out.stderr[-3000:]  # its "CCO" was one token: dropped unseen until 2026-11-25


def test_a_none_for_a_prompt_much_shorter_than_the_samples_says_so(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Thresholds are calibrated on samples: a prompt under half their length is rejected far more often (bench
    4f), and the answer's ``rejected_by`` says so — its lengths and a note in the sentence."""
    rng = random.Random(3)
    long = [" ".join(rng.choice(WORDS["weather"]) for _ in range(40)) for _ in range(12)]
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("weather", long, progress=False)
        short = atlas.route("rain cloud storm", threshold=0.999)
        whole = atlas.route(long[0], threshold=0.999)
    assert short.none and whole.none
    by = short.rejected_by
    assert by.reason == "threshold" and by.prompt_tokens < 0.5 * by.sample_tokens and by.short_prompt
    assert "about as long as the samples" in by.message and f"has {by.prompt_tokens} tokens" in by.message
    assert not whole.rejected_by.short_prompt and "as long as the samples" not in whole.rejected_by.message
    assert whole.rejected_by.sample_tokens == pytest.approx(by.sample_tokens)


def test_an_export_holding_a_name_with_an_invisible_character_still_imports(tmp_path: Path,
                                                                            tiny_model_dir: Path) -> None:
    """Names with zero-width spaces or direction marks are refused since 2026-11-25; an export written before
    holding one still imports whole (all or nothing), the name as it was."""
    import sqlite3

    settings = {"model": str(tiny_model_dir), "sketch_dim": 256, "device": "cpu"}
    with Atlas(tmp_path / "old", **settings) as atlas:
        atlas.add("chem", _texts("cooking", 12, seed=1), progress=False)
    with sqlite3.connect(tmp_path / "old" / "atlas.sqlite") as db:  # as the version before let it be named
        db.execute("UPDATE tasks SET name = ? WHERE name = 'chem'", ("chem\u200bistry",))
    with Atlas(tmp_path / "old", **settings) as atlas:
        export = atlas.export(tmp_path / "space.jsonl")
    with Atlas(tmp_path / "new", **settings) as atlas:
        assert atlas.import_(export) == 1
        assert [t.name for t in atlas.tasks()] == ["chem\u200bistry"]


def test_an_imported_task_still_refuses_its_own_upload_again(tmp_path: Path, tiny_model_dir: Path) -> None:
    """An export carries the content addresses of each task's uploads, so appending the file a task was made from
    is refused after an export and import too (it was accepted there, counting every sample twice: a review); an
    export without them (written before) still imports, and a malformed one is refused before anything is stored."""
    import hashlib
    import json

    from atlas.errors import Conflict
    from atlas.errors import InvalidInput as AtlasInvalidInput

    first = ["the quick brown fox jumps", "a lazy dog sleeps all day", "rain falls on the quiet river"]
    more = ["clouds gather over the hills"]
    with Atlas(tmp_path / "a", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("prose", first, progress=False)
        atlas.append("prose", more, progress=False)
        export = atlas.export(tmp_path / "space.jsonl")
    line = json.loads(export.read_text().splitlines()[1])
    assert len(line["uploads"]) == 2 and all(len(u) == 64 for u in line["uploads"])
    with Atlas(tmp_path / "b", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as copy:
        assert copy.import_(export) == 1
        for samples in (first, more):
            with pytest.raises(Conflict, match="it was imported with the same upload"):
                copy.append("prose", samples, progress=False)
        copy.append("prose", ["new text about the sea"], progress=False)  # anything else is appended
        again = copy.export(tmp_path / "again.jsonl")  # a re-export carries the imported ones and its own
        assert len(json.loads(again.read_text().splitlines()[1])["uploads"]) == 3
    lines = export.read_text().splitlines()
    for uploads, ok in ((None, True), (["not-a-digest"], False)):
        rec = json.loads(lines[1])
        if uploads is None:
            rec.pop("uploads")
        else:
            rec["uploads"] = uploads
        body = [lines[0], json.dumps(rec)]
        raw = "".join(x + "\n" for x in body).encode()
        trailer = {"trailer": True, "n_tasks": 1, "sha256": hashlib.sha256(raw).hexdigest()}
        edited = tmp_path / f"edited-{ok}.jsonl"
        edited.write_bytes(raw + (json.dumps(trailer) + "\n").encode())
        with Atlas(tmp_path / f"c-{ok}", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as other:
            if ok:
                assert other.import_(edited) == 1
                other.append("prose", first, progress=False)  # nothing says it holds them: appended
            else:
                with pytest.raises(AtlasInvalidInput, match="invalid task record"):
                    other.import_(edited)
                assert other.tasks() == []
