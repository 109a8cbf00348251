"""The REST API over real HTTP with a tiny model: task lifecycle, queries, jobs, export/import, metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.client import AsyncAtlasClient, AtlasClient, AtlasClientError

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "A lazy dog sleeps in the sun while the fox runs.",
    "The brown fox and the dog are friends in the story.",
    "Every morning the fox jumps over the fence by the road.",
    "The dog barks at the quick fox near the old barn.",
    "In the evening the fox returns to the forest quietly.",
]
CODE = [
    "def add(a, b):\n    return a + b\n",
    "def sub(a, b):\n    return a - b\n",
    "def mul(a, b):\n    return a * b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x):\n        self.x = x\n",
    "import os\nprint(os.getcwd())\n",
]
SMILES = ["CC(=O)OC1=CC=CC=C1C(=O)O", "c1ccccc1O", "CCO", "CCN(CC)CC", "C1CCCCC1", "CC(C)CC(=O)O"]
QA = [
    ("Question: is the sky blue? Answer:", " yes"),
    ("Question: is fire cold? Answer:", " no"),
    ("Question: is water wet? Answer:", " yes"),
    ("Question: is the sun dark? Answer:", " no"),
]


def _files(tmp: Path) -> dict[str, Path]:
    out = {}
    p = tmp / "prose.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in PROSE))
    out["prose"] = p
    p = tmp / "code.csv"
    import csv

    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text"])
        for t in CODE:
            w.writerow([t])
    out["code"] = p
    p = tmp / "smiles.txt"
    p.write_text("\n".join(SMILES) + "\n")
    out["smiles"] = p
    p = tmp / "qa.parquet"
    pq.write_table(pa.table({"prompt": [q for q, _ in QA], "completion": [a for _, a in QA]}), p)
    out["qa"] = p
    return out


def test_task_lifecycle_queries_and_export_import(serve, tiny_lm, tmp_path: Path) -> None:
    svc = serve(lm=tiny_lm)
    files = _files(tmp_path)
    with AtlasClient(svc.url) as c:
        assert c.health().status == "ok"
        assert c.ready().ready
        created = {}
        for name, path in files.items():
            mode = "completion" if name == "qa" else "text"
            r = c.add_task(name, path, mode=mode, metadata={"domain": name, "owner": "me"})
            assert r.task.status == "pending" and r.job.status in ("queued", "running", "succeeded")
            created[name] = r
        for name, r in created.items():
            job = c.wait_job(r.job.id, timeout=120)
            assert job.status == "succeeded", (name, job.error)
            assert job.progress.samples_done == job.progress.samples_total > 0
        ids = {name: r.task.id for name, r in created.items()}
        task = c.get_task(ids["qa"])
        assert task.status == "ready" and task.mode == "completion" and task.n_tokens > 0

        # listing: filters and pagination
        page = c.list_tasks()
        assert page.total == 4 and [t.name for t in page.items] == ["prose", "code", "smiles", "qa"]
        assert [t.name for t in c.list_tasks(limit=2, offset=2).items] == ["smiles", "qa"]
        assert [t.name for t in c.list_tasks(name_prefix="co").items] == ["code"]
        assert c.list_tasks(name="smiles").items[0].id == ids["smiles"]
        assert c.list_tasks(status="pending").total == 0

        # metadata patch: merge, null removes
        patched = c.patch_task(ids["prose"], {"owner": None, "lang": "en"})
        assert patched.metadata == {"domain": "prose", "lang": "en"}

        # routing: single and batch, Server-Timing splits forward and search
        resp = httpx.post(f"{svc.url}/v1/route", json={"prompts": ["The lazy fox jumps.", "CCOC"], "k": 2})
        assert resp.status_code == 200, resp.text
        assert "forward;dur=" in resp.headers["server-timing"] and "search;dur=" in resp.headers["server-timing"]
        body = resp.json()
        assert len(body["results"]) == 2 and body["matches"] == body["results"][0]["matches"]
        for res in body["results"]:
            assert len(res["matches"]) == 2
            scores = [m["score"] for m in res["matches"]]
            assert scores == sorted(scores, reverse=True)
            assert set(res["matches"][0]) >= {"task_id", "name", "score", "faiss_score", "activation", "error"}
        never = c.route("The lazy fox jumps.", k=1, threshold=1.0)
        assert never.none is (never.best_score < 1.0) and never.threshold == 1.0

        # recommendation, pair, matrix, atlas
        src = c.sources(ids["prose"], k=3)
        assert src.target.task_id == ids["prose"] and src.compared == 3 and len(src.sources) == 3
        assert ids["prose"] not in [s.task_id for s in src.sources]
        shrunk = [s.fisher_shrunk for s in src.sources]
        assert shrunk == sorted(shrunk, reverse=True)
        pair = c.align(ids["prose"], ids["code"])
        assert pair.a.name == "prose" and pair.b.name == "code" and isinstance(pair.activation_dark, bool)
        mat = c.align_matrix([ids["prose"], ids["code"], ids["smiles"]])
        assert mat.ids == [ids["prose"], ids["code"], ids["smiles"]]
        assert all(abs(mat.fisher[i][i] - 1.0) < 1e-6 for i in range(3))
        assert abs(mat.fisher[0][1] - mat.fisher[1][0]) < 1e-9
        assert abs(mat.fisher[0][1] - pair.fisher) < 1e-6
        # ids from NumPy (a DataFrame's column): integers, as httpx sent them before the client checked ids
        assert c.align(np.int64(ids["prose"]), ids["code"]).fisher == pair.fisher
        assert c.align_matrix(np.array([ids["prose"], ids["code"], ids["smiles"]])).ids == mat.ids
        atlas = c.atlas()
        assert {p.name for p in atlas.points} == set(ids) and atlas.total == 4 and not atlas.sampled
        assert atlas.points == c.atlas().points  # deterministic

        # open-set append: merged into the task, searchable at once
        before = c.get_task(ids["smiles"])
        job = c.append(ids["smiles"], samples=[{"text": "CC(C)O"}, {"text": "CCCCCC"}], wait=True)
        assert job.status == "succeeded" and job.kind == "append"
        after = c.get_task(ids["smiles"])
        assert after.version == before.version + 1 and after.n_samples == before.n_samples + 2

        # the progress stream of a finished job: one progress event, then the end
        events = list(c.job_events(job.id))
        assert events and events[-1].status == "succeeded"
        with httpx.stream("GET", f"{svc.url}/v1/jobs/{job.id}/events") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            text = r.read().decode()
        assert "event: progress" in text and "event: end" in text

        # export, then import into a fresh service: identical answers
        blob = c.export_space()
        probe = ["The lazy fox jumps.", "def f(x):\n    return x", "CCO"]
        routes_before = [[(m.name, round(m.score, 9)) for m in res.matches] for res in c.route(probe, k=4).results]
        align_before = c.align(ids["prose"], ids["qa"])
        src_before = [(s.name, round(s.fisher_shrunk, 9)) for s in c.sources(ids["qa"], k=3).sources]

        # delete: gone from the store and the index
        c.delete_task(ids["code"])
        with pytest.raises(AtlasClientError) as exc:
            c.get_task(ids["code"])
        assert exc.value.status == 404 and exc.value.code == "not_found"
        assert all(m.task_id != ids["code"] for m in c.route("def f(x):\n    return x", k=4).matches)
        assert c.list_tasks().total == 3

    other = serve(lm=tiny_lm)
    with AtlasClient(other.url) as c2:
        res = c2.import_space(blob)
        assert res.imported == 4 and res.skipped == []
        names = {t.name: t.id for t in c2.list_tasks().items}
        routes_after = [[(m.name, round(m.score, 9)) for m in r.matches] for r in c2.route(probe, k=4).results]
        assert routes_after == routes_before
        a2 = c2.align(names["prose"], names["qa"])
        assert (a2.fisher, a2.activation, a2.error, a2.rho) == (
            align_before.fisher, align_before.activation, align_before.error, align_before.rho)
        assert [(s.name, round(s.fisher_shrunk, 9)) for s in c2.sources(names["qa"], k=3).sources] == src_before
        # importing again: conflicts fail as a whole, or are skipped
        with pytest.raises(AtlasClientError) as exc:
            c2.import_space(blob)
        assert exc.value.status == 409
        assert c2.import_space(blob, on_conflict="skip").skipped == sorted(names, key=list(names).index)
        # a malformed export is a 422 with nothing stored, never a 5xx
        header, first = blob.decode().splitlines()[:2]
        bad_counts = json.loads(first) | {"name": "bad-counts", "n_samples": "x"}
        bad_space = json.loads(header)
        bad_space["space"]["model_fingerprint"] = "f" * 201
        for broken in ("\n".join([header, json.dumps(bad_counts)]), "\n".join([json.dumps(bad_space), first])):
            with pytest.raises(AtlasClientError) as exc:
                c2.import_space(broken.encode())
            assert exc.value.status == 422 and exc.value.code == "invalid_input", exc.value.message
        assert c2.list_tasks().total == len(names)

    metrics = httpx.get(f"{svc.url}/metrics").text
    for name in ("fisher_atlas_search_seconds_bucket", "fisher_atlas_prompt_forward_seconds_count",
                 "fisher_atlas_job_duration_seconds_count", "fisher_atlas_job_tokens_per_second",
                 "fisher_atlas_queue_depth", "fisher_atlas_http_request_duration_seconds_bucket"):
        assert name in metrics, name
    # one observation per route request (the forward histogram was declared and never observed: always 0)
    routes = re.search(r'^fisher_atlas_http_requests_total\{method="POST",route="/v1/route",status="200"\} (\S+)$',
                       metrics, re.M)
    forward = re.search(r"^fisher_atlas_prompt_forward_seconds_count (\S+)$", metrics, re.M)
    assert routes is not None and forward is not None and float(forward.group(1)) == float(routes.group(1)) >= 1
    # the state cache's counters: routing and comparing read task states through it
    cache = {m.group(1): float(m.group(2)) for m in re.finditer(r"^fisher_atlas_state_cache_(\w+) (\S+)$", metrics,
                                                                re.M)}
    assert cache["hits_total"] >= 1 and cache["misses_total"] >= 1 and cache["evictions_total"] == 0, cache
    assert 1 <= cache["entries"] <= len(names) and 0 < cache["bytes"] <= cache["max_bytes"], cache


def test_errors_share_one_body(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm)
    cases = [
        ("GET", "/nope", None, 404, "not_found"),
        ("DELETE", "/v1/route", None, 405, "method_not_allowed"),
        ("POST", "/v1/route", {"prompt": "a", "prompts": ["b"]}, 422, "invalid_input"),
        ("POST", "/v1/route", {"k": 3}, 422, "invalid_input"),
        ("GET", "/v1/tasks/abc", None, 422, "invalid_input"),
        ("GET", "/v1/tasks/999", None, 404, "not_found"),
        ("GET", "/v1/jobs/999", None, 404, "not_found"),
        ("GET", "/v1/align?a=1", None, 422, "invalid_input"),
        ("POST", "/v1/align/matrix", {"task_ids": []}, 422, "invalid_input"),
        ("POST", "/v1/align/matrix", {"task_ids": [True, 2]}, 422, "invalid_input"),  # true was task 1
        ("POST", "/v1/align/matrix", {"task_ids": [1.0, 2]}, 422, "invalid_input"),
        ("POST", "/v1/align/matrix", {"task_ids": ["1", 2]}, 422, "invalid_input"),
        ("GET", "/v1/spaces/999/export", None, 404, "not_found"),
    ]
    for method, path, body, status, code in cases:
        r = httpx.request(method, svc.url + path, json=body)
        assert r.status_code == status, (path, r.text)
        data = r.json()
        assert set(data) == {"code", "message", "detail"} and data["code"] == code, (path, data)
    r = httpx.post(f"{svc.url}/v1/route", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_input"
    r = httpx.post(f"{svc.url}/v1/align/matrix", json={"task_ids": [3, 1, 3, 2, 1]})  # named: it said only "distinct"
    assert r.status_code == 422 and "task 1, task 3 are given more than once" in r.json()["message"], r.text


def test_cancel_a_queued_job(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    with AtlasClient(svc.url) as c:
        created = c.add_task("t", samples=[{"text": t} for t in PROSE])
        assert created.job.status == "queued"
        job = c.cancel_job(created.job.id)
        assert job.status == "cancelled"
        assert c.get_task(created.task.id).status == "failed"
        assert c.wait_job(created.job.id, timeout=10).status == "cancelled"
        # a task that is not ready answers 409 not_ready to queries
        with pytest.raises(AtlasClientError) as exc:
            c.sources(created.task.id)
        # it never will have a signature: the message says so and what to do ("has no signature yet" waited)
        assert exc.value.code == "not_ready" and "failed" in exc.value.message, exc.value
        assert "delete it and add it again" in exc.value.message, exc.value
        assert exc.value.status == 409 and exc.value.code == "not_ready"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_async_client(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm)
    async with AsyncAtlasClient(svc.url) as c:
        assert (await c.health()).status == "ok"
        created = await c.add_task("prose", samples=[{"text": t} for t in PROSE], wait=True)
        assert created.job.status == "succeeded" and created.task.status == "ready"
        res = await c.route(["The fox.", "The dog."], k=1)
        assert [r.matches[0].name for r in res.results] == ["prose", "prose"]
        assert (await c.list_tasks()).total == 1
        blob = await c.export_space()
        assert blob.startswith(b'{"format": "fisher-atlas-space"')


def test_idempotency_key_replays_the_first_answer(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm, overrides={"start_runner": False}, max_queued_jobs=1)
    body = {"name": "once", "samples": [{"text": t} for t in PROSE]}
    headers = {"Idempotency-Key": "req-1"}
    first = httpx.post(f"{svc.url}/v1/tasks", json=body, headers=headers)
    again = httpx.post(f"{svc.url}/v1/tasks", json=body, headers=headers)  # the queue is full now: still 202
    assert first.status_code == again.status_code == 202, again.text
    assert first.json()["task"]["id"] == again.json()["task"]["id"]
    assert first.json()["job"]["id"] == again.json()["job"]["id"]
    other = httpx.post(f"{svc.url}/v1/tasks", json={**body, "name": "other"}, headers=headers)
    assert other.status_code == 409 and other.json()["code"] == "conflict"
    assert httpx.get(f"{svc.url}/v1/tasks").json()["total"] == 1


def _wait_ok(http: httpx.Client, job_id: int) -> None:
    """Wait for a job to succeed (the client's progress stream, polling as fallback)."""
    with AtlasClient(str(http.base_url)) as client:
        assert client.wait_job(job_id, timeout=120).status == "succeeded"


def test_matrix_and_atlas_read_their_writes_after_an_append(serve, tiny_lm) -> None:
    """/v1/align/matrix and /v1/atlas read states through the state cache like every query, and must catch it
    up first (they served the state from before an append for up to a second after its job ended)."""
    svc = serve(lm=tiny_lm)
    texts = {"prose": ["The fox ran over the hill.", "A quiet river runs to the sea.", "Birds sang at dawn."],
             "code": ["def f(x):\n    return x + 1\n", "for i in range(3):\n    print(i)\n", "x = [1, 2, 3]\n"]}
    with httpx.Client(base_url=svc.url, timeout=120) as http:
        ids = []
        for name, samples in texts.items():
            r = http.post("/v1/tasks", json={"name": name, "samples": [{"text": t} for t in samples]})
            ids.append(r.json()["task"]["id"])
            _wait_ok(http, r.json()["job"]["id"])
        extra = ["Snow fell on the quiet town.", "She read the letter twice.", "The ship left at noon."]
        for i, text in enumerate(extra):
            http.post("/v1/align/matrix", json={"task_ids": ids})  # the cache is warm
            http.get("/v1/atlas")
            r = http.post(f"/v1/tasks/{ids[0]}/samples", json={"samples": [{"text": text}]})
            _wait_ok(http, r.json()["job"]["id"])
            matrix = http.post("/v1/align/matrix", json={"task_ids": ids}).json()
            pair = http.get("/v1/align", params={"a": ids[0], "b": ids[1]}).json()  # catches up first
            assert matrix["fisher"][0][1] == pytest.approx(pair["fisher"], abs=1e-6), i
