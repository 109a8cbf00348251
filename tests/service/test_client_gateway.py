"""The client behind a proxy (a client review, 2026-12-07): a proxy's 502 / 504 was a plain ``AtlasClientError``,
never retried, and ``wait_job`` gave up on it at once although its docs said polling rides it out; an add whose
answer was lost (the connection cut after the service stored the task) raised ``Unreachable``, and a retry by the
caller met a 409 — writes carried no ``Idempotency-Key`` unless given one.

Real parts: a uvicorn server over SQLite with the tiny GPT-2, and a real HTTP proxy in front of it that answers a
scripted 502 / 504 page, or forwards a request and cuts the connection instead of answering.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.client import AtlasClient, AtlasClientError, BadGateway, CreatedButNotDone, Unavailable


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.script: list[str] = []  # what to do with the next requests: "502", "504", "drop"; then forward
        self.seen: list[tuple[str, str, str | None]] = []  # method, path, Idempotency-Key
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Proxy

    def log_message(self, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.seen.append((self.command, self.path, self.headers.get("Idempotency-Key")))
            step = self.server.script.pop(0) if self.server.script else "forward"
        if step == "login":  # another server's page, with a 200
            page = b"<html>login</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if step in ("502", "504"):
            page = b"<html><body><h1>Bad Gateway</h1>nginx</body></html>"
            self.send_response(int(step))
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
        answer = httpx.request(self.command, self.server.upstream + self.path, headers=headers, content=body,
                               timeout=60)
        if step == "drop":  # the service did the work; its answer is lost on the way back
            self.close_connection = True
            return
        self.send_response(answer.status_code)
        for k, v in answer.headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = do_DELETE = do_PATCH = _handle  # noqa: N815 (http.server's names)


@pytest.fixture
def proxy(serve: Any, tiny_lm: Any) -> Iterator[_Proxy]:
    svc = serve(lm=tiny_lm)
    p = _Proxy(svc.url)
    thread = threading.Thread(target=p.serve_forever, daemon=True)
    thread.start()
    yield p
    p.shutdown()
    p.server_close()


SAMPLES = [{"text": "the quick brown fox jumps over the lazy dog"}, {"text": "a second small sample of text"}]


def test_an_add_whose_answer_is_lost_is_sent_again_and_stored_once(proxy: _Proxy) -> None:
    with AtlasClient(proxy.url, timeout=60) as cl:
        proxy.script = ["drop"]
        created = cl.add_task("fox", samples=SAMPLES, wait=True)
        posts = [s for s in proxy.seen if s[0] == "POST"]
        assert len(posts) == 2 and posts[0][2] and posts[0][2] == posts[1][2], posts  # one fresh key, sent twice
        tasks = cl.list_tasks()
        assert [t.id for t in tasks.items] == [created.task.id] and created.job.status == "succeeded"
        proxy.script = ["drop"]
        job = cl.append(created.task.id, samples=SAMPLES[:1], wait=True)
        assert job.status == "succeeded" and cl.get_task(created.task.id).n_samples == 3  # appended once
        proxy.seen.clear()
        cl.add_task("plain", samples=SAMPLES, idempotency_key="")  # "" sends no key
        assert proxy.seen[-1][2] is None


def test_a_proxys_502_and_504_are_retried_and_waited_out(proxy: _Proxy) -> None:
    with AtlasClient(proxy.url, timeout=60) as cl:
        created = cl.add_task("fox", samples=SAMPLES)
        proxy.script = ["502", "504"]
        assert cl.get_task(created.task.id).id == created.task.id  # a read: retried through both
        proxy.script = ["502", "504", "502"]  # the progress stream and two polls meet the proxy's pages
        assert cl.wait_job(created.job.id, timeout=60, poll_interval=0.05).status == "succeeded"
        proxy.script = ["502"] * 3
        with pytest.raises(BadGateway) as info:  # past the client's retries: a typed error, an Unavailable
            cl.get_task(created.task.id)
        assert isinstance(info.value, Unavailable) and info.value.status == 502


def test_files_stream_and_are_sent_whole_again_and_samples_come_from_any_iterable(proxy: _Proxy,
                                                                                  tmp_path: Path) -> None:
    """A path's upload was read whole into memory; it is streamed from the file now, and a retry sends it from its
    start again; an open binary file and a generator of samples are taken (a raw TypeError and a refusal before)."""
    lines = [f'{{"text": "sample number {i} of a streamed file"}}' for i in range(40)]
    path = tmp_path / "streamed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with AtlasClient(proxy.url, timeout=60) as cl:
        proxy.script = ["drop"]  # the first sending's answer is lost: the file is sent again, whole
        created = cl.add_task("streamed", file=path, wait=True)
        assert created.task.n_samples == 40 and created.job.status == "succeeded"
        more = tmp_path / "more.jsonl"
        more.write_text("\n".join(line.replace("streamed", "second") for line in lines) + "\n")
        with more.open("rb") as f:
            f.readline()  # a caller's file is sent whole, from its start, and left open
            proxy.script = ["drop"]
            job = cl.append(created.task.id, f, wait=True)
            assert not f.closed
        assert job.status == "succeeded" and cl.get_task(created.task.id).n_samples == 80
        made = cl.add_task("generated", samples=(f"generated sample {i} of text" for i in range(5)), wait=True)
        assert made.task.n_samples == 5


def test_a_delete_answered_by_another_server_and_a_wait_that_ends_first_say_so(proxy: _Proxy) -> None:
    with AtlasClient(proxy.url, timeout=60) as cl:
        created = cl.add_task("fox", samples=SAMPLES, wait=True)
        proxy.script = ["login"]  # a 200 page of another server was taken as the delete done
        with pytest.raises(AtlasClientError) as info:
            cl.delete_task(created.task.id)
        assert info.value.code == "unexpected_answer"
        assert cl.get_task(created.task.id).id == created.task.id
        big = [{"text": f"a longer sample number {i} " * 20} for i in range(300)]
        with pytest.raises(CreatedButNotDone) as waited:  # the created task was lost with the wait
            cl.add_task("slow", samples=big, wait=True, wait_timeout=0.01)
        assert isinstance(waited.value, TimeoutError) and waited.value.created.task.name == "slow"
        assert f"task {waited.value.created.task.id} ('slow') was created" in str(waited.value)


def test_a_pipe_is_uploaded_by_path_or_open(proxy: _Proxy, tmp_path: Path) -> None:
    """A named pipe or process substitution (``add t <(cat s.jsonl)``) and an open pipe have no size to stream by:
    they are read whole, as before files were streamed (a diff review, 2026-12-07: "Too much data for declared
    Content-Length", a raw h11 error)."""
    import os

    body = b"".join(b'{"text": "piped sample %d of some text"}\n' % i for i in range(6))
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as w:
            w.write(body)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    with AtlasClient(proxy.url, timeout=60) as cl:
        assert cl.add_task("fifo", file=fifo, wait=True).task.n_samples == 6
        writer.join(10)
        r, w = os.pipe()
        os.write(w, body)
        os.close(w)
        with os.fdopen(r, "rb") as pipe:
            assert cl.add_task("pipe", file=pipe, filename="p.jsonl", wait=True).task.n_samples == 6
