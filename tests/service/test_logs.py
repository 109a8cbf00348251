"""The processes' logs as an on-call operator reads them (a review of the logs, 2026-12-07; each case failed before
its fix):

* A 500's answer carried no ``X-Request-ID`` and its traceback's log line no request id: Starlette renders it outside
  every middleware, after the request-id middleware had let the id go.
* ``serve`` and ``worker`` wrote text only; a log pipeline wants one JSON object a line (``--log-format json``).
* The worker's first lines — the model it serves, its queue — were dropped: Celery set up logging only once it
  started consuming.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli import main
from service.logs import JsonLogFormatter, install_log_redaction, log_handler
from tests.service.conftest import free_port, wait_ready

REPO = Path(__file__).resolve().parents[2]


def _record(name: str, msg: str, args: Any = (), exc_info: Any = None) -> logging.LogRecord:
    return logging.getLogger(name).makeRecord(name, logging.INFO, __file__, 1, msg, args, exc_info)


def test_a_json_line_has_its_fields_an_access_line_its_request_and_a_traceback_masked() -> None:
    install_log_redaction()
    fmt = JsonLogFormatter()
    access = json.loads(fmt.format(_record("uvicorn.access", '%s - "%s %s HTTP/%s" %d',
                                           ("10.0.0.1:5", "GET", "/v1/tasks?x=1", "1.1", 404))))
    assert access["logger"] == "uvicorn.access" and access["level"] == "INFO" and access["request_id"] == "-"
    assert (access["client"], access["method"], access["path"], access["status"]) == ("10.0.0.1:5", "GET",
                                                                                      "/v1/tasks?x=1", 404)
    assert access["message"] == '10.0.0.1:5 - "GET /v1/tasks?x=1 HTTP/1.1" 404' and access["time"].endswith("+00:00")
    try:
        raise RuntimeError("could not reach postgresql://atlas:hunter2@db/atlas")
    except RuntimeError:
        failed = json.loads(fmt.format(_record("fisher_atlas.service", "boom: %s", ("api_key=fa_secretsecret1",),
                                               sys.exc_info())))
    assert "RuntimeError" in failed["exc_info"] and "hunter2" not in failed["exc_info"], failed
    assert "fa_secretsecret1" not in failed["message"] and "color_message" not in failed
    assert set(failed) >= {"time", "level", "logger", "message", "request_id", "exc_info"}


@pytest.fixture
def app_log() -> Iterator[io.StringIO]:
    """The service's own log lines as JSON, into a string (as ``serve --log-format json`` writes them)."""
    stream = io.StringIO()
    handler = log_handler("json")
    handler.setStream(stream)
    logger = logging.getLogger("fisher_atlas")
    logger.addHandler(handler)
    yield stream
    logger.removeHandler(handler)


def test_a_500_names_its_request_in_its_answer_and_its_log_line(serve: Any, tiny_lm: Any,
                                                                app_log: io.StringIO) -> None:
    served = serve(lm=tiny_lm, sketch_dim=128)

    def broken() -> None:
        raise RuntimeError("a bug, near password=hunter2")

    served.app.add_api_route("/v1/broken", broken, methods=["GET"])
    r = httpx.get(served.url + "/v1/broken", headers={"X-Request-ID": "ticket-4711"}, timeout=30)
    fine = httpx.get(served.url + "/v1/tasks", timeout=30)  # (uvicorn closes the connection of an app's error)
    assert r.status_code == 500 and r.headers["x-request-id"] == "ticket-4711", (r.status_code, r.headers)
    assert r.json()["code"] == "internal_error" and "ticket-4711" in r.json()["message"]
    assert fine.status_code == 200 and fine.headers["x-request-id"] != "ticket-4711"  # the id did not stay behind
    assert r.headers.get_list("x-request-id") == ["ticket-4711"]  # once
    lines = [json.loads(line) for line in app_log.getvalue().splitlines()]
    (error,) = [line for line in lines if line["message"].startswith("unhandled error on GET /v1/broken")]
    assert error["request_id"] == "ticket-4711" and error["level"] == "ERROR", error
    assert "RuntimeError" in error["exc_info"] and "hunter2" not in error["exc_info"]


def test_a_500_answered_in_process_leaves_no_request_id_behind(tmp_path: Path, app_log: io.StringIO) -> None:
    """An app awaited in the caller's task (``httpx.ASGITransport``, which the client takes): the id of a request
    that failed stayed set, and the caller's later lines carried it."""
    import asyncio

    from atlas.settings import Settings
    from service.app import create_app
    from service.request_ids import REQUEST_ID

    app = create_app(Settings(data_dir=tmp_path / "data"))

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/v1/broken", broken, methods=["GET"])

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            return await http.get("/v1/broken", headers={"X-Request-ID": "ticket-99"})

    async def scenario() -> tuple[httpx.Response, str]:
        answer = await call()
        return answer, REQUEST_ID.get()

    r, after = asyncio.run(scenario())
    assert r.status_code == 500 and r.headers["x-request-id"] == "ticket-99" and after == "-", (r.headers, after)
    (error,) = [json.loads(line) for line in app_log.getvalue().splitlines() if "unhandled" in line]
    assert error["request_id"] == "ticket-99"


def test_serve_writes_json_lines_with_each_answers_request_id(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "FISHER_ATLAS_MODEL": str(tiny_model_dir), "FISHER_ATLAS_SKETCH_DIM": "128",
           "FISHER_ATLAS_DEVICE": "cpu", "FISHER_ATLAS_PORT": str(port), "HF_HUB_OFFLINE": "1",
           "FISHER_ATLAS_LOG_FORMAT": "json"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path / "data")],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_ready(port, proc, 90)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            rid = http.get("/v1/tasks/999").headers["x-request-id"]
            # a malformed multipart body: python-multipart's warning was a bare line (no time, no JSON)
            garbage = http.post("/v1/tasks", content=b"garbage",
                                headers={"content-type": "multipart/form-data; boundary=XX"})
            assert garbage.status_code == 422, garbage.text
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    lines = [json.loads(line) for line in (out + err).decode().splitlines()]  # every line an object
    assert proc.returncode in (143, -signal.SIGTERM)  # 128 + SIGTERM (README, "Stopping")
    assert {"uvicorn.error", "uvicorn.access", "atlas.index"} <= {x["logger"] for x in lines}
    (access,) = [x for x in lines if x.get("path") == "/v1/tasks/999"]
    assert access["request_id"] == rid and access["status"] == 404 and access["method"] == "GET", access


def test_the_worker_logs_from_its_first_line_in_json(redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "FISHER_ATLAS_MODEL": str(tiny_model_dir), "FISHER_ATLAS_SKETCH_DIM": "128",
           "FISHER_ATLAS_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "FISHER_ATLAS_QUEUE": "celery",
           "FISHER_ATLAS_REDIS_URL": redis_url, "FISHER_ATLAS_CELERY_QUEUE": f"fa_logs_{os.getpid()}",
           "OMP_NUM_THREADS": "1"}
    log = tmp_path / "worker.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "worker", "--data-dir", str(tmp_path / "data"),
                                 "--log-format", "json"], env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while "ready." not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        finally:
            # SIGHUP stops it as SIGTERM does (Celery restarted a worker whose output is not a terminal: a review)
            os.killpg(proc.pid, signal.SIGHUP)
            try:
                assert proc.wait(timeout=30) == 0
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
    assert "Warm shutdown" in log.read_text() and "Restarting" not in log.read_text()
    # every line an object but Celery's own shutdown notice (printed, not logged)
    said = [line for line in log.read_text().splitlines() if line.strip() and "Warm shutdown" not in line]
    lines = [json.loads(line) for line in said]
    assert lines[0]["logger"] == "workers.celery_app" and "serves model" in lines[0]["message"], lines[0]
    assert any(x["logger"].startswith("celery") and x["message"].endswith("ready.") for x in lines), lines


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_an_unknown_log_format_is_a_usage_error(command: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--data-dir", str(tmp_path / "data"), "--log-format", "xml"]) == 2
    err = capsys.readouterr().err
    assert "--log-format (FISHER_ATLAS_LOG_FORMAT) must be one of text, json, not 'xml'" in err, err
    assert not (tmp_path / "data").exists()
