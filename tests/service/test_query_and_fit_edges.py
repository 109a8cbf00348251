"""Edges of the query layer: space references in request bodies (bounded, one cache entry per space), `fit` labels
(ready tasks of the space), dry runs (no write lock), align under a tight matrix cap. Each failed before its fix."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atlas.services.queries import _cache_ref
from tests.service.conftest import wait_job

PROSE = [f"The {a} fox jumps over the {b} dog near the {c}." for a, b, c in
         [("quick", "lazy", "barn"), ("brown", "old", "road"), ("red", "small", "river"), ("grey", "big", "farm"),
          ("young", "tired", "hill"), ("wild", "sleepy", "fence")]]
PROMPT = "The calm fox jumps over the lazy cat."


def _add(http: httpx.Client, name: str, texts: list[str]) -> dict[str, Any]:
    body = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    r = http.post("/v1/tasks", data={"name": name, "mode": "text"}, files={"file": ("x.jsonl", body)})
    assert r.status_code == 202, r.text
    job = wait_job(http, r.json()["job"]["id"], timeout=120)
    return {"id": r.json()["task"]["id"], "status": job["status"]}


def _import_as_other_model(http: httpx.Client) -> list[int]:
    """Import the default space's export under another model fingerprint: a second space; its task ids."""
    lines = http.get("/v1/spaces/default/export").text.splitlines()
    header = json.loads(lines[0])
    header["space"].update(model_fingerprint="0123456789abcdef", model_name="other-model")
    raw = "".join(ln + "\n" for ln in [json.dumps(header), *lines[1:-1]]).encode()
    trailer = json.loads(lines[-1]) | {"sha256": hashlib.sha256(raw).hexdigest()}
    r = http.post("/v1/spaces/import", files={"file": ("x.jsonl", raw + (json.dumps(trailer) + "\n").encode())})
    assert r.status_code == 200, r.text
    items = http.get("/v1/tasks", params={"space": str(r.json()["space_id"])}).json()["items"]
    return [int(t["id"]) for t in items]


def test_space_reference_in_a_body_is_bounded_and_cached_once_per_space(serve, tiny_lm) -> None:
    """A 5,000-digit ``space`` was a 500 (int() digit limit in resolve_space); every spelling of a space that
    resolves ("01", "001", " Default", ...) added a cache entry for the process's lifetime."""
    svc = serve(lm=tiny_lm)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        _add(http, "prose", PROSE)
        long_ref = "0" * 5000 + "1"
        for path, body in (("/v1/route", {"prompt": PROMPT, "space": long_ref}),
                           ("/v1/route/fit", {"examples": [{"prompt": PROMPT, "label": "none"}], "space": long_ref})):
            r = http.post(path, json=body)
            assert r.status_code == 422 and r.json()["code"] == "invalid_input", r.text
        spellings = ["1", "01", "0001", "0" * 250 + "1", None, "default", " Default ", "DEFAULT", ""]
        for ref in spellings:
            r = http.post("/v1/route", json={"prompt": PROMPT, "space": ref})
            assert r.status_code == 200, (ref, r.text)
    assert set(svc.container.queries._space_keys) <= {"1", "default"}


@given(st.text(alphabet="0", max_size=40).map(lambda z: z + "7") | st.sampled_from(["7", "007"]),
       st.text(alphabet=" \t", max_size=3), st.sampled_from(["default", "DEFAULT", "Default", "dEfAuLt", ""]))
def test_cache_ref_is_one_key_per_space(digits: str, pad: str, default: str) -> None:
    assert _cache_ref(digits) == "7"
    assert _cache_ref(pad + default + pad) == _cache_ref(None) == "default"
    assert _cache_ref("my-model") == "my-model"


def test_fit_labels_must_name_ready_tasks_of_the_space(serve, tiny_lm) -> None:
    """A label naming (by id) a task of another space, or a failed task, was accepted: its prompts counted as
    wrongly answered and raised the answering task's threshold. Now 409 before any prompt is sketched."""
    svc = serve(lm=tiny_lm)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        prose = _add(http, "prose", PROSE)
        failed = _add(http, "short", ["a"])
        assert prose["status"] == "succeeded" and failed["status"] == "failed"
        other = _import_as_other_model(http)
        assert other and prose["id"] not in other
        for label in (other[0], failed["id"], "short"):
            r = http.post("/v1/route/fit", json={"examples": [{"prompt": PROMPT, "label": label}] * 5,
                                                 "dry_run": True})
            assert r.status_code == 409, (label, r.text)
            assert r.json()["code"] in ("incompatible_space", "not_ready")
        r = http.post("/v1/route/fit", json={"examples": [{"prompt": PROMPT, "label": "prose"},
                                                          {"prompt": PROMPT, "label": "nope"}]})
        assert r.status_code == 404, r.text  # named by its example (the CLI and the dashboard name its line)
        assert r.json()["message"] == "example 1: no task named 'nope'" and r.json()["detail"]["example"] == 1
        ok = http.post("/v1/route/fit", json={"examples": [{"prompt": PROMPT, "label": "prose"},
                                                           {"prompt": PROMPT, "label": prose["id"]}], "dry_run": True})
        assert ok.status_code == 200 and ok.json()["stored"] is False, ok.text
    from service.client import AtlasClient
    from service.client.errors import InvalidInput

    with AtlasClient(svc.url) as client:  # the labels file's lines as they are: mappings, like pairs
        as_dicts = client.fit([{"prompt": PROMPT, "label": "prose"}, {"prompt": PROMPT, "label": "none"}],
                              dry_run=True)
        as_pairs = client.fit([(PROMPT, "prose"), (PROMPT, "none")], dry_run=True)
        assert as_dicts == as_pairs
        for bad in ({"text": PROMPT, "label": "none"}, {"prompt": PROMPT}, PROMPT, (PROMPT, True), (None, "none")):
            with pytest.raises(InvalidInput, match="example 1: a labelled prompt is"):  # before anything is sent
                client.fit([(PROMPT, "none"), bad], dry_run=True)  # (it sent the mapping's keys: "no task 'label'")


def test_find_task_by_id_stays_in_the_space_asked_for(serve, tiny_lm) -> None:
    """``find_task("3", space=…)`` (what ``tasks delete 3 --space …`` calls) fell back to task id 3 of any space
    when the space had no task named "3": a delete could reach another space's task."""
    from service.client import AtlasClient
    from service.client.errors import NotFound

    svc = serve(lm=tiny_lm)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        prose = _add(http, "prose", PROSE)
        other = _import_as_other_model(http)
        other_space = http.get(f"/v1/tasks/{other[0]}").json()["space_id"]
    with AtlasClient(svc.url) as client:
        assert client.find_task(str(prose["id"])).id == prose["id"]  # no space: any id, as before
        assert client.find_task(str(prose["id"]), space="default").id == prose["id"]
        for ref in (str(prose["id"]), prose["id"]):
            with pytest.raises(NotFound):
                client.find_task(ref, space=str(other_space))
        assert client.find_task(str(other[0]), space=str(other_space)).id == other[0]


def test_dry_run_fit_does_not_take_the_write_lock(serve, tiny_lm) -> None:
    """A dry run stores nothing, yet it opened a write transaction: under another writer it waited for the busy
    timeout and answered 503."""
    svc = serve(lm=tiny_lm, db_busy_timeout_s=2.0)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        _add(http, "prose", PROSE)
        before = http.get("/v1/tasks/1/routing").json()
        db = svc.container.settings.resolved_database_url().split("///", 1)[1]
        con = sqlite3.connect(db, isolation_level=None, timeout=5)
        try:
            con.execute("BEGIN IMMEDIATE")
            t0 = time.monotonic()
            r = http.post("/v1/route/fit", json={"examples": [{"prompt": PROMPT, "label": "none"}] * 3,
                                                 "dry_run": True})
            took = time.monotonic() - t0
        finally:
            con.execute("ROLLBACK")
            con.close()
        assert r.status_code == 200 and r.json()["stored"] is False, r.text
        assert took < 2.0
        assert http.get("/v1/tasks/1/routing").json() == before


def test_align_under_a_tight_matrix_cap(serve, tiny_lm) -> None:
    """With ``max_matrix_tasks`` 1 the shrinkage context of ``/v1/align`` was asked for −1 neighbours: a 422
    "k must be at least 1" for a valid pair. The pair is now aligned without context."""
    svc = serve(lm=tiny_lm, max_matrix_tasks=1)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        a = _add(http, "prose", PROSE)["id"]
        b = _add(http, "code", [f"def f{i}(a, b):\n    return a {op} b\n" for i, op in enumerate("+-*/%&")])["id"]
        _add(http, "more", [t.replace("fox", "cat") for t in PROSE])
        for x, y in ((a, b), (a, a)):
            r = http.get("/v1/align", params={"a": x, "b": y})
            assert r.status_code == 200, r.text
            assert 0.0 <= r.json()["fisher"] <= 1.0


def test_route_and_routing_patch_refuse_values_that_meant_something_else(serve, tiny_lm) -> None:
    """``{"k": true}`` was taken as k = 1 and ``{"k": "3"}`` as 3; a PATCH of ``{"false_reject_rate": null}`` or
    ``{"novelty": null}`` answered 200 and changed nothing (a user could expect null to reset the rate, as it clears
    the override). Now 422 naming the field, nothing changed; ``threshold: null`` still clears the override."""
    svc = serve(lm=tiny_lm)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        prose = _add(http, "prose", PROSE)
        for body in ({"prompt": PROMPT, "k": True}, {"prompt": PROMPT, "k": "3"}, {"prompt": PROMPT, "k": 2.5},
                     {"prompt": PROMPT, "candidates": False}):
            r = http.post("/v1/route", json=body)
            assert r.status_code == 422 and r.json()["code"] == "invalid_input", (body, r.text)
        assert http.post("/v1/route", json={"prompt": PROMPT, "k": 2}).status_code == 200
        path = f"/v1/tasks/{prose['id']}/routing"
        assert http.patch(path, json={"threshold": 0.3, "false_reject_rate": 0.1}).status_code == 200
        before = http.get(path).json()
        for field in ("false_reject_rate", "novelty", "template"):
            r = http.patch(path, json={field: None})
            assert r.status_code == 422 and "only threshold takes null" in r.json()["message"], (field, r.text)
            assert r.json()["detail"][0]["loc"] == ["body", field], r.text  # the field, not the whole body
        assert http.get(path).json() == before
        # and the schema says so: a generated client that sends unset fields as null was refused by a body its
        # schema allowed (an API review, 2026-12-07)
        schema = http.get("/openapi.json").json()["components"]["schemas"]["ThresholdPatch"]["properties"]
        assert schema["threshold"]["anyOf"][1] == {"type": "null"}
        for field, kind in (("false_reject_rate", "number"), ("novelty", "boolean"), ("template", "boolean")):
            assert schema[field]["type"] == kind and "anyOf" not in schema[field] and "default" not in schema[field]
        cleared = http.patch(path, json={"threshold": None}).json()
        assert cleared["threshold_override"] is None and cleared["false_reject_rate"] == 0.1
        # a switch is a JSON boolean: "yes" and 1 were taken as true (200), as was a dry run of "yes"
        for body in ({"template": "yes"}, {"novelty": 1}, {"template": "false"}):
            r = http.patch(path, json=body)
            assert r.status_code == 422 and r.json()["code"] == "invalid_input", (body, r.text)
        r = http.post("/v1/route/fit", json={"examples": [{"prompt": PROMPT, "label": "prose"}], "dry_run": "yes"})
        assert r.status_code == 422, r.text
        assert http.get(path).json() == cleared
        # the empty prompt of a batch is named by its place; a missing task reads as everywhere else
        r = http.post("/v1/route", json={"prompts": [PROMPT, ""]})
        assert r.status_code == 422 and "prompts.1: the prompt is empty" in r.json()["message"], r.text
        assert r.json()["detail"][0]["loc"] == ["body", "prompts", 1], r.text  # the place, for a program to read
        r = http.patch("/v1/tasks/999999/routing", json={"threshold": 0.2})
        assert r.status_code == 404 and r.json()["message"] == "task 999999 does not exist", r.text


def test_clients_refuse_prompts_and_examples_of_the_wrong_kind(serve, tiny_lm, tiny_model_dir, tmp_path,
                                                               capsys) -> None:
    """The client routed a dict by its keys and bytes by their integers, and raised a TypeError on None (route and
    fit); the library's ``k="3"`` raised a TypeError from a slice; the CLI's ``--threshold nan`` said "is the service
    running there?"; an empty prompt in a ``fit`` labels file was not named by its line."""
    import numpy as np

    from atlas.errors import InvalidInput as AtlasInvalidInput
    from fisher_atlas import Atlas
    from service.cli import main
    from service.client import AtlasClient
    from service.client.errors import InvalidInput

    svc = serve(lm=tiny_lm)
    with AtlasClient(svc.url) as cl:
        cl.add_task("prose", samples=PROSE, wait=True)
        for bad, said in (({"a b c": 1}, "not dict"), (None, "not NoneType"), (b"a b c", "not bytes"),
                          (["a b c", 5], "prompt 1 is a int")):
            with pytest.raises(InvalidInput, match=said):
                cl.route(bad)  # type: ignore[arg-type]
        for bad in (None, "a b c", {"prompt": "a b c", "label": "prose"}):
            with pytest.raises(InvalidInput, match="examples are a list of labelled prompts"):
                cl.fit(bad)  # type: ignore[arg-type]
        assert cl.route(("a b c", PROMPT)).results[1].matches[0].name == "prose"  # a tuple is a batch still
        for batch in (np.array(["a b c", PROMPT]), (p for p in ["a b c", PROMPT])):  # any iterable of strings too
            assert cl.route(batch).results[1].matches[0].name == "prose", type(batch)  # type: ignore[arg-type]
    assert main(["route", PROMPT, "--threshold", "nan", "--url", svc.url]) == 1
    err = capsys.readouterr().err
    assert "NaN or infinite" in err and "is the service running" not in err, err
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"prompt": "a b c", "label": "none"}\n\n{"prompt": "", "label": "prose"}\n', encoding="utf-8")
    assert main(["fit", str(labels), "--dry-run", "--url", svc.url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fisher-atlas: {labels}:3: 422 invalid_input: prompt: "), err
    with Atlas(tmp_path / "lib", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("prose", PROSE, progress=False)
        for k in ("3", 2.5, True, 0):
            with pytest.raises(AtlasInvalidInput, match=r"k must be an integer in 1\.\.100"):
                atlas.route(PROMPT, k=k)  # type: ignore[arg-type]
        assert len(atlas.route(PROMPT, k=np.int64(1)).matches) == 1  # a NumPy integer is an integer
        assert len(atlas.route(np.array([PROMPT, "a b c"]))) == 2  # type: ignore[arg-type]
        with pytest.raises(AtlasInvalidInput, match="not a dict"):
            atlas.route({PROMPT: 1})  # type: ignore[arg-type]
        with pytest.raises(AtlasInvalidInput, match="examples are a list of labelled prompts, not NoneType"):
            atlas.fit(None)  # type: ignore[arg-type]


def test_a_proxy_s_401_without_the_service_s_body_still_gets_the_key_hint(capsys) -> None:
    """Hints go by the service's error code; a 401 or 403 from a proxy (no JSON body: code ``http_error``) lost its
    hint when they stopped going by status."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from service.cli import main

    class Proxy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(401)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>401 Authorization Required</html>")

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert main(["route", PROMPT, "--url", f"http://127.0.0.1:{server.server_address[1]}"]) == 1
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert "401 http_error" in err and "pass a key with --api-key" in err, err


def test_json_bodies_and_the_schema_agree_with_what_the_server_does(serve, tiny_lm) -> None:
    """An API review (2026-12-07) of the schema against the server: a form-encoded or undeclared body of a JSON
    endpoint answered 422 "Input should be a valid dictionary" (now 415, as uploads answer); ``task_ids: [0]`` was
    refused by a check the schema did not state (now its bound, with the item's place); two operations documented
    their 422 as FastAPI's ``HTTPValidationError`` though every 422 is an error body; a body's 413 was documented on
    some operations only."""
    svc = serve(lm=tiny_lm)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        for headers in ({"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain"}, {}):
            r = http.post("/v1/route", content=b'{"prompt": "hello there"}', headers=headers)
            assert r.status_code == 415 and r.json()["code"] == "unsupported_media_type", (headers, r.text)
        r = http.post("/v1/route", content=b'{"prompt": "hello there"}',
                      headers={"content-type": "application/json; charset=utf-8"})
        assert r.status_code == 200, r.text
        # a 405 names every method of the path (the first route's alone: OPTIONS /v1/tasks said "Allow: POST")
        for method, path, allowed in (("OPTIONS", "/v1/tasks", "GET, POST"), ("DELETE", "/v1/route", "POST"),
                                      ("PUT", "/v1/tasks/1/routing", "GET, PATCH")):
            r = http.request(method, path)
            assert r.status_code == 405 and r.headers["allow"] == allowed, (method, path, r.headers.get("allow"))
        for bad in (0, -1, 2**53):
            r = http.post("/v1/align/matrix", json={"task_ids": [bad]})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "task_ids", 0], (bad, r.text)
        schema = http.get("/openapi.json").json()
    assert "HTTPValidationError" not in json.dumps(schema)
    items = schema["components"]["schemas"]["AlignMatrixRequest"]["properties"]["task_ids"]["items"]
    assert items["minimum"] == 1 and items["maximum"] == 2**53 - 1
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if "422" in op["responses"]:
                assert op["responses"]["422"]["content"]["application/json"]["schema"] == error_body, (method, path)
            for status in ("429", "503"):  # the header every such answer carries
                if status in op["responses"] and path.startswith("/v1"):
                    assert "Retry-After" in op["responses"][status].get("headers", {}), (method, path, status)
            if "requestBody" in op:
                assert "413" in op["responses"], (method, path)
                if list(op["requestBody"]["content"]) == ["application/json"]:
                    assert "415" in op["responses"], (method, path)
