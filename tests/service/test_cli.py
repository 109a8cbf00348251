"""The ``fisher-atlas`` CLI over real HTTP with API keys on: every command, its ``--json`` output, its errors.

Also the figures (matplotlib, read back: PNG/SVG/PDF of real content, task names in the SVG text) and the
``keys --local`` bootstrap of the first admin key.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli import main

PROSE = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs.",
         "The brown fox and the dog are friends.", "The fox jumps over the fence by the road."]
CODE = ["def add(a, b):\n    return a + b\n", "def sub(a, b):\n    return a - b\n",
        "for i in range(3):\n    print(i)\n"]
MATH = ["one plus one is two", "two times three is six", "seven minus four is three", "ten over five is two"]


def _jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


def test_cli_matrix_with_keys(serve: Any, tiny_lm: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    # Bootstrap: the first admin key, straight into the database, before the server runs.
    assert main(["keys", "create", "--local", "--name", "root", "--scopes", "admin", "--json",
                 "--data-dir", str(data)]) == 0
    admin = _json(capsys)["key"]
    svc = serve(lm=tiny_lm, data_dir=data, require_keys=True)
    url = ["--url", svc.url, "--api-key", admin]
    assert main(["tasks", "list", "--url", svc.url]) == 1
    err = capsys.readouterr().err
    assert "401 unauthorized" in err and "pass a key with --api-key or set FISHER_ATLAS_API_KEY" in err  # what to do

    # keys over the API
    assert main(["keys", "create", "--name", "ops", "--scopes", "read,write", "--json", *url]) == 0
    ops = _json(capsys)
    assert ops["key"].startswith("fa_") and ops["scopes"] == ["read", "write"]
    assert main(["keys", "list", *url]) == 0
    listing = capsys.readouterr().out
    assert "ops" in listing and "root" in listing and ops["key"] not in listing
    write = ["--url", svc.url, "--api-key", ops["key"]]
    assert main(["keys", "current", *write]) == 0  # who am I: any key may ask
    assert capsys.readouterr().out.strip() == f"key {ops['id']} (ops): scopes read,write"

    assert main(["add", "prose", str(_jsonl(tmp_path / "p.jsonl", PROSE)), "--wait", *write,
                 "--metadata", '{"domain": "prose"}']) == 0
    err = capsys.readouterr().err
    # progress: the final line in full off a terminal (rich's 80 columns cut "4/4" to "4…" and the rates before)
    assert "prose " in err and "4/4 samples" in err and "tokens" in err and "tok/s" in err and "succeeded" in err
    assert main(["add", "code", str(_jsonl(tmp_path / "c.jsonl", CODE)), "--wait", "--json", *write]) == 0
    assert _json(capsys)["job"]["status"] == "succeeded"
    assert main(["add", "math", str(_jsonl(tmp_path / "m.jsonl", MATH)), "--wait", *write]) == 0
    assert main(["append", "code", str(_jsonl(tmp_path / "c2.jsonl", ["x = 1\n"])), "--wait", *write]) == 0
    capsys.readouterr()

    assert main(["tasks", "list", "--json", *url]) == 0
    assert {t["name"] for t in _json(capsys)["items"]} == {"prose", "code", "math"}
    assert main(["tasks", "show", "code", "--json", *url]) == 0
    assert _json(capsys)["n_samples"] == 4
    assert main(["jobs", "list", "--task", "code", "--json", *url]) == 0
    jobs = _json(capsys)["items"]
    assert [j["kind"] for j in jobs] == ["append", "create"]
    assert main(["jobs", "show", str(jobs[0]["id"]), *url]) == 0
    out = capsys.readouterr().out
    assert "succeeded" in out and "tokens streamed (" in out and "counted" in out  # not counted tokens per second
    assert main(["jobs", "cancel", str(jobs[0]["id"]), "--json", *url]) == 0  # finished: returned unchanged
    assert _json(capsys)["status"] == "succeeded"
    assert main(["jobs", "cancel", str(jobs[0]["id"]), *url]) == 0
    assert "it had already ended: nothing to cancel" in capsys.readouterr().out

    assert main(["route", "The lazy fox", "-k", "2", *url]) == 0
    out = capsys.readouterr().out
    assert "prose" in out and "lexical" in out.splitlines()[0]  # the stored terms are fused in
    assert ("\nanswer: " in out or "\nnone: " in out) and "score: route score, a cosine in [-1, 1]" in out  # a legend
    assert main(["route", "The lazy fox", "-k", "1", "--json", *url]) == 0
    assert _json(capsys)["matches"][0]["name"] in ("prose", "code", "math")
    assert main(["route", "   ", *url]) == 1  # one prompt: no "prompt 0" in the message
    err = capsys.readouterr().err
    assert err.startswith("fisher-atlas: 422 invalid_input: ") and "prompt 0" not in err, err
    assert main(["align", "prose", "code", "--json", *url]) == 0
    assert {"fisher", "fisher_shrunk", "activation", "error", "rho", "se", "activation_dark", "flags"} <= set(
        _json(capsys))
    assert main(["align", "prose", "prose", *url]) == 0  # a task with itself: the estimator says so
    (flags,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("flags:")]
    assert "identical" in flags.split(":", 1)[1].split(", ")

    # figures
    png, svg, pdf = tmp_path / "atlas.png", tmp_path / "atlas.svg", tmp_path / "heat.pdf"
    assert main(["atlas", "--out", str(png), *url]) == 0 and main(["atlas", "--out", str(svg), *url]) == 0
    assert main(["matrix", "--out", str(pdf), *url]) == 0
    heat = tmp_path / "heat.svg"
    assert main(["matrix", "prose", "code", "math", "--out", str(heat), *url]) == 0
    bars = tmp_path / "factors.png"
    assert main(["recommend", "prose", "-k", "2", "--plot", str(bars), *url]) == 0
    assert "sources for prose" in capsys.readouterr().out
    _check_png(png)
    _check_png(bars)
    for f in (svg, heat):
        text = f.read_text()
        assert "<svg" in text and all(name in text for name in ("prose", "code", "math")), f
    assert pdf.read_bytes().startswith(b"%PDF")
    assert main(["atlas", "--out", str(tmp_path / "atlas.gif"), *url]) == 2
    assert "use one of .png, .svg, .pdf" in capsys.readouterr().err
    assert not (tmp_path / "atlas.gif").exists()

    export = tmp_path / "space.jsonl"
    assert main(["export", str(export), *url]) == 0
    other = serve(lm=tiny_lm)
    assert main(["import", str(export), "--url", other.url]) == 0
    assert "imported 3 tasks" in capsys.readouterr().out
    assert main(["import", str(export), "--url", other.url]) == 1  # conflict, one line on stderr
    err = capsys.readouterr().err
    assert "409 conflict" in err and "(CLI: --on-conflict skip) to leave those tasks out" in err  # and the way on
    assert main(["import", str(export), "--on-conflict", "skip", "--url", other.url]) == 0

    assert main(["tasks", "delete", "math", "--yes", *write]) == 0
    assert main(["tasks", "show", "math", *url]) == 1
    assert "404 not_found" in capsys.readouterr().err
    assert main(["keys", "revoke", str(ops["id"]), *url]) == 0
    assert main(["tasks", "list", *write]) == 1
    assert "401" in capsys.readouterr().err
    # --all lists the revoked key over the API too (it was honoured with --local only, silently ignored here)
    for flags, listed in (([], False), (["--all"], True)):
        assert main(["keys", "list", "--json", *flags, *url]) == 0
        rows = {k["id"]: k for k in json.loads(capsys.readouterr().out)}
        assert (ops["id"] in rows) is listed and (not listed or rows[ops["id"]]["revoked"] is True)
    assert main(["route", "x", "--url", "http://127.0.0.1:9"]) == 3  # unreachable: may work later
    assert main(["add"]) == 2  # usage error


def _check_png(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG" and im.width > 300 and im.height > 200
        colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 20  # drawn, not blank


def test_local_keys_and_migrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import migrations

    data = ["--data-dir", str(tmp_path)]
    head = migrations.head_revision()
    assert main(["migrate", *data]) == 0
    assert f"latest schema revision, {head} (created)" in capsys.readouterr().out
    # what it did, said (an upgrade review, 2026-12-07: the same sentence whether it ran ten revisions or none)
    migrations.downgrade(f"sqlite:///{tmp_path / 'atlas.sqlite'}", "0011")
    assert main(["migrate", *data]) == 0
    assert f"{head} (upgraded from 0011)" in capsys.readouterr().out
    assert main(["migrate", *data]) == 0
    assert f"{head} (was at it already)" in capsys.readouterr().out
    elsewhere = ["--database-url", f"sqlite:///{tmp_path / 'other.sqlite'}", "--data-dir", str(tmp_path / "new")]
    for said in ("created", "was at it already"):  # a database of its own: "created" twice, before
        assert main(["migrate", *elsewhere]) == 0
        assert f"{head} ({said})" in capsys.readouterr().out
    assert main(["keys", "create", "--local", "--name", "ops", "--scopes", "read,write", "--json", *data]) == 0
    created = _json(capsys)
    assert main(["keys", "list", "--local", *data]) == 0
    assert "ops" in capsys.readouterr().out
    assert main(["keys", "revoke", "--local", str(created["id"]), *data]) == 0
    assert "revoked key" in capsys.readouterr().out
    assert main(["keys", "list", "--local", "--json", *data]) == 0
    assert _json(capsys) == []
    assert main(["keys", "create", "--local", "--name", "bad", "--scopes", "root", *data]) == 1
    assert main(["keys", "revoke", "--local", "999", *data]) == 1


def test_serve_command_starts_and_answers(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``fisher-atlas serve`` as a user runs it: a subprocess on a free port, env twins for the rest."""
    from tests.service.conftest import free_port

    port = free_port()
    env = {"FISHER_ATLAS_MODEL": str(tiny_model_dir), "FISHER_ATLAS_SKETCH_DIM": "128", "FISHER_ATLAS_DEVICE": "cpu",
           "FISHER_ATLAS_PORT": str(port), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path / "d"), "--log-level", "warning"],
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
