"""Limits answer with their documented codes and store nothing; API-key scopes are enforced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from atlas import apikeys
from atlas.models import ApiKey, Job, Task, Upload
from atlas.settings import Settings
from service.client import AtlasClient, AtlasClientError


def _counts(container) -> tuple[int, int, int]:
    with container.store.read() as s:
        return tuple(int(s.execute(select(func.count()).select_from(m)).scalar_one()) for m in (Task, Job, Upload))


def _upload(url: str, name: str, content: bytes, filename: str = "t.jsonl", **form: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/tasks", data={"name": name, **form}, files={"file": (filename, content)})


def _chunked_upload(lines: int) -> Iterator[bytes]:
    """A multipart task upload sent in chunks (no Content-Length): a name, then a file of ``lines`` 1 kB lines."""
    boundary = b"--b0undary\r\n"
    yield boundary + b'Content-Disposition: form-data; name="name"\r\n\r\nchunked\r\n'
    yield boundary + b'Content-Disposition: form-data; name="file"; filename="t.txt"\r\n\r\n'
    for _ in range(lines):
        yield b"z" * 1000 + b"\n"
    yield b"\r\n--b0undary--\r\n"


def test_limits_use_documented_codes_and_store_nothing(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm, max_upload_bytes=4000, max_samples=5, max_sample_chars=60, max_prompt_chars=40,
                max_queued_jobs=2, overrides={"start_runner": False})
    url = svc.url

    def lines(n: int, text: str = "hello world") -> bytes:
        return "".join(json.dumps({"text": f"{text} {i}"}) + "\n" for i in range(n)).encode()

    rejected = [
        # (response, status, code)
        (_upload(url, "big", b"x" * 5000, "t.txt"), 413, "payload_too_large"),
        (_upload(url, "many", lines(6)), 413, "payload_too_large"),
        (_upload(url, "long", lines(1, "y" * 61)), 413, "payload_too_large"),
        (_upload(url, "bad-json", b'{"text": "a"}\n{oops\n'), 422, "invalid_input"),
        (_upload(url, "bad-field", b'{"txt": "a"}\n'), 422, "invalid_input"),
        (_upload(url, "bad-utf8", b"\xff\xfe\x00bad", "t.txt"), 422, "invalid_input"),
        (_upload(url, "bad-mode", lines(1), mode="other"), 422, "invalid_input"),
        (_upload(url, "bad-meta", lines(1), metadata="[1, 2]"), 422, "invalid_input"),
        (_upload(url, "empty", b"\n\n", "t.txt"), 422, "invalid_input"),
        (_upload(url, "pairs-as-text", b"a\nb\n", "t.txt", mode="completion"), 422, "invalid_input"),
        (httpx.post(f"{url}/v1/tasks", data={"name": "no-file"}), 422, "invalid_input"),
        (httpx.post(f"{url}/v1/tasks", json={"name": "j", "samples": [{"text": "a"}] * 6}), 413, "payload_too_large"),
        (httpx.post(f"{url}/v1/tasks", json={"name": "j", "samples": []}), 422, "invalid_input"),
        (httpx.post(f"{url}/v1/tasks", json={"name": "j", "mode": "completion", "samples": [{"text": "a"}]}), 422,
         "invalid_input"),
        (httpx.post(f"{url}/v1/tasks", content=b"name=x", headers={"content-type": "text/plain"}), 415,
         "unsupported_media_type"),
        (httpx.post(f"{url}/v1/route", json={"prompt": "z" * 41}), 413, "payload_too_large"),
        (httpx.post(f"{url}/v1/route", json={"prompt": "ok", "k": 0}), 422, "invalid_input"),
    ]

    # A chunked body (no Content-Length) is cut off while it streams.
    rejected.append((httpx.post(f"{url}/v1/tasks", content=_chunked_upload(100),
                                headers={"content-type": "multipart/form-data; boundary=b0undary"}),
                     413, "payload_too_large"))
    for resp, status, code in rejected:
        assert resp.status_code == status, (resp.request.url, resp.text)
        body = resp.json()
        assert body["code"] == code and body["message"], body
    assert _counts(svc.container) == (0, 0, 0), "a rejected upload left rows behind"

    # A full queue answers 429 before anything is stored (the runner is off: jobs stay queued).
    assert _upload(url, "q1", lines(2)).status_code == 202
    assert _upload(url, "q2", lines(2)).status_code == 202
    full = _upload(url, "q3", lines(2))
    assert full.status_code == 429 and full.json()["code"] == "queue_full"
    assert "retry-after" in full.headers
    assert _counts(svc.container) == (2, 2, 1)  # identical samples share one content-addressed upload
    # Another model's leftover queued jobs (no worker of it runs) count toward that model's queue only: they
    # filled the one cluster-wide count and refused every upload.
    other = _other_models_queued_jobs(svc.container, 3)
    with AtlasClient(url) as c:
        c.cancel_job(c.list_tasks(name="q1").items[0].id)
    assert _upload(url, "q4", lines(2)).status_code == 202
    assert _upload(url, "q5", lines(2)).status_code == 429
    _delete_tasks(svc.container, other)
    # a duplicate name is a conflict, also storing nothing
    with AtlasClient(url) as c:
        c.cancel_job(c.list_tasks(name="q4").items[0].id)
        dup = _upload(url, "q2", lines(3))
        assert dup.status_code == 409 and dup.json()["code"] == "conflict"
    assert _counts(svc.container)[0] == 3


def _other_models_queued_jobs(container, n: int) -> list[int]:
    """``n`` queued create jobs in a space of another model (its tasks' ids)."""
    from atlas import repository
    from atlas.samples import Sample

    with container.store.write.begin() as s:
        space = repository.get_or_create_space(
            s, model_fingerprint="another-model", spec_fingerprint="spec-m64", model_name="another", d=8, K=16,
            m=64, seed=0, spec={"d": 8, "K": 16, "m": 64, "seed": 0})
        return [int(repository.create_task_with_job(s, space.id, f"other-{i}", "text", {}, [Sample(text="a b")])[0].id)
                for i in range(n)]


def _delete_tasks(container, task_ids: list[int]) -> None:
    from atlas import repository

    with container.store.write.begin() as s:
        for t in task_ids:
            repository.delete_task(s, t)


def test_model_not_loaded_answers_503(serve) -> None:
    svc = serve(lm=None)
    ready = httpx.get(f"{svc.url}/readyz")
    assert ready.status_code == 503 and ready.json()["checks"]["model"] is False
    assert httpx.get(f"{svc.url}/healthz").status_code == 200
    r = httpx.post(f"{svc.url}/v1/route", json={"prompt": "hello"})
    assert r.status_code == 503 and r.json()["code"] == "model_unavailable"
    r = httpx.post(f"{svc.url}/v1/tasks", json={"name": "t", "samples": [{"text": "a b c"}]})
    assert r.status_code == 503 and r.json()["code"] == "model_unavailable"
    assert httpx.get(f"{svc.url}/v1/tasks").json()["total"] == 0


def test_a_model_that_fails_to_load_still_starts_the_service(serve, tmp_path: Path) -> None:
    svc = serve(model=str(tmp_path / "no-such-model"))
    ready = httpx.get(f"{svc.url}/readyz").json()
    assert ready["ready"] is False and "no-such-model" in ready["detail"]["model"]
    assert httpx.post(f"{svc.url}/v1/route", json={"prompt": "hi"}).status_code == 503


def test_scopes_are_enforced(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm, require_keys=True)
    with svc.container.store.session() as s:
        _, read = apikeys.create_api_key(s, "r", ["read"])
        _, write = apikeys.create_api_key(s, "w", ["write"])
        _, admin = apikeys.create_api_key(s, "a", ["admin"])
        revoked_row, revoked = apikeys.create_api_key(s, "x", ["admin"])
    with svc.container.store.session() as s:
        apikeys.revoke_api_key(s, revoked_row.id)
    with svc.container.store.read() as s:  # stored hashed, never in plaintext
        hashes = set(s.execute(select(ApiKey.key_hash)).scalars())
    assert read not in hashes and apikeys.hash_key(read) in hashes

    url = svc.url
    sample = {"name": "t", "samples": [{"text": "hello world, hello fox"}]}

    def call(method: str, path: str, key: str | None, bearer: bool = False, **kw) -> int:
        headers = {}
        if key:
            headers = {"Authorization": f"Bearer {key}"} if bearer else {"X-API-Key": key}
        return httpx.request(method, url + path, headers=headers, **kw).status_code

    assert call("GET", "/healthz", None) == 200 and call("GET", "/readyz", None) == 200
    assert call("GET", "/metrics", None) == 200
    r = httpx.get(f"{url}/v1/tasks")
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    assert call("GET", "/v1/tasks", "fa_wrong") == 401
    assert call("GET", "/v1/tasks", revoked) == 401
    assert call("GET", "/v1/tasks", read) == 200
    assert call("GET", "/v1/tasks", read, bearer=True) == 200
    r = httpx.post(f"{url}/v1/tasks", json=sample, headers={"X-API-Key": read})
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    assert call("POST", "/v1/tasks", write, json=sample) == 202
    assert call("GET", "/v1/tasks", write) == 200  # write implies read
    # the refused requests are counted by their route (answered before routing, they were all "unmatched": an
    # operations review, 2026-12-07), the dashboard's by its mount; a path no route has stays "unmatched"
    assert call("GET", "/dashboard/", None) == 200 and call("GET", "/no/such/path", read) == 404
    counted = "\n".join(ln for ln in httpx.get(f"{url}/metrics").text.splitlines()
                        if ln.startswith("fisher_atlas_http_requests_total{"))
    assert 'fisher_atlas_http_requests_total{method="GET",route="/v1/tasks",status="401"} 3.0' in counted, counted
    assert 'route="/dashboard",status="200"' in counted
    assert 'route="unmatched",status="401"' not in counted and 'route="unmatched",status="404"' in counted
    # fit: a dry run stores nothing and routes prompts, so a read key may preview (it was 403); storing needs write
    fit = {"examples": [{"prompt": "hello world, hello fox", "label": "none"}] * 2}
    assert call("POST", "/v1/route/fit", read, json={**fit, "dry_run": True}) == 200
    r = httpx.post(f"{url}/v1/route/fit", json=fit, headers={"X-API-Key": read})
    assert r.status_code == 403 and r.json()["code"] == "forbidden" and "'write'" in r.json()["message"]
    assert call("POST", "/v1/route/fit", write, json=fit) == 200
    assert call("GET", "/v1/keys", write) == 403
    assert call("GET", "/v1/keys", admin) == 200
    created = httpx.post(f"{url}/v1/keys", json={"name": "new", "scopes": ["read"]}, headers={"X-API-Key": admin})
    assert created.status_code == 201 and created.json()["key"].startswith("fa_")
    assert call("GET", "/v1/tasks", created.json()["key"]) == 200
    assert call("DELETE", f"/v1/keys/{created.json()['id']}", admin) == 204
    assert call("GET", "/v1/tasks", created.json()["key"]) == 401
    # who the caller is (the dashboard disables write controls for a read key): any valid key, its own scopes
    for key, name, scopes in ((read, "r", ["read"]), (write, "w", ["write"]), (admin, "a", ["admin"])):
        got = httpx.get(f"{url}/v1/keys/current", headers={"X-API-Key": key})
        assert got.status_code == 200 and got.json()["name"] == name and got.json()["scopes"] == scopes, got.text
        assert isinstance(got.json()["key_id"], int)
    assert call("GET", "/v1/keys/current", None) == 401 and call("GET", "/v1/keys/current", revoked) == 401
    with AtlasClient(url, api_key=read) as c:
        assert c.current_key().scopes == ["read"]
        assert c.list_tasks().total == 1
        with pytest.raises(AtlasClientError) as exc:
            c.delete_task(1)
        assert exc.value.status == 403


def test_non_loopback_bind_needs_keys(tmp_path: Path) -> None:
    from service.auth import check_bind_allowed
    from service.cli import main

    s = Settings(data_dir=tmp_path, host="0.0.0.0")
    with pytest.raises(RuntimeError, match="keys create"):
        check_bind_allowed(s, 0)
    check_bind_allowed(s, 1)
    with pytest.raises(RuntimeError):
        check_bind_allowed(Settings(data_dir=tmp_path, host="0.0.0.0", require_keys=False), 1)
    check_bind_allowed(Settings(data_dir=tmp_path, host="127.0.0.1"), 0)
    # the CLI refuses before loading anything
    assert main(["serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path / "d")]) == 1


def test_a_large_upload_past_the_limit_is_answered_413_not_a_dropped_connection(serve, tiny_lm, tmp_path: Path) -> None:
    """An HTTP/1.1 client sends its whole body before it reads the answer. The 413 was sent with the body unread
    and the connection closed, so a body larger than the socket buffers met a reset: the client and the CLI said
    the service was unreachable. The refused body is now read and dropped first (up to a bound)."""
    from service.client import PayloadTooLarge

    svc = serve(lm=tiny_lm, max_upload_bytes=100_000, overrides={"start_runner": False})
    big = tmp_path / "big.txt"
    big.write_bytes(b"a line of text\n" * 1_400_000)  # 21 MB
    with AtlasClient(svc.url) as c, pytest.raises(PayloadTooLarge):
        c.add_task("big", big)

    resp = httpx.post(f"{svc.url}/v1/tasks", content=_chunked_upload(20_000),  # no Content-Length
                      headers={"content-type": "multipart/form-data; boundary=b0undary"})
    assert resp.status_code == 413 and resp.json()["code"] == "payload_too_large"
    assert _counts(svc.container) == (0, 0, 0)

    # A client that asks first (Expect: 100-continue, as curl does past 1 MiB) is refused before it sends its
    # body: reading the body to drain it would answer "100 Continue" and invite the whole upload.
    import socket
    from urllib.parse import urlsplit

    host = urlsplit(svc.url)
    with socket.create_connection((host.hostname, host.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=x\r\n"
                     b"Content-Length: 21000000\r\nExpect: 100-continue\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 413")


def test_a_progress_stream_ends_when_its_key_is_revoked(serve, tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    """``/v1/jobs/{id}/events`` checked the key once: a key revoked while it streamed kept receiving the job's
    progress until the job ended (hours for a large upload)."""
    import service.routes.jobs as jobs_route

    monkeypatch.setattr(jobs_route, "KEY_RECHECK_S", 0.3)
    svc = serve(lm=tiny_lm, require_keys=True, overrides={"start_runner": False})  # the job stays queued
    with svc.container.store.session() as s:
        reader, read = apikeys.create_api_key(s, "r", ["read"])
        _, write = apikeys.create_api_key(s, "w", ["write"])
    r = httpx.post(f"{svc.url}/v1/tasks", json={"name": "t", "samples": [{"text": "hello world"}]},
                   headers={"X-API-Key": write})
    assert r.status_code == 202, r.text
    events: list[str] = []
    with httpx.stream("GET", f"{svc.url}/v1/jobs/{r.json()['job']['id']}/events", headers={"X-API-Key": read},
                      timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("event:"):
                events.append(line.split(":", 1)[1].strip())
                if events == ["progress"]:  # streaming: revoke the key now
                    with svc.container.store.session() as s:
                        apikeys.revoke_api_key(s, reader.id)
            if line.startswith("data:") and events[-1] == "end":
                assert json.loads(line.split(":", 1)[1])["key_revoked"] is True
                break
    assert events == ["progress", "end"]


def test_a_client_that_leaves_mid_upload_is_no_server_error(serve, tiny_lm, caplog) -> None:
    """A client closing the connection mid-body was logged as "unhandled error" with a traceback (a 500 nobody
    read); it is one info line now, and nothing is stored."""
    import logging
    import socket
    import time

    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    host, port = svc.url.removeprefix("http://").split(":")
    body = b'{"name": "gone", "samples": [{"text": "hello there"}'
    with caplog.at_level(logging.INFO, logger="fisher_atlas.service"):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n" + body)
            time.sleep(0.5)
        deadline = time.monotonic() + 10
        while not any("client disconnected" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.1)
    assert not any("unhandled error" in r.getMessage() for r in caplog.records)
    assert _counts(svc.container) == (0, 0, 0)
