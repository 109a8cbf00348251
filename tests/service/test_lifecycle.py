"""``serve`` stopped as an orchestrator stops it (a lifecycle review, 2026-12-07; each case failed before its fix):

* At SIGTERM the running job was released only after every open request had ended, with no bound: one slow client
  held the process past any grace period (SIGKILL: the job lost an attempt and its progress since its checkpoint).
* A SIGTERM during the model's load waited for the load, then started the job runner and served before stopping.
* SIGHUP (a closed terminal) killed the process with no stop at all.

Real processes: ``python -m service.cli serve`` on the bundled model (its load takes seconds, the window a stop at
startup needs), SQLite, real HTTP and a raw socket for the slow client.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import free_port, wait_ready

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 2.0
pytestmark = pytest.mark.slow


def _serve(tmp_path: Path, port: int, model: str | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    env = {**os.environ, "FISHER_ATLAS_PORT": str(port), "FISHER_ATLAS_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
           "FISHER_ATLAS_SHUTDOWN_GRACE_S": str(GRACE_S), "FISHER_ATLAS_MAX_TOKENS_PER_SAMPLE": "64",
           "OMP_NUM_THREADS": "1"}
    if model is not None:
        env.update(FISHER_ATLAS_MODEL=model, FISHER_ATLAS_SKETCH_DIM="128")
    log = tmp_path / "serve.log"
    sink = log.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path / "data")],
                            env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    sink.close()
    return proc, log


def _ended(proc: subprocess.Popen[bytes], within: float) -> float:
    t0 = time.monotonic()
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {within} s after the signal") from None
    return time.monotonic() - t0


def test_sigterm_releases_the_running_job_at_once_and_bounds_the_wait_for_open_requests(tmp_path: Path) -> None:
    port = free_port()
    proc, log = _serve(tmp_path, port)
    try:
        wait_ready(port, proc, 120)
        samples = [{"text": f"Sample {i}: the committee met on day {i} to discuss item {i * 7} of the agenda."}
                   for i in range(1500)]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            job = http.post("/v1/tasks", json={"name": "long", "samples": samples}).json()["job"]["id"]
            deadline = time.monotonic() + 120
            while (http.get(f"/v1/jobs/{job}").json().get("progress") or {}).get("samples_done", 0) == 0:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
        slow = socket.create_connection(("127.0.0.1", port))  # a client sending its body slowly: the drain waits
        slow.sendall(b"POST /v1/route HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        took = _ended(proc, GRACE_S + 25)
        slow.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    said = log.read_text()
    assert proc.returncode in (143, -signal.SIGTERM) and took < GRACE_S + 20, (proc.returncode, took, said[-2000:])
    with sqlite3.connect(tmp_path / "data" / "atlas.sqlite") as db:
        status, attempts = db.execute("SELECT status, attempts FROM jobs WHERE id = ?", (job,)).fetchone()
    assert (status, attempts) == ("queued", 0), (status, attempts, said[-2000:])  # released, no attempt spent
    assert "Application shutdown complete" in said  # the index saved, the pool closed


def test_sigterm_while_the_model_loads_exits_at_once_without_starting(tmp_path: Path) -> None:
    port = free_port()
    proc, log = _serve(tmp_path, port)
    try:
        deadline = time.monotonic() + 120
        while "Waiting for application startup" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _ended(proc, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = log.read_text()
    assert proc.returncode == 143, (proc.returncode, said[-2000:])
    assert "stopped by SIGTERM while starting" in said and "Application startup complete" not in said, said[-2000:]


def test_sighup_stops_the_service_cleanly(tmp_path: Path, tiny_model_dir: Path) -> None:
    port = free_port()
    proc, log = _serve(tmp_path, port, model=str(tiny_model_dir))
    try:
        wait_ready(port, proc, 120)
        proc.send_signal(signal.SIGHUP)
        _ended(proc, GRACE_S + 20)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = log.read_text()
    assert proc.returncode in (143, -signal.SIGTERM), (proc.returncode, said[-2000:])
    assert "Application shutdown complete" in said, said[-2000:]
