"""Findings of the security review, each reproduced against a real service (``bind``: a real uvicorn server).

1. ``allowed_origins=["*"]`` without keys required made any web page an anonymous admin: refused at start.
2. A reverse proxy on the same host made every outside client look local (anonymous admin): a request
   carrying a proxy header needs a key.
3. Behind a TLS-terminating proxy the dashboard's own writes (``Origin: https://host``) were refused.
4. Behind ``--root-path`` an import was held to the upload limit; a 413 reported the limit plus the multipart
   envelope under the setting's name.
5. A plaintext bootstrap admin key showed its first 10 characters as its listed ``prefix``.
6. Progress streams were unbounded: a cap per client and in total (429 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from atlas import apikeys
from atlas.models import ApiKey
from atlas.settings import Settings
from service.app import create_app
from tests.service.test_security import bind  # noqa: F401  (fixture)

SAMPLES = {"name": "t", "mode": "text", "samples": [{"text": "hello world"}, {"text": "good night moon"}]}
PROXY_HEADERS = [{"X-Forwarded-For": "203.0.113.9"}, {"Forwarded": "for=203.0.113.9;proto=https"},
                 {"X-Forwarded-Host": "atlas.example.com"}, {"X-Real-IP": "203.0.113.9"}]


def _samples(name: str) -> dict[str, Any]:
    return {**SAMPLES, "name": name}


# -- 1. the wildcard origin ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("require_keys", [None, False])
def test_wildcard_origin_without_required_keys_refuses_to_start(tmp_path: Path, require_keys: bool | None) -> None:
    s = Settings(data_dir=tmp_path, allowed_origins=["https://ui.example", "*"], require_keys=require_keys)
    with pytest.raises(RuntimeError, match=r"ALLOWED_ORIGINS containing '\*' unless FISHER_ATLAS_REQUIRE_KEYS=true"):
        create_app(s)


def test_serve_refuses_the_wildcard_origin_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main

    monkeypatch.setenv("FISHER_ATLAS_ALLOWED_ORIGINS", '["*"]')
    # --host 0.0.0.0 without keys: refused either way, so a regression cannot start a server here; the message
    # must be the origin's
    assert main(["serve", "--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0", "--port", "9"]) == 1
    err = capsys.readouterr().err.strip()
    assert "ALLOWED_ORIGINS containing '*'" in err and "\n" not in err and "Traceback" not in err, err


def test_wildcard_origin_with_keys_required_starts_and_needs_a_key(bind: Any, tmp_path: Path) -> None:  # noqa: F811
    key = "fa_" + secrets.token_urlsafe(32)
    url, _app = bind(require_keys=True, bootstrap_admin_key=key, allowed_origins=["*"], data_dir=tmp_path / "w")
    evil = {"Origin": "https://evil.example"}
    r = httpx.post(f"{url}/v1/keys", json={"name": "pwn", "scopes": ["admin"]}, headers=evil)
    assert r.status_code == 401, r.text
    r = httpx.get(f"{url}/v1/keys", headers={**evil, "X-API-Key": key})
    assert r.status_code == 200 and [k["name"] for k in r.json()["items"]] == ["bootstrap-admin"]


# -- 2. requests through a reverse proxy -----------------------------------------------------------------------------


def test_a_proxied_request_needs_a_key_on_a_loopback_bind_without_keys(bind: Any) -> None:  # noqa: F811
    url, app = bind()
    assert httpx.get(f"{url}/v1/tasks").status_code == 200  # direct, local, no key exists: anonymous
    for headers in PROXY_HEADERS:
        r = httpx.get(f"{url}/v1/tasks", headers=headers)
        assert r.status_code == 401, (headers, r.text)
        body = r.json()
        assert body["code"] == "unauthorized" and "proxied request" in body["message"], body
        assert "FISHER_ATLAS_REQUIRE_KEYS=true" in body["message"]
        r = httpx.post(f"{url}/v1/keys", json={"name": "pwn", "scopes": ["admin"]}, headers=headers)
        assert r.status_code == 401, (headers, r.text)
    with app.state.container.store.read() as s:
        assert apikeys.list_api_keys(s) == []  # nothing was created
    with app.state.container.store.session() as s:
        _, admin = apikeys.create_api_key(s, "root", ["admin"])
    r = httpx.get(f"{url}/v1/tasks", headers={**PROXY_HEADERS[0], "X-API-Key": admin})
    assert r.status_code == 200, r.text


def test_the_route_check_treats_a_proxied_request_as_outside(bind: Any) -> None:  # noqa: F811
    """Where the middleware did not run, :func:`service.auth.authorize` applies the same rule."""
    from types import SimpleNamespace

    from atlas.errors import Unauthorized
    from service.auth import ANONYMOUS, authorize

    _url, app = bind()
    container = app.state.container

    def request(headers: dict[str, str]) -> Any:
        return SimpleNamespace(scope={"type": "http", "server": ("127.0.0.1", 1), "headers": []}, headers=headers,
                               state=SimpleNamespace())

    assert authorize(request({}), container, "admin") is ANONYMOUS
    with pytest.raises(Unauthorized, match="proxied request"):
        authorize(request({"x-real-ip": "203.0.113.9"}), container, "read")


# -- 3. the server's own origin behind a TLS-terminating proxy -------------------------------------------------------


def test_the_dashboard_behind_a_tls_proxy_can_save(bind: Any, tmp_path: Path) -> None:  # noqa: F811
    key = "fa_" + secrets.token_urlsafe(32)
    url, _app = bind(require_keys=True, bootstrap_admin_key=key, allowed_hosts=["atlas.example.com"],
                    data_dir=tmp_path / "tls")
    # the proxy keeps the Host and adds X-Forwarded-For; this server sees plain http (`fisher-atlas serve` reads no
    # X-Forwarded-Proto: proxy_headers=False), while the browser's page, and so its Origin, is https
    proxy = {"Host": "atlas.example.com", "X-Forwarded-For": "203.0.113.9", "X-API-Key": key}
    for n, origin in enumerate(("https://atlas.example.com", "http://atlas.example.com",
                                "https://atlas.example.com:443")):
        r = httpx.post(f"{url}/v1/tasks", json=_samples(f"t{n}"), headers={**proxy, "Origin": origin})
        assert r.status_code == 202, (origin, r.text)
    for origin in ("https://evil.example", "https://atlas.example.com:8443", "https://sub.atlas.example.com",
                   "https://atlas.example.com.evil.example", "null"):
        r = httpx.post(f"{url}/v1/tasks", json=_samples("x"), headers={**proxy, "Origin": origin})
        assert r.status_code == 403 and r.json()["code"] == "forbidden_origin", (origin, r.text)
    r = httpx.post(f"{url}/v1/tasks", json=_samples("p"),  # a Host with its port: that port, either scheme
                   headers={**proxy, "Host": "atlas.example.com:8443", "Origin": "https://atlas.example.com:8443"})
    assert r.status_code == 202, r.text
    assert httpx.get(f"{url}/v1/tasks", headers=proxy).json()["total"] == 4


# -- 4. body limits behind --root-path -------------------------------------------------------------------------------


def test_behind_a_root_path_an_import_has_its_own_limit_and_413s_report_the_setting(bind: Any) -> None:  # noqa: F811
    url, _app = bind(root_path="/api", max_upload_bytes=10_000, max_import_bytes=1_000_000)
    junk = b"x" * 400_000  # under the import limit, over the upload limit and its 256 KiB envelope
    r = httpx.post(f"{url}/v1/spaces/import", files={"file": ("e.jsonl", junk)}, timeout=30)
    assert r.status_code == 422 and r.json()["code"] != "payload_too_large", r.text  # read, and refused as no export
    r = httpx.post(f"{url}/v1/spaces/import", files={"file": ("e.jsonl", b"x" * 1_400_000)}, timeout=30)
    assert r.status_code == 413, r.text
    assert r.json()["detail"]["max_import_bytes"] == 1_000_000 and "1000000 bytes" in r.json()["message"]
    big = {"name": "big", "samples": [{"text": "word " * 200}] * 400}  # ~400 KB
    r = httpx.post(f"{url}/v1/tasks", json=big, timeout=30)  # declared length
    assert r.status_code == 413, r.text
    assert r.json()["detail"]["max_upload_bytes"] == 10_000, r.text
    assert "upload limit of 10000 bytes (setting max_upload_bytes)" in r.json()["message"]

    def chunks() -> Any:
        for _ in range(40):
            yield b"y" * 10_000

    r = httpx.post(f"{url}/v1/tasks", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413, r.text  # undeclared (chunked): counted as it arrives
    assert "limit of 10000 bytes" in r.json()["message"], r.text


# -- 5. the bootstrap admin key's listed prefix ----------------------------------------------------------------------


def test_a_plaintext_bootstrap_key_lists_no_part_of_its_secret(bind: Any, tmp_path: Path) -> None:  # noqa: F811
    secret = "correct-horse-battery-staple-42"
    boot = "boot:" + hashlib.sha256(secret.encode()).hexdigest()[:8]
    data = tmp_path / "boot"
    url, app = bind(require_keys=True, bootstrap_admin_key=secret, data_dir=data)
    h = {"X-API-Key": secret}
    r = httpx.get(f"{url}/v1/keys", headers=h)
    assert [(k["name"], k["prefix"]) for k in r.json()["items"]] == [("bootstrap-admin", boot)], r.text
    assert secret[:4] not in r.text
    with app.state.container.store.session() as s:  # a row written before the fix: the plaintext's start
        s.query(ApiKey).filter(ApiKey.name == "bootstrap-admin").update({"prefix": secret[:10]})
    url2, _ = bind(require_keys=True, bootstrap_admin_key=secret, data_dir=data)  # a restart rewrites it
    r = httpx.get(f"{url2}/v1/keys", headers=h)
    assert [k["prefix"] for k in r.json()["items"]] == [boot], r.text
    url3, _ = bind(require_keys=True, bootstrap_admin_key=f"sha256:{apikeys.hash_key(secret)}", data_dir=data)
    assert [k["prefix"] for k in httpx.get(f"{url3}/v1/keys", headers=h).json()["items"]] == [boot]
    # a generated key keeps its usual prefix (the first 10 characters), bootstrap or created
    generated = "fa_" + secrets.token_urlsafe(32)
    url4, _ = bind(require_keys=True, bootstrap_admin_key=generated, data_dir=tmp_path / "gen")
    g = {"X-API-Key": generated}
    created = httpx.post(f"{url4}/v1/keys", json={"name": "ci", "scopes": ["read"]}, headers=g).json()
    prefixes = {k["name"]: k["prefix"] for k in httpx.get(f"{url4}/v1/keys", headers=g).json()["items"]}
    assert prefixes == {"bootstrap-admin": generated[:10], "ci": created["key"][:10]}


# -- 6. progress streams ---------------------------------------------------------------------------------------------


def _open_stream(stack: contextlib.ExitStack, http: httpx.Client, job_id: int) -> httpx.Response:
    return stack.enter_context(http.stream("GET", f"/v1/jobs/{job_id}/events"))


def _wait_open(app: Any, n: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while app.state.container.event_streams.open != n:
        assert time.monotonic() < deadline, f"{app.state.container.event_streams.open} streams open, not {n}"
        time.sleep(0.05)


@pytest.mark.parametrize("limits", [{"max_event_streams_per_client": 2}, {"max_event_streams": 2}])
def test_progress_streams_are_capped_and_slots_come_back(bind: Any, limits: dict[str, int]) -> None:  # noqa: F811
    url, app = bind(**limits)  # jobs stay queued (no runner): the streams stay open
    with httpx.Client(base_url=url, timeout=30) as http:
        job_id = http.post("/v1/tasks", json=SAMPLES).json()["job"]["id"]
        with contextlib.ExitStack() as outer:
            first = contextlib.ExitStack()
            assert _open_stream(first, http, job_id).status_code == 200
            assert _open_stream(outer, http, job_id).status_code == 200
            with contextlib.ExitStack() as over:
                r = _open_stream(over, http, job_id)  # streamed: an unbounded stream would never end a read
                assert r.status_code == 429, r.status_code
                body = json.loads(r.read())
            assert body["code"] == "queue_full" and "progress streams" in body["message"], body
            assert int(r.headers["retry-after"]) >= 1
            assert http.get("/v1/tasks").status_code == 200  # other requests are served meanwhile
            first.close()  # the client goes away: its slot comes back
            _wait_open(app, 1)
            with contextlib.ExitStack() as again:
                assert _open_stream(again, http, job_id).status_code == 200
            _wait_open(app, 1)
            assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200  # streams that end give theirs back
            _wait_open(app, 0)


def test_the_client_waits_by_polling_when_its_stream_is_refused(bind: Any) -> None:  # noqa: F811
    """``wait_job`` follows the progress stream; refused one (429: the client's streams are all open) it polls."""
    from service.client import AtlasClient

    url, _app = bind(max_event_streams_per_client=1)
    with httpx.Client(base_url=url, timeout=30) as http:
        held = http.post("/v1/tasks", json=_samples("held")).json()["job"]["id"]
        done = http.post("/v1/tasks", json=_samples("done")).json()["job"]["id"]
        assert http.post(f"/v1/jobs/{done}/cancel").json()["status"] == "cancelled"
        with contextlib.ExitStack() as stack:
            assert _open_stream(stack, http, held).status_code == 200  # the one stream this client may open
            with AtlasClient(url) as client:
                assert client.wait_job(done, timeout=30).status == "cancelled"


def test_the_client_waits_by_polling_when_its_stream_is_unavailable(bind: Any, monkeypatch: pytest.MonkeyPatch  # noqa: F811
                                                                    ) -> None:
    """A stream refused with a 503 (the database busy or restarting as it opened) made ``wait_job`` raise at once,
    though polling rides out such outages (an API review, 2026-12-07)."""
    from atlas.errors import DatabaseBusy
    from service.client import AsyncAtlasClient, AtlasClient

    url, app = bind()
    with httpx.Client(base_url=url, timeout=30) as http:
        job_id = http.post("/v1/tasks", json=_samples("busy")).json()["job"]["id"]
        assert http.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    jobs = app.state.container.jobs
    real_get, refused = jobs.get, []

    def busy_once(job_id: int) -> Any:
        if not refused:  # the first read of the job: the stream's open
            refused.append(job_id)
            raise DatabaseBusy("the database is busy", None)
        return real_get(job_id)

    monkeypatch.setattr(jobs, "get", busy_once)
    with AtlasClient(url) as client:
        assert client.wait_job(job_id, timeout=30).status == "cancelled"
    assert refused == [job_id]
    refused.clear()

    async def wait() -> str:
        async with AsyncAtlasClient(url) as client:
            return (await client.wait_job(job_id, timeout=30)).status

    assert asyncio.run(wait()) == "cancelled" and refused == [job_id]


def test_json_bodies_held_at_once_are_bounded(bind: Any) -> None:  # noqa: F811
    """A route or fit body of up to ``max_upload_bytes`` is read whole before it waits for a parse slot: bodies
    waiting were bounded by nothing but connections (a review, 2026-12-07). Past 1 MiB a JSON body counts against
    ``(max_concurrent_uploads + 1) x (max_upload_bytes + envelope)``; one more is a 503 with Retry-After, and small
    bodies (prompts) never wait on it. Real sockets hold real partial bodies."""
    import socket

    url, _app = bind(max_upload_bytes=2 << 20, max_concurrent_uploads=1)  # budget: 2 x 2.25 MiB
    port = int(url.rsplit(":", 1)[1])
    chunk = b'{"prompt": "' + b"a" * 2_000_000

    def partial(declared: int = len(chunk) + 2) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /v1/route HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {declared}\r\n\r\n".encode() + chunk)
        return sock

    def status(sock: socket.socket) -> int:
        head = sock.recv(4096)
        return int(head.split(b" ", 2)[1])

    held = [partial(), partial()]  # 4 MB of unfinished bodies: within the budget
    time.sleep(0.5)
    third = partial()
    answer = third.recv(4096)
    third.close()
    assert answer.startswith(b"HTTP/1.1 503") and b"uploads_busy" in answer and b"retry-after" in answer.lower(), answer
    r = httpx.post(f"{url}/v1/route", json={"prompt": "hello there", "threshold": -1}, timeout=30)
    assert r.status_code == 200, r.text  # a prompt never waits on the budget
    for sock in held:
        sock.close()
    time.sleep(0.5)  # the server sees them gone and gives their bytes back
    fourth = partial()
    fourth.sendall(b'"}')
    code = status(fourth)
    fourth.close()
    assert code == 413, code  # past the budget now: judged as a body (a prompt over max_prompt_chars)
