"""Uploads handled at once are capped (``max_concurrent_uploads``): the next waits for a slot, then 503.

Each test runs a real uvicorn server (``bind``) and holds an upload open on a raw socket: its headers sent, its
body half sent, so its handler holds a slot while it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.service.test_security import bind  # noqa: F401  (fixture)


def _body(name: str) -> bytes:
    return json.dumps({"name": name, "samples": [{"text": f"{name} sample {i}"} for i in range(3)]}).encode()


class HeldUpload:
    """A ``POST /v1/tasks`` whose body is sent in two parts: the first now, the rest on :meth:`finish`."""

    def __init__(self, url: str, name: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.body = _body(name)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        head = (f"POST /v1/tasks HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(self.body)}\r\n\r\n").encode()
        self.sock.sendall(head + self.body[:10])

    def finish(self) -> int:
        """Send the rest of the body; the answer's status."""
        self.sock.sendall(self.body[10:])
        status = int(self.sock.recv(65536).split(b" ", 2)[1])
        self.sock.close()
        return status

    def abandon(self) -> None:
        """The client goes away mid-body."""
        self.sock.close()


def _wait_held(app: Any, n: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while app.state.container.upload_slots.held != n:
        assert time.monotonic() < deadline, f"{app.state.container.upload_slots.held} slots held, not {n}"
        time.sleep(0.02)


def _task_names(http: httpx.Client) -> list[str]:
    return sorted(t["name"] for t in http.get("/v1/tasks").json()["items"])


def test_an_upload_beyond_the_slots_is_refused_after_its_wait_and_stores_nothing(bind: Any) -> None:  # noqa: F811
    url, app = bind(max_concurrent_uploads=1, upload_slot_wait_s=0.5)
    with httpx.Client(base_url=url, timeout=30) as http:
        held = HeldUpload(url, "held")
        _wait_held(app, 1)
        t0 = time.monotonic()
        r = http.post("/v1/tasks", content=_body("refused"), headers={"content-type": "application/json"})
        waited = time.monotonic() - t0
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "uploads_busy" and "max_concurrent_uploads" in r.json()["message"]
        assert int(r.headers["retry-after"]) >= 1
        assert waited >= 0.45, waited  # it waited for a slot before giving up
        assert http.get("/v1/tasks").status_code == 200  # reads are not held up
        assert held.finish() == 202
        _wait_held(app, 0)
        assert _task_names(http) == ["held"]  # the refused upload stored nothing
        r = http.post("/v1/tasks", content=_body("after"), headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text  # the slot came back
        assert _task_names(http) == ["after", "held"]


def test_an_upload_waits_for_a_slot_and_a_client_gone_mid_body_gives_its_slot_back(bind: Any) -> None:  # noqa: F811
    url, app = bind(max_concurrent_uploads=1, upload_slot_wait_s=20)
    with httpx.Client(base_url=url, timeout=60) as http:
        held = HeldUpload(url, "first")
        _wait_held(app, 1)
        answers: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: answers.append(http.post(
            "/v1/tasks", content=_body("second"), headers={"content-type": "application/json"})))
        waiter.start()
        time.sleep(0.5)
        assert not answers  # still waiting for the slot
        held.abandon()  # the first client goes away: its handler ends, the waiting upload gets the slot
        waiter.join(30)
        assert answers and answers[0].status_code == 202, answers
        _wait_held(app, 0)
        assert _task_names(http) == ["second"]


def test_imports_share_the_slots(bind: Any, tmp_path: Any) -> None:  # noqa: F811
    url, app = bind(max_concurrent_uploads=1, upload_slot_wait_s=0.3)
    with httpx.Client(base_url=url, timeout=30) as http:
        held = HeldUpload(url, "held")
        _wait_held(app, 1)
        r = http.post("/v1/spaces/import", files={"file": ("space.jsonl", b"{}\n")})
        assert r.status_code == 503 and r.json()["code"] == "uploads_busy", r.text
        assert held.finish() == 202


def _large_route_body(prompt: str, size: int = 2 * 1024 * 1024) -> bytes:
    """A route request padded with whitespace (valid JSON) past the 1 MiB at which a body takes an upload slot."""
    body = json.dumps({"prompts": [prompt]}).encode()
    return body[:-1] + b" " * (size - len(body)) + b"}"


def test_large_route_bodies_share_the_upload_slots_and_small_ones_do_not_wait(bind: Any) -> None:  # noqa: F811
    """A route body may be up to max_upload_bytes and is parsed in memory as an upload is: one over 1 MiB is parsed
    holding an upload slot (twenty 64 MB route bodies at once took gigabytes unbounded); a small one never waits. The
    slot is taken for the parse only, once the body has arrived: a client sending a body slowly (any valid key, a read
    key included) holds none (a security review: four slow chunked bodies to /v1/route blocked every upload)."""
    url, app = bind(max_concurrent_uploads=1, upload_slot_wait_s=0.5)
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    slow = _large_route_body("a prompt sent slowly")
    sock.sendall(f"POST /v1/route HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(slow)}\r\n\r\n".encode() + slow[:100])
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            time.sleep(0.3)
            assert app.state.container.upload_slots.held == 0  # a body still arriving holds no slot
            r = http.post("/v1/tasks", content=_body("not-blocked"), headers={"content-type": "application/json"})
            assert r.status_code == 202, r.text
            _wait_held(app, 0)
            held = HeldUpload(url, "held")  # an upload holds the only slot
            _wait_held(app, 1)
            r = http.post("/v1/route", content=_large_route_body("another"),
                          headers={"content-type": "application/json"})
            assert r.status_code == 503 and r.json()["code"] == "uploads_busy", r.text  # its parse waited for it
            r = http.post("/v1/route", json={"prompts": ["a small request"]})
            assert r.status_code == 200, r.text  # not held up
            assert held.finish() == 202
            _wait_held(app, 0)
            sock.sendall(slow[100:])
            assert int(sock.recv(65536).split(b" ", 2)[1]) == 200
            large_upload = json.dumps({"name": "large", "samples": [{"text": f"sample {i} " + "w " * 400}
                                                                   for i in range(1500)]}).encode()
            assert len(large_upload) > 1024 * 1024
            r = http.post("/v1/tasks", content=large_upload, headers={"content-type": "application/json"})
            assert r.status_code == 202, r.text  # one slot, its route's
            _wait_held(app, 0)
    finally:
        sock.close()


@contextlib.contextmanager
def _busy_for(url: str, app: Any, name: str, seconds: float = 1.0) -> Iterator[None]:
    """Every slot (one) held by an upload named ``name`` that finishes ``seconds`` after the block starts."""
    held = HeldUpload(url, name)
    _wait_held(app, 1)
    thread = threading.Thread(target=lambda: (time.sleep(seconds), held.finish()), daemon=True)
    thread.start()
    yield
    thread.join(10)


def test_a_keyed_write_is_retried_through_a_busy_service_and_an_unkeyed_one_is_not(bind: Any) -> None:  # noqa: F811
    """503 ``uploads_busy`` carries Retry-After: the client resends ``add_task`` / ``append`` that carry an
    idempotency key (a repeat is answered with the first one's task and job), never a write without one."""
    from service.client import AtlasClient
    from service.client.errors import Unavailable

    url, app = bind(max_concurrent_uploads=1, upload_slot_wait_s=0.2)
    samples = [{"text": "a sample sent while the service is busy"}]
    with AtlasClient(url, retries=4) as client:
        held = HeldUpload(url, "held")
        _wait_held(app, 1)
        with pytest.raises(Unavailable) as refused:
            client.add_task("unkeyed", samples=samples)
        assert refused.value.code == "uploads_busy"
        held.finish()
        with _busy_for(url, app, "held-again"):
            created = client.add_task("keyed", samples=samples, idempotency_key="busy-add")  # waits, resends
        assert created.task.name == "keyed"
        with _busy_for(url, app, "held-third"):
            job = client.append(created.task.id, samples=[{"text": "one more"}], idempotency_key="busy-append")
        assert job.kind == "append"
    with httpx.Client(base_url=url, timeout=30) as http:
        assert _task_names(http) == ["held", "held-again", "held-third", "keyed"]


def test_the_cli_sends_its_writes_with_a_fresh_key(bind: Any, tmp_path: Any,  # noqa: F811
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``fisher-atlas add`` and ``append`` get through a busy service: each sends its write with a key of its own."""
    from service.cli import main

    url, app = bind(max_concurrent_uploads=1, upload_slot_wait_s=0.2)
    data = tmp_path / "s.jsonl"
    data.write_text(json.dumps({"text": "a sample from a file"}) + "\n")
    with _busy_for(url, app, "held"):
        assert main(["add", "from-cli", str(data), "--url", url, "--json"]) == 0
    capsys.readouterr()
    other = tmp_path / "t.jsonl"
    other.write_text(json.dumps({"text": "another sample from a file"}) + "\n")
    with _busy_for(url, app, "held-again"):
        assert main(["append", "from-cli", str(other), "--url", url, "--json"]) == 0
    with httpx.Client(base_url=url, timeout=30) as http:
        assert _task_names(http) == ["from-cli", "held", "held-again"]


@settings(max_examples=40, deadline=None)
@given(total=st.integers(1, 4), holds_ms=st.lists(st.integers(0, 15), min_size=1, max_size=12),
       wait_s=st.sampled_from([0.0, 0.05, 5.0]))
def test_slots_never_hold_more_than_their_total_and_always_come_back(total: int, holds_ms: list[int],
                                                                     wait_s: float) -> None:
    """Any burst of uploads, each holding its slot for a while: at most ``total`` hold one at once, a refused one is
    ``UploadsBusy`` (503), every slot comes back (also from a holder that fails), and with a wait longer than the
    whole burst none is refused."""
    from service.upload_slots import UploadsBusy, UploadSlots

    slots = UploadSlots(total, wait_s)
    peak, outcomes = [0], []

    async def upload(ms: int, fails: bool) -> None:
        try:
            async with slots.hold():
                peak[0] = max(peak[0], slots.held)
                await asyncio.sleep(ms / 1000)
                if fails:
                    raise ValueError("the upload was malformed")
            outcomes.append("stored")
        except UploadsBusy as exc:
            assert exc.status_code == 503 and exc.retry_after_s
            outcomes.append("busy")
        except ValueError:
            outcomes.append("failed")

    async def burst() -> None:
        await asyncio.gather(*(upload(ms, i % 3 == 2) for i, ms in enumerate(holds_ms)))

    asyncio.run(burst())
    assert 1 <= peak[0] <= total and slots.held == 0
    assert len(outcomes) == len(holds_ms)
    if wait_s >= 5.0:
        assert "busy" not in outcomes
    if len(holds_ms) <= total:
        assert "busy" not in outcomes  # a free slot is taken at once, whatever the wait
