"""Fixtures of the service tests: real uvicorn servers on free ports, real SQLite and PostgreSQL.

No mocks: every test talks HTTP to a real app whose lifespan migrated a real database, loaded a real
(tiny, or the bundled) model and opened a real FAISS index. A loaded model can be shared between the
apps of one test session (``overrides={"lm": ...}``) to keep the suite fast.

The dashboard's browser tests (``test_dashboard_*_browser.py``) share one service with a few tasks
(``dashboard_service``, started once for the package) and one Chromium (``browser``, launched once for the tests
that follow one another using it).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from atlas.settings import Settings
from service.app import create_app
from tests.service.dashboard_helpers import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    FAILING_TASK,
    JOB_TIMEOUT_S,
    DashboardService,
    task_texts,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PG_ADMIN_URL = os.environ.get("FISHER_ATLAS_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def wait_job(http: Any, job_id: int, timeout: float = 60.0) -> dict[str, Any]:
    """Poll ``GET /v1/jobs/{id}`` (an ``httpx.Client`` on the service) until the job ends; its final JSON."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return dict(job)
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


def free_port() -> int:
    """A free TCP port on the loopback interface (for processes that bind it themselves)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: Any, timeout: float = 60.0, log: Callable[[], str] = lambda: "") -> None:
    """Wait until a ``serve`` subprocess ``proc`` on ``port`` answers ``/readyz`` with 200 (``log``: what to show
    when it exits or the time runs out)."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, log()
        assert time.monotonic() < deadline, f"serve did not become ready\n{log()}"
        time.sleep(0.3)


@pytest.fixture
def fake_http() -> Iterator[Callable[..., str]]:
    """A real HTTP server that is not FisherAtlas: ``start(answers, default) -> url``, ``answers`` mapping a path to
    ``(status, headers, body)`` for GET and POST alike, ``default`` for any other path (404 when not given)."""
    import http.server

    servers: list[http.server.HTTPServer] = []

    def start(answers: dict[str, tuple[int, dict[str, str], bytes]] | None = None,
              default: tuple[int, dict[str, str], bytes] = (404, {}, b"no")) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, headers, body = (answers or {}).get(self.path.split("?")[0], default)
                self.send_response(status)
                for key, value in {"content-length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET  # noqa: N815 - http.server names its handlers so

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class LiveServer:
    """A uvicorn server running an app in a background thread.

    The listening socket is bound here, before the server starts, and handed to uvicorn: no other
    process can take the port between picking and serving (``free_port`` races on a busy machine).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", root_path: str = "", port: int = 0) -> None:
        self.app = app
        self.host = host
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))  # port: 0 picks a free one; a given one restarts a service in its place
        # listening at once: until then another process's SO_REUSEADDR socket may bind 127.0.0.1 on this port and,
        # being more specific than a 0.0.0.0 bind, take the connections meant for this server
        self.socket.listen(128)
        self.port = int(self.socket.getsockname()[1])
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=5, root_path=root_path)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 120.0) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread died during startup (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start in time")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


@dataclass
class Served:
    """A running service: its URL, app and container."""

    url: str
    app: Any
    server: LiveServer

    @property
    def container(self) -> Any:
        return self.app.state.container


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_models import save_tiny_gpt2

    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir: Path) -> Any:
    from workers.model_loading import load_causal_lm

    return load_causal_lm(str(tiny_model_dir), device="cpu")


def _pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", connect_timeout=3):
            return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_database() -> Iterator[Callable[[], str]]:
    """Factory of fresh PostgreSQL databases (dropped at the end of the session)."""
    if not _pg_available():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    import psycopg

    created: list[str] = []

    def make() -> str:
        name = f"fa_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"

    yield make
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Factory starting a service: ``serve(lm=..., **settings)``; stopped after the test."""
    running: list[LiveServer] = []

    def start(*, lm: Any = "load", data_dir: Path | None = None, overrides: dict[str, Any] | None = None,
              **settings: Any) -> Served:
        values: dict[str, Any] = {"data_dir": data_dir or (tmp_path / f"data-{len(running)}"), "sketch_dim": 256,
                                  "device": "cpu"}
        values.update(settings)
        s = Settings(**values)
        eo = dict(overrides or {})
        if lm != "load":
            eo["lm"] = lm
        app = create_app(s, overrides=eo)
        server = LiveServer(app).start()
        running.append(server)
        return Served(server.url, app, server)

    yield start
    for server in reversed(running):
        server.stop()


# --- the dashboard's browser tests (test_dashboard_*_browser.py) ---------------------------------------------------


@pytest.fixture(scope="package")
def dashboard_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardService]:
    """A service with five ready tasks (:func:`task_texts`) and a failed one, started once for the package.

    The dashboard's tests share it, so each leaves it as it found it (it deletes the tasks it adds): some count the
    tasks and jobs, and the modules may run in any order.
    """
    httpx = pytest.importorskip("httpx")
    from tests.tiny_models import save_tiny_gpt2

    tmp = tmp_path_factory.mktemp("dashboard")
    model_dir = save_tiny_gpt2(tmp / "model")
    settings = Settings(
        data_dir=tmp / "data",
        database_url=None,
        host="127.0.0.1",
        port=free_port(),
        model=str(model_dir),
        device="cpu",
        dtype="float32",
        sketch_dim=256,
        queue="inprocess",
        worker_threads=1,
        require_keys=False,
        checkpoint_every=64,
    )
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning", lifespan="on", ws="none")
    )
    thread = threading.Thread(target=server.run, name="dashboard-uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{settings.port}"
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the service did not start")
            time.sleep(0.05)
        tasks: dict[str, dict[str, Any]] = {}
        jobs: list[dict[str, Any]] = []
        with httpx.Client(base_url=base, timeout=30) as http:
            for name, (metadata, texts) in task_texts().items():
                r = http.post(
                    "/v1/tasks",
                    json={"name": name, "mode": "text", "metadata": metadata, "samples": [{"text": t} for t in texts]},
                )
                assert r.status_code == 202, r.text
                body = r.json()
                tasks[name] = body["task"]
                jobs.append(body["job"])
            r = http.post("/v1/tasks", json={"name": FAILING_TASK, "samples": [{"text": "a"}, {"text": "b"}]})
            assert r.status_code == 202, r.text
            failing = r.json()["job"]
            deadline = time.monotonic() + JOB_TIMEOUT_S
            done: dict[int, dict[str, Any]] = {}
            while len(done) < len(jobs) + 1:
                assert time.monotonic() < deadline, f"jobs did not finish in {JOB_TIMEOUT_S} s: {jobs}"
                for job in [*jobs, failing]:
                    if job["id"] in done:
                        continue
                    j = http.get(f"/v1/jobs/{job['id']}").json()
                    if j["status"] in ("succeeded", "failed", "cancelled"):
                        assert j["status"] == ("failed" if job is failing else "succeeded"), j
                        done[job["id"]] = j
                time.sleep(0.1)
            failed_job = done.pop(failing["id"])
            assert failed_job["error"], failed_job
            for name, t in tasks.items():
                tasks[name] = http.get(f"/v1/tasks/{t['id']}").json()
                assert tasks[name]["status"] == "ready", tasks[name]
        yield DashboardService(base, tasks, list(done.values()), failed_job)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class _SharedChromium:
    """Debian's headless Chromium through Playwright, shared by consecutive tests that use it.

    Started by the first test that asks for it and stopped after the last of the tests that follow one another using
    it (:func:`pytest_runtest_teardown`), so that the dashboard's browser modules (next to one another in the package)
    launch it once. It must not stay open past them:
    while Playwright's sync API is open, the main thread's asyncio loop counts as running, and ``asyncio.run`` or
    another ``sync_playwright`` in a later test fails.
    """

    def __init__(self) -> None:
        self._playwright: Any = None
        self._browser: Any = None

    def get(self) -> Any:
        if self._browser is None:
            sync_api = pytest.importorskip("playwright.sync_api")
            self._playwright = sync_api.sync_playwright().start()
            try:
                self._browser = self._playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            except BaseException:
                self.close()
                raise
        return self._browser

    def close(self) -> None:
        browser, playwright, self._browser, self._playwright = self._browser, self._playwright, None, None
        try:
            if browser is not None:
                browser.close()
        finally:
            if playwright is not None:
                playwright.stop()


_CHROMIUM = _SharedChromium()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test's fixtures are torn down: stop the shared Chromium unless the next test uses it too."""
    try:
        return (yield)
    finally:
        if nextitem is None or "browser" not in getattr(nextitem, "fixturenames", ()):
            _CHROMIUM.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _CHROMIUM.close()


@pytest.fixture
def browser() -> Any:
    """The shared Chromium (:class:`_SharedChromium`: one launch for a run of consecutive browser tests); each test
    opens its own context in it."""
    return _CHROMIUM.get()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh dashboard page; a page error or console error fails the test. Screenshots go to ``ARTIFACTS``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    problems: list[str] = []
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    pg.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    yield pg
    context.close()
    assert not problems, problems
