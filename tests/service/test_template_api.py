"""The template test end to end: a job stores the task's template, the library and a server on the same
directory answer ``none`` (``template_rejects``) for a prompt lacking it, the routing info reports it, an
export carries it, and ``route_template=False`` turns it off."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx

from fisher_atlas import Atlas
from service.client import AtlasClient

NAMES = ["Ada", "Bela", "Chen", "Dara", "Emil", "Fern", "Goran", "Hana", "Ivo", "Jana", "Kofi", "Lena", "Mika",
         "Nour", "Oskar", "Pia", "Quinn", "Rosa", "Sami", "Tove"]
WORDS = ["rain", "cloud", "storm", "bake", "flour", "oven", "seven", "eleven", "river", "stone", "green", "north"]
OWN = "The native language of Zora Petrova is ___ ."
OTHER = "The native tongue of Zora Petrova is ___ ."  # no "language": not a prompt of this task's template


def _native(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"The native language of {rng.choice(NAMES)} {rng.choice(NAMES)}son is ___ ." for _ in range(n)]


def _free(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) for _ in range(n)]


def test_a_prompt_lacking_the_answered_tasks_template_is_none(tmp_path: Path, tiny_model_dir: Path, tiny_lm: Any,
                                                               serve: Any) -> None:
    data = tmp_path / "atlas"
    with Atlas(data, model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("native", _native(40, seed=1), progress=False)
        atlas.append("native", _native(20, seed=2), progress=False)  # the template is kept over appends
        atlas.add("free", _free(60, seed=3), progress=False)
        own, other = atlas.route([OWN, OTHER], k=2, threshold=-1.0)
        # a threshold that rejects it as well decides, and the answer names the template too (the threshold's
        # sentence alone said what to lower, and lowering it would still answer none)
        strict = atlas.route([OTHER], k=2, threshold=0.999)[0]
        export = atlas.export(tmp_path / "space.jsonl")
    assert strict.none and strict.rejected_by is not None and strict.rejected_by.reason == "threshold"
    assert "template" in strict.rejected_by.also
    assert "it lacks the answered task's template" in strict.rejected_by.message
    assert own.matches[0].name == "native" and not own.none and not own.template_rejects
    assert other.matches[0].name == "native" and other.none and other.template_rejects
    assert 0.9 < other.confidence < 1.0  # 1 − (misses + 1) / (checks + 2)

    # The novelty test on (the default): under the tiny random model the fit prompts below, "The native tongue of
    # Ada is", are also novel for a task of "X Yson" names; fit turns both tests off for the task (until
    # 2026-11-28 it could not turn the novelty test off, and this part ran with route_novelty=False).
    svc = serve(lm=tiny_lm, data_dir=data)
    with AtlasClient(svc.url) as client:
        res = client.route([OWN, OTHER], k=2, threshold=-1.0)
        assert [r.template_rejects for r in res.results] == [False, True] and res.results[1].none
        assert res.template_rejects is False  # the top level answers the first prompt
        by = res.results[1].rejected_by
        assert by is not None and (by.name, by.reason) == ("native", "template") and res.rejected_by is None
        assert "'native'" in by.message and "template" in by.message
        tasks = {t.name: t.id for t in client.list_tasks().items}
        info = {n: httpx.get(f"{svc.url}/v1/tasks/{i}/routing").json() for n, i in tasks.items()}
        assert info["native"]["template_active"] is True and info["native"]["template_terms"] >= 5
        assert 0 < info["native"]["template_false_reject"] <= 0.02 and info["native"]["template_test"] is True
        assert info["free"]["template_active"] is False
        # per task: PATCH {"template": false} turns it off (the threshold override untouched), true back on
        client.set_threshold(tasks["native"], 0.5)
        off = client.set_template_test(tasks["native"], False)
        assert off.template_test is False and off.threshold_override == 0.5
        assert client.route(OTHER, k=1, threshold=-1.0).template_rejects is False
        client.set_threshold(tasks["native"], None)
        assert client.routing(tasks["native"]).template_test is False  # a threshold PATCH keeps it
        exported_off = client.export_space()
        client.set_template_test(tasks["native"], True)
        # fit: prompts labelled "native" that lack its template show its real prompts do not follow it
        # (as long as the task's samples: a much shorter prompt is held to neither test, docs/SCORES.md)
        own_others = [f"The native tongue of {a} {b}son is ___ ." for a, b in (("Ada", "Bela"), ("Chen", "Dara"),
                                                                               ("Emil", "Fern"))]
        dry = client.fit([(p, "native") for p in own_others], dry_run=True)
        assert dry.template_off == ["native"] and dry.novelty_off == ["native"] and not dry.stored
        assert client.routing(tasks["native"]).template_test is True  # a dry run stores nothing
        assert client.routing(tasks["native"]).novelty_test is True
        fitted = client.fit([(p, "native") for p in own_others] + [(OWN, "native")])
        # (the three reworded prompts, 3 of its 64 positives with its 60 held-out scores, stay under its threshold:
        # within its 5 %, so fit keeps the threshold; with 32 held out they were 3 of 36 and fit lowered it)
        assert fitted.template_off == ["native"] and fitted.accuracy_after >= fitted.accuracy_before
        assert fitted.novelty_off == ["native"]  # 3 of its 4 labelled prompts rejected by the test
        assert client.routing(tasks["native"]).template_test is False
        assert client.routing(tasks["native"]).novelty_test is False
        client.set_template_test(tasks["native"], True)
        client.set_novelty_test(tasks["native"], True)
        assert client.route(OTHER, k=1, threshold=-1.0).template_rejects is True
    fresh = serve(lm=tiny_lm)
    with AtlasClient(fresh.url) as client:  # the export carries the per-task switch
        assert client.import_space(exported_off).imported == 2
        assert client.route(OTHER, k=1, threshold=-1.0).template_rejects is False
        native = {t.name: t.id for t in client.list_tasks().items}["native"]
        assert client.routing(native).template_test is False
        bad = httpx.patch(f"{svc.url}/v1/tasks/{tasks['native']}/routing", json={"template": "maybe"})
        assert bad.status_code == 422

    with Atlas(tmp_path / "copy", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as copy:
        assert copy.import_(export) == 2
        again = copy.route([OWN, OTHER], k=2, threshold=-1.0)
        assert [a.template_rejects for a in again] == [False, True]  # the export carries the template
    with Atlas(data, model=str(tiny_model_dir), sketch_dim=256, device="cpu", route_template=False) as off:
        assert [a.template_rejects or a.none for a in off.route([OWN, OTHER], k=2, threshold=-1.0)] == [False, False]
