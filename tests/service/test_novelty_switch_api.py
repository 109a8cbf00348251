"""The novelty test's per-task switch end to end (docs/SCORES.md, "Open set: novelty test" and "fit").

A tiny model's store with a task of 60 samples (so it keeps its novelty vectors and is tested): prompts of
another wording are novel for it. The library turns the switch off and on; a server on the same directory
(template test off for the service, so that the novelty test alone decides) answers them ``none``
(``novelty_rejects``) with the test on and by the task's full-rate threshold with it off; PATCH ``{"novelty":
...}`` over real HTTP, the sync and async clients, an export and import round trip, and ``fit`` turning it
off (``novelty_off``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from atlas.novelty import MIN_NOVELTY_SAMPLES
from fisher_atlas import Atlas
from service.cli import main
from service.client import AsyncAtlasClient, AtlasClient
from tests.service.test_template_api import OWN, _free, _native

PROMPTS = [f"The native tongue of {n} is ___ ." for n in ("Ada", "Bo", "Cy")] + [OWN]


def test_the_novelty_switch_over_the_library_http_clients_export_and_fit(
        tmp_path: Path, tiny_model_dir: Path, tiny_lm: Any, serve: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "atlas"
    # Judged as whole samples (route_length_match=False): the fit prompts are shorter than the task's samples, and a
    # short prompt is held to neither the template nor the novelty test (docs/SCORES.md); this test is the switch's.
    with Atlas(data, model=str(tiny_model_dir), sketch_dim=256, device="cpu", route_template=False,
               route_length_match=False) as atlas:
        atlas.add("native", _native(60, seed=1), progress=False)
        atlas.add("free", _free(60, seed=3), progress=False)
        assert atlas.routing("native").novelty_samples >= MIN_NOVELTY_SAMPLES
        assert atlas.routing("native").novelty_test is True
        lib_on = atlas.route(PROMPTS, k=2)
        assert atlas.set_novelty_test("native", False).novelty_test is False
        assert atlas.routing("native").novelty_test is False
        assert not any(a.novelty_rejects for a in atlas.route(PROMPTS, k=2))
        assert atlas.set_novelty_test("native", True).novelty_test is True
    assert sum(a.novelty_rejects for a in lib_on) >= 3

    svc = serve(lm=tiny_lm, data_dir=data, route_template=False, route_length_match=False)
    with AtlasClient(svc.url) as client:
        tasks = {t.name: t.id for t in client.list_tasks().items}
        url = f"{svc.url}/v1/tasks/{tasks['native']}/routing"
        info = httpx.get(url).json()
        assert info["novelty_test"] is True and info["source"] == "calibrated"
        on = client.route(PROMPTS, k=2).results
        novel = [r for r in on if r.novelty_rejects]
        assert len(novel) >= 3 and all(r.none and r.matches[0].name == "native" for r in novel)
        assert all(r.rejected_by is not None and r.rejected_by.reason in ("threshold", "novelty") for r in novel)
        # with the test, the task's route threshold is its split one (half the rate: lower)
        assert all(r.matches[0].threshold <= info["threshold"] for r in on if r.matches[0].name == "native")

        # PATCH {"novelty": false}: no novelty "none", the full-rate threshold; the other switch untouched
        body = httpx.patch(url, json={"novelty": False}).json()
        assert body["novelty_test"] is False and body["template_test"] is True and body["source"] == "calibrated"
        off = client.route(PROMPTS, k=2).results
        assert not any(r.novelty_rejects for r in off)
        assert [r.matches[0].name for r in off] == [r.matches[0].name for r in on]  # the test decides only "none"
        for r in off:
            if r.matches[0].name == "native":
                assert r.matches[0].threshold == body["threshold"]
                assert r.none == (r.matches[0].score < body["threshold"] or r.nearest_rejects)
        client.set_threshold(tasks["native"], 0.5)
        assert client.routing(tasks["native"]).novelty_test is False  # a threshold PATCH keeps it
        client.set_threshold(tasks["native"], None)
        exported_off = client.export_space()
        for bad in ({"novelty": "maybe"}, {"novelty_test": False}):  # the field is `novelty`, as `template`
            assert httpx.patch(url, json=bad).status_code == 422
        assert client.set_novelty_test(tasks["native"], True).novelty_test is True
        assert [r.novelty_rejects for r in client.route(PROMPTS, k=2).results] == [r.novelty_rejects for r in on]

        async def flip() -> tuple[bool, bool]:
            async with AsyncAtlasClient(svc.url) as aio:
                was = (await aio.set_novelty_test(tasks["native"], False)).novelty_test
                return was, (await aio.set_novelty_test(tasks["native"], True)).novelty_test

        assert asyncio.run(flip()) == (False, True)

        # fit: the task's labelled prompts rejected by its novelty test (the template test is off here)
        dry = client.fit([(p, "native") for p in PROMPTS], dry_run=True)
        assert dry.novelty_off == ["native"] and dry.template_off == [] and not dry.stored
        # the threshold its prompts are held to moves with the switch (half rate -> whole rate): said, not silent
        # (a review, 2026-12-07: `thresholds` and `previous` were empty)
        # a threshold fit sets is said in `thresholds`; one the switch moves (half rate -> whole) in `unsplit`
        assert not ("native" in dry.thresholds and "native" in dry.unsplit)
        assert all(dry.unsplit[n] > dry.previous[n] for n in dry.unsplit)
        client.set_threshold(tasks["native"], 0.0)  # below every labelled prompt: fit sets no threshold
        kept = client.fit([(p, "native") for p in PROMPTS], dry_run=True)
        assert kept.novelty_off == ["native"] and "native" not in kept.thresholds
        assert kept.unsplit == {} and kept.previous == {}  # an override holds: no threshold moves, none is said
        client.set_threshold(tasks["native"], None)
        client.set_false_reject_rate(tasks["native"], 0.3)  # labelled prompts above the cap at its rate's half
        loose = client.fit([(p, "native") for p in PROMPTS], dry_run=True)
        info = client.routing(tasks["native"])
        assert loose.novelty_off == ["native"] and "native" not in loose.thresholds
        # held to its threshold at half the rate before, at the whole rate once the test is off: said, not silent
        assert loose.previous == {"native": pytest.approx(info.threshold)}
        assert loose.unsplit == {"native": pytest.approx(info.threshold_auto)}
        assert loose.unsplit["native"] > loose.previous["native"]
        client.set_false_reject_rate(tasks["native"], 0.05)
        assert client.routing(tasks["native"]).novelty_test is True  # a dry run stores nothing
        labelled = tmp_path / "labelled.jsonl"
        labelled.write_text("".join(json.dumps({"prompt": p, "label": "native"}) + "\n" for p in PROMPTS))
        monkeypatch.setenv("FISHER_ATLAS_URL", svc.url)
        capsys.readouterr()
        assert main(["fit", str(labelled), "--dry-run"]) == 0  # the CLI says so
        assert "native: novelty test off (it rejected too many of its labelled prompts)" in capsys.readouterr().out
        fitted = client.fit([(p, "native") for p in PROMPTS])
        assert fitted.novelty_off == ["native"] and fitted.stored
        # those prompts are scored, not forced "none" — here under its threshold, within its rate (a few of its 60
        # held-out scores and their own: fit keeps the threshold; with 32 held out it lowered it and they passed)
        assert fitted.accuracy_after >= fitted.accuracy_before
        assert client.routing(tasks["native"]).novelty_test is False
        again = client.fit([(p, "native") for p in PROMPTS], dry_run=True)
        assert again.novelty_off == []  # switched off: nothing left to turn off

    fresh = serve(lm=tiny_lm, route_template=False, route_length_match=False)
    with AtlasClient(fresh.url) as client:  # the export carries the switch
        assert client.import_space(exported_off).imported == 2
        native = {t.name: t.id for t in client.list_tasks().items}["native"]
        assert client.routing(native).novelty_test is False
        assert not any(r.novelty_rejects for r in client.route(PROMPTS, k=2).results)


def test_fit_caps_a_novelty_tested_task_at_half_its_rate(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A task that keeps its novelty test spends half its false-reject rate on it: ``fit`` starts from the
    half-rate threshold the answers were held to and never raises the task's threshold past the half-rate
    quantile of its positives (its labelled prompts' and held-out scores), so both tests together stay within
    the task's rate. Labels that contradict each other (the task's own wording labelled "none" too) make ``fit``
    raise the threshold as far as the cap lets it."""
    import numpy as np

    from atlas import routing_repo
    from atlas.route_calibration import FALSE_REJECT_RATE

    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu",
               route_template=False) as atlas:
        atlas.add("native", _native(60, seed=1), progress=False)
        atlas.add("free", _free(60, seed=3), progress=False)
        own, foreign = _native(30, seed=7), _native(30, seed=8)
        examples = [(p, "native") for p in own] + [(p, "none") for p in foreign]
        answers = atlas.route([p for p, _ in examples], k=2)
        res = atlas.fit(examples, dry_run=True)
        assert res.novelty_off == []  # the test holds on the task's own wording: it stays on
        assert "native" in res.thresholds
        native = atlas.task("native").id
        store = atlas._c.thresholds.store
        with store.read() as session:
            held = routing_repo.get_held_out_scores(session, [native])[native]
        scores = [next(m.score for m in a.matches if m.name == "native") for a in answers[:len(own)]]
        positives = np.asarray([*scores, *held])
        half_cap = float(np.quantile(positives, FALSE_REJECT_RATE / 2, method="lower"))
        full_cap = float(np.quantile(positives, FALSE_REJECT_RATE, method="lower"))
        assert half_cap < full_cap  # the two caps differ here, so the test tells them apart
        assert res.thresholds["native"] <= half_cap
        # the threshold the answers were held to before: the half-rate one (the task keeps its test)
        assert res.previous["native"] == routing_repo.split_threshold(held, None)
        assert res.previous["native"] < full_cap
        # stored, then fitted again on the same labels: the override it set is capped at half the rate too (a
        # second fit capped an overridden task at the full rate and raised it again, past the half-rate cap)
        stored = atlas.fit(examples)
        again = atlas.fit(examples, dry_run=True)
        assert stored.thresholds["native"] <= half_cap
        assert again.thresholds.get("native", stored.thresholds["native"]) == stored.thresholds["native"] <= half_cap
        assert again.previous.get("native", stored.thresholds["native"]) == stored.thresholds["native"]
