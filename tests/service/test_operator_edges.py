"""Edges an operator meets upgrading, restoring and moving a store (a review as an operator, 2026-12-07); each case
failed before its fix.

* An index rebuilt at start because its files were corrupt was logged at INFO, and ``serve`` wrote none of the
  service's own logs: the rebuild went unsaid.
* ``keys list --local`` / ``keys revoke --local`` upgraded an old store's schema (under the old replicas of a rolling
  upgrade) — and, under a mistyped ``--data-dir``, made a new store.
* An import into a service that cannot sketch in the imported space (another model or sketch dimension) said only
  "imported", and its tasks then received no prompt.
* ``serve`` on a port in use loaded its model before uvicorn's bind failed.
* A SQLite database that cannot be written (its directory read-only) was named only by SQLite's "attempt to write a
  readonly database".
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli import main

PROSE = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs.",
         "The brown fox and the dog are friends.", "The fox jumps over the fence by the road."]


def _add_ready(url: str, name: str = "prose") -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        r = http.post("/v1/tasks", json={"name": name, "samples": [{"text": t} for t in PROSE]})
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 120
        while http.get(f"/v1/tasks/{r.json()['task']['id']}").json()["status"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_a_corrupt_index_is_rebuilt_with_a_warning_that_serve_writes(serve: Any, tiny_lm: Any, tiny_model_dir: Path,
                                                                     tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from tests.service.conftest import free_port, wait_ready

    data = tmp_path / "data"
    first = serve(lm=tiny_lm, data_dir=data, sketch_dim=128)
    _add_ready(first.url)
    with caplog.at_level(logging.INFO, logger="atlas.index"):
        first.server.stop()  # saves the index
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "rebuilt" in r.getMessage()]
    (index,) = (data / "index").glob("space-*.faiss")
    index.write_bytes(b"\0" * 64 + index.read_bytes()[64:])  # corrupt, as a half-written or damaged file
    port = free_port()
    env = {"FISHER_ATLAS_MODEL": str(tiny_model_dir), "FISHER_ATLAS_SKETCH_DIM": "128", "FISHER_ATLAS_DEVICE": "cpu",
           "FISHER_ATLAS_PORT": str(port), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(data)], env=env,
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_ready(port, proc, 90)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            r = http.post("/v1/route", json={"prompt": "The lazy fox and the dog."})
            assert r.status_code == 200 and r.json()["matches"][0]["name"] == "prose", r.text  # rebuilt from SQL
            rid = r.headers["x-request-id"]  # each answer's id, and its access line's (below)
            given = http.get("/v1/tasks/999", headers={"X-Request-ID": "client-id.42"})
            forged = http.get("/v1/tasks", headers={"X-Request-ID": "bad id] 200 [x"})  # a forged log line
            assert given.status_code == 404 and given.headers["x-request-id"] == "client-id.42"
            assert len(forged.headers["x-request-id"]) == 16 and " " not in forged.headers["x-request-id"]
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    said = err.decode()
    assert "WARNING:     atlas.index: index of space 1: rebuilt (checksum mismatch" in said, said[-3000:]
    assert "INFO:     workers.calibration" not in said or "routing calibrated" in said  # the app's own loggers
    # every line starts with its time, uvicorn's own and access lines too (an operations review, 2026-12-07)
    import re

    stamped = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR|DEBUG|CRITICAL)")
    lines = [ln for ln in (said + out.decode()).splitlines()
             if re.match(r"^\S*(INFO|WARNING|ERROR)", ln) or stamped.match(ln)]
    assert lines and all(stamped.match(ln) for ln in lines), lines[:5]
    assert any(f'"POST /v1/route HTTP/1.1" 200 OK [{rid}]' in ln for ln in lines), lines[-5:]  # an access line
    assert any('"GET /v1/tasks/999 HTTP/1.1" 404 Not Found [client-id.42]' in ln for ln in lines), lines[-5:]


def test_a_log_level_uvicorn_does_not_know_is_a_usage_error(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``--log-level verbose`` was a 60-line traceback (uvicorn's KeyError), after the database was migrated."""
    from service.cli import main

    assert main(["serve", "--data-dir", str(tmp_path / "data"), "--log-level", "verbose"]) == 2
    err = capsys.readouterr().err
    assert "--log-level (FISHER_ATLAS_LOG_LEVEL) must be one of critical, error, warning, info" in err
    assert "Traceback" not in err and not (tmp_path / "data").exists()


def test_serve_on_a_port_in_use_stops_before_loading_its_model(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        assert main(["serve", "--port", str(port), "--data-dir", str(tmp_path / "d"),
                     "--model", str(tmp_path / "no-such-model")]) == 3
        assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose --port" in err, err


def test_keys_list_local_reads_an_old_schema_without_upgrading_it(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import migrations

    data = tmp_path / "d"
    assert main(["keys", "create", "--local", "--name", "root", "--scopes", "admin", "--data-dir", str(data)]) == 0
    url = f"sqlite:///{data / 'atlas.sqlite'}"
    head = migrations.head_revision()
    assert migrations.current_revision(url) == head
    migrations.downgrade(url, "0011")
    capsys.readouterr()
    for argv in (["keys", "list"], ["keys", "revoke", "1"]):
        assert main([*argv, "--local", "--data-dir", str(data)]) == 1
        err = capsys.readouterr().err
        assert "schema revision 0011" in err and "fisher-atlas migrate" in err, err
        assert migrations.current_revision(url) == "0011"  # not upgraded under the old replicas
    assert main(["migrate", "--data-dir", str(data)]) == 0
    assert main(["keys", "list", "--local", "--data-dir", str(data)]) == 0
    assert "root" in capsys.readouterr().out


def test_an_import_into_a_space_this_service_cannot_serve_says_so(serve: Any, tiny_lm: Any, tiny_model_dir: Path,
                                                                  tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    source = serve(lm=tiny_lm, sketch_dim=256)
    _add_ready(source.url)
    export = tmp_path / "space.jsonl"
    assert main(["export", str(export), "--url", source.url]) == 0
    same = serve(lm=tiny_lm, sketch_dim=256)
    other = serve(lm=tiny_lm, sketch_dim=128)  # another sketch dimension: another space
    capsys.readouterr()
    assert main(["import", str(export), "--url", same.url, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["served"] is True and "warning" not in out.err
    assert main(["import", str(export), "--url", other.url, "--json"]) == 0
    out = capsys.readouterr()
    answer = json.loads(out.out)
    assert answer["served"] is False and "is not served by this service" in answer["note"], answer
    assert "fisher-atlas: warning: space" in out.err
    with httpx.Client(base_url=other.url, timeout=60) as http:  # what the note is about
        r = http.post("/v1/route", json={"prompt": "The lazy fox.", "space": str(answer["space_id"])})
        assert r.status_code == 409, r.text
    from fisher_atlas import Atlas

    for dim, warned in ((256, False), (128, True)):  # library mode: the same note, as a warning
        with Atlas(tmp_path / f"lib-{dim}", model=str(tiny_model_dir), sketch_dim=dim, device="cpu") as atlas:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert atlas.import_(export) == 1
            assert any("is not served by this service" in str(w.message) for w in caught) is warned


def test_an_unwritable_sqlite_database_says_what_must_be_writable(tmp_path: Path) -> None:
    import sqlite3

    from atlas.errors import DatabaseUnavailable
    from migrations import upgrade

    path = tmp_path / "atlas.sqlite"
    sqlite3.connect(path).close()  # an empty database, opened read-only below as a read-only directory leaves it
    with pytest.raises(DatabaseUnavailable) as err:
        upgrade(f"sqlite:///file:{path}?mode=ro&uri=true")
    assert "readonly database" in err.value.message and "directory must both be writable" in err.value.message
