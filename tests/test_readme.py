"""README examples run as written against a real server.

The README's ``bash`` (CLI and curl) and ``python`` blocks are extracted and run, in the README's
order, against ``fisher-atlas serve`` started as a subprocess on a free port with the bundled model
(signatures of m = 1024 to keep the test short) and its default data directory under a temporary
working directory. The only change made
to the text is the port (``127.0.0.1:8000`` / ``localhost:8000`` → the test server's), and
``FISHER_ATLAS_URL`` is set to it as the default would be. Blocks preceded by ``<!-- no-ci -->``
(installing the package, running the suite) or ``<!-- library-example -->`` (library mode, run by
its own test) are skipped. Every command must succeed: bash runs with ``set -euo pipefail`` and curl
with ``--fail-with-body``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP_MARKERS = ("<!-- no-ci -->", "<!-- library-example -->")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def readme_blocks(text: str) -> list[tuple[str, str, bool]]:
    """``(language, code, skipped)`` of every fenced block, in order."""
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip().splitlines()
        skipped = bool(before) and before[-1].strip() in SKIP_MARKERS
        out.append((m.group(1), m.group(2), skipped))
    return out


def test_readme_blocks_are_found() -> None:
    blocks = readme_blocks(README.read_text())
    langs = [(lang, skipped) for lang, _, skipped in blocks]
    assert ("bash", True) in langs and ("bash", False) in langs and ("python", False) in langs
    run = [code for lang, code, skipped in blocks if not skipped]
    assert any("fisher-atlas add" in c for c in run) and any("AtlasClient" in c for c in run)
    assert all("from fisher_atlas import Atlas" not in c for c in run)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str], Path]]:
    from tests.service.conftest import free_port, wait_ready

    work = tmp_path_factory.mktemp("readme")
    (work / "examples").symlink_to(ROOT / "examples")
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FISHER_ATLAS_DEVICE": "cpu", "FISHER_ATLAS_SKETCH_DIM": "1024",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])}
    for name in ("FISHER_ATLAS_URL", "FISHER_ATLAS_API_KEY", "FISHER_ATLAS_SPACE", "FISHER_ATLAS_DATA_DIR",
                 "FISHER_ATLAS_DATABASE_URL", "FISHER_ATLAS_MODEL", "FISHER_ATLAS_QUEUE"):
        env.pop(name, None)
    log = (work / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--log-level", "warning"],
        env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, proc, 60, (work / "server.log").read_text)
        yield f"127.0.0.1:{port}", env, work
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_readme_examples_run_as_written(server: tuple[str, dict[str, str], Path]) -> None:
    hostport, env, work = server
    env = {**env, "FISHER_ATLAS_URL": f"http://{hostport}"}  # the README's default URL, on the test's port
    blocks = [(lang, code) for lang, code, skipped in readme_blocks(README.read_text()) if not skipped]
    for i, (lang, code) in enumerate(blocks):
        code = code.replace("127.0.0.1:8000", hostport).replace("localhost:8000", hostport)
        if lang == "bash":
            script = "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; echo; }\n" + code
            argv = ["bash", "-c", script]
        else:
            assert lang == "python", f"block {i}: unexpected language {lang!r}"
            argv = [sys.executable, "-c", code]
        started = time.monotonic()
        res = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=120)
        print(f"README block {i} ({lang}): {time.monotonic() - started:.1f} s")
        assert res.returncode == 0, f"README block {i} ({lang}) failed:\n{code}\n--- stdout\n{res.stdout}\n" \
                                    f"--- stderr\n{res.stderr[-4000:]}"
        assert "Traceback" not in res.stderr, res.stderr
    # the files the examples say they write are there and are what they claim
    assert (work / "atlas.png").read_bytes().startswith(b"\x89PNG")
    assert "<svg" in (work / "heatmap.svg").read_text()
    assert (work / "sources.png").read_bytes().startswith(b"\x89PNG")
    assert (work / "space.jsonl").stat().st_size > 0
