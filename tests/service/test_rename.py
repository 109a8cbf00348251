"""Renaming a task (``PATCH /v1/tasks/{id}`` with ``name``; the client's ``patch_task(name=)``, the CLI's
``tasks update --rename``, the library's ``update(rename=)``).

A team moving routes over from semantic-router found no way to rename one (a review, 2026-12-08): REST refused
``{"name"}`` as an unknown field, and the client's ``patch_task(id, {"name": "wiki"})`` stored ``{"name": "wiki"}`` as
metadata. A rename is logged as a change, so route answers, lists, the map and exports use the new name at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from fisher_atlas import Atlas

PROSE = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs.",
         "The brown fox and the dog are friends.", "The fox jumps over the fence by the road."]
CODE = ["def add(a, b): return a + b", "for i in range(10): print(i)", "import os; print(os.getcwd())",
        "class Point: x = 0; y = 0"]


def test_rest_and_client_rename_and_every_answer_follows(serve: Any, tiny_lm: Any) -> None:
    from service.client import AtlasClient

    served = serve(lm=tiny_lm, sketch_dim=128)
    with AtlasClient(served.url) as client:
        prose = client.add_task("prose", samples=PROSE, metadata={"owner": "me"}, wait=True).task
        client.add_task("code", samples=CODE, wait=True)
        before = client.route("The lazy fox sleeps by the road.", k=2, threshold=-1.0)
        assert before.matches[0].name == "prose"
    with httpx.Client(base_url=served.url, timeout=60) as http:
        r = http.patch(f"/v1/tasks/{prose.id}", json={"name": "  stories  "})
        assert r.status_code == 200, r.text
        assert r.json()["name"] == "stories" and r.json()["metadata"] == {"owner": "me"}  # stripped; metadata kept
        answer = http.post("/v1/route", json={"prompts": ["The lazy fox sleeps by the road."], "k": 2,
                                              "threshold": -1.0}).json()
        assert answer["matches"][0]["name"] == "stories" and answer["matches"][0]["task_id"] == prose.id
        assert [t["name"] for t in http.get("/v1/tasks", params={"name": "stories"}).json()["items"]] == ["stories"]
        assert http.get("/v1/tasks", params={"name": "prose"}).json()["total"] == 0
        assert {p["name"] for p in http.get("/v1/atlas").json()["points"]} == {"stories", "code"}
        export = http.get("/v1/spaces/1/export").text.splitlines()
        assert {json.loads(line)["name"] for line in export[1:-1]} == {"stories", "code"}
        taken = http.patch(f"/v1/tasks/{prose.id}", json={"name": "code"})
        assert taken.status_code == 409 and "already exists" in taken.json()["message"], taken.text
        for bad in ({"name": "none"}, {"name": "123"}, {"name": ""}, {"name": "a\u0000b"}, {}, {"name": None}):
            refused = http.patch(f"/v1/tasks/{prose.id}", json=bad)
            assert refused.status_code == 422, (bad, refused.text)
        both = http.patch(f"/v1/tasks/{prose.id}", json={"name": "tales", "metadata": {"owner": None, "team": "x"}})
        assert both.status_code == 200 and both.json()["name"] == "tales" and both.json()["metadata"] == {"team": "x"}
        assert http.patch("/v1/tasks/999", json={"name": "ghost"}).status_code == 404
    with AtlasClient(served.url) as client:
        renamed = client.patch_task(prose.id, name="prose")
        assert renamed.name == "prose" and renamed.metadata == {"team": "x"}
        assert client.patch_task(prose.id, {"team": None}).metadata == {}  # metadata alone, as before
        assert client.find_task("prose").id == prose.id


def test_cli_and_library_rename(serve: Any, tiny_lm: Any, tiny_model_dir: Path, tmp_path: Path, capsys: Any) -> None:
    from service.cli import main
    from service.client import AtlasClient

    served = serve(lm=tiny_lm, sketch_dim=128)
    with AtlasClient(served.url) as client:
        client.add_task("prose", samples=PROSE, wait=True)
    url = ["--url", served.url, "--json"]
    capsys.readouterr()
    assert main(["tasks", "update", "prose", "--rename", "stories", "--metadata", '{"team": "nlp"}', *url]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "stories" and out["metadata"] == {"team": "nlp"}
    assert main(["tasks", "update", "stories", *url]) == 2  # nothing to change
    assert "--metadata, --rename or both" in capsys.readouterr().err
    assert main(["tasks", "show", "prose", *url]) != 0
    capsys.readouterr()
    with Atlas(tmp_path / "lib", model=str(tiny_model_dir), sketch_dim=128, device="cpu") as atlas:
        atlas.add("prose", PROSE, progress=False)
        atlas.add("code", CODE, progress=False)
        assert atlas.update("prose", rename="stories").name == "stories"
        answer = atlas.route("The lazy fox sleeps by the road.", k=1, threshold=-1.0)
        assert answer.matches[0].name == "stories"
        assert atlas.update("stories", metadata={"a": 1}).metadata == {"a": 1}
        for bad in ({"rename": "code"}, {"rename": "none"}, {}):
            try:
                atlas.update("stories", **bad)
            except Exception as exc:  # a domain error carrying its status, as REST answers
                assert getattr(exc, "status_code", None) in (409, 422), (bad, exc)
            else:
                raise AssertionError(f"{bad} was accepted")


def test_a_rename_may_take_the_name_of_a_failed_task_as_a_create_may(serve: Any, tiny_lm: Any) -> None:
    served = serve(lm=tiny_lm, sketch_dim=128, overrides={"start_runner": False})
    with httpx.Client(base_url=served.url, timeout=30) as http:
        gone = http.post("/v1/tasks", json={"name": "gone", "samples": [{"text": "some text here"}]}).json()
        assert http.post(f"/v1/jobs/{gone['job']['id']}/cancel").status_code == 200
        assert http.get(f"/v1/tasks/{gone['task']['id']}").json()["status"] == "failed"
        other = http.post("/v1/tasks", json={"name": "other", "samples": [{"text": "other text"}]}).json()
        r = http.patch(f"/v1/tasks/{other['task']['id']}", json={"name": "gone"})  # 409 before
        assert r.status_code == 200 and r.json()["name"] == "gone", r.text
        assert http.get(f"/v1/tasks/{gone['task']['id']}").status_code == 404  # the failed task made room
        # a task of that name that has not failed keeps it
        third = http.post("/v1/tasks", json={"name": "third", "samples": [{"text": "third text"}]}).json()
        assert http.patch(f"/v1/tasks/{third['task']['id']}", json={"name": "gone"}).status_code == 409

