"""The ``fisher-atlas`` CLI against a live service (user commands) and a database (keys, migrate)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service.cli import main

PROSE = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs.",
         "The brown fox and the dog are friends.", "The fox jumps over the fence by the road."]
CODE = ["def add(a, b):\n    return a + b\n", "def sub(a, b):\n    return a - b\n",
        "for i in range(3):\n    print(i)\n"]


def _jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_user_commands(serve, tiny_lm, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svc = serve(lm=tiny_lm)
    url = ["--url", svc.url]
    assert main(["add", "prose", str(_jsonl(tmp_path / "p.jsonl", PROSE)), "--wait", *url,
                 "--metadata", '{"domain": "prose"}']) == 0
    err = capsys.readouterr().err
    assert "prose [" in err and "samples" in err and "succeeded" in err  # the progress bar
    assert main(["add", "code", str(_jsonl(tmp_path / "c.jsonl", CODE)), "--wait", *url]) == 0
    assert main(["append", "code", str(_jsonl(tmp_path / "c2.jsonl", ["x = 1\n"])), "--wait", *url]) == 0
    capsys.readouterr()

    assert main(["route", "The lazy fox", "-k", "2", *url]) == 0
    out = capsys.readouterr().out
    assert "prose" in out and "code" in out
    assert main(["route", "The lazy fox", "-k", "1", "--json", *url]) == 0
    assert json.loads(capsys.readouterr().out)["matches"][0]["name"] in ("prose", "code")
    assert main(["recommend", "prose", "-k", "1", *url]) == 0
    assert "sources for prose" in capsys.readouterr().out
    assert main(["align", "prose", "code", "--json", *url]) == 0
    pair = json.loads(capsys.readouterr().out)
    assert {"fisher", "fisher_shrunk", "activation", "error", "rho", "se", "activation_dark"} <= set(pair)

    png, svg = tmp_path / "atlas.png", tmp_path / "atlas.svg"
    assert main(["atlas", "--out", str(png), *url]) == 0
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert main(["atlas", "--out", str(svg), *url]) == 0
    assert b"<svg" in svg.read_bytes() and b"prose" in svg.read_bytes()

    export = tmp_path / "space.jsonl"
    assert main(["export", str(export), *url]) == 0
    other = serve(lm=tiny_lm)
    assert main(["import", str(export), "--url", other.url]) == 0
    assert "imported 2 tasks" in capsys.readouterr().out
    assert main(["import", str(export), "--url", other.url]) == 1  # conflict, reported on stderr
    assert "409 conflict" in capsys.readouterr().err
    assert main(["import", str(export), "--on-conflict", "skip", "--url", other.url]) == 0

    # errors are one line on stderr with the service's code, exit status 1
    assert main(["recommend", "nope", *url]) == 1
    assert "404 not_found" in capsys.readouterr().err
    assert main(["route", "x", "--url", "http://127.0.0.1:9"]) == 1


def test_keys_and_migrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = ["--data-dir", str(tmp_path)]
    assert main(["migrate", *data]) == 0
    assert "latest schema revision" in capsys.readouterr().out
    assert main(["keys", "create", "--name", "ops", "--scopes", "read,write", "--json", *data]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["key"].startswith("fa_") and created["scopes"] == ["read", "write"]
    assert main(["keys", "list", *data]) == 0
    listing = capsys.readouterr().out
    assert "ops" in listing and created["key"] not in listing
    assert main(["keys", "revoke", str(created["id"]), *data]) == 0
    assert "revoked key" in capsys.readouterr().out
    assert main(["keys", "list", "--json", *data]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["keys", "create", "--name", "bad", "--scopes", "root", *data]) == 1
    assert main(["keys", "revoke", "999", *data]) == 1


def test_serve_command_starts_and_answers(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``fisher-atlas serve`` as a user runs it: a subprocess on a free port, env twins for the rest."""
    from tests.service.conftest import free_port

    port = free_port()
    env = {"FISHER_ATLAS_MODEL": str(tiny_model_dir), "FISHER_ATLAS_SKETCH_DIM": "128", "FISHER_ATLAS_DEVICE": "cpu",
           "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--data-dir", str(tmp_path / "d"),
         "--log-level", "warning"],
        env=env, cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        import time

        deadline = time.monotonic() + 90
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.3)
        assert r.json()["ready"] is True
        assert (tmp_path / "d" / "atlas.sqlite").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
