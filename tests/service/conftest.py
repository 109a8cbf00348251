"""Fixtures of the service tests: real uvicorn servers on free ports, real SQLite and PostgreSQL.

No mocks: every test talks HTTP to a real app whose lifespan migrated a real database, loaded a real
(tiny, or the bundled) model and opened a real FAISS index. A loaded model can be shared between the
apps of one test session (``overrides={"lm": ...}``) to keep the suite fast.
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
