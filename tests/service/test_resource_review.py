"""Found by a resource-exhaustion review (2026-12-07), against real SQLite files and a real service.

* A large upload held SQLite's write lock while it was serialised, hashed and compressed (about 7 s for 53 MB):
  other writers' 5 s busy timeout ran out, and concurrent uploads admitted by the upload slots got 503.
* A full temporary directory (uploads over 1 MB are spooled to ``TMPDIR``) answered uploads and imports 500; too
  many open files while a body was read answered 422 "error parsing the body", logged nowhere.
"""

from __future__ import annotations

import errno
import json
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import atlas.upload_repository as uploads
from fisher_atlas import Atlas


def test_an_upload_is_encoded_before_its_write_transaction_takes_the_lock(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "atlas"
    seen: list[bool] = []
    write_jsonl = uploads.write_jsonl

    def encode_and_probe(samples: Any) -> bytes:
        probe = sqlite3.connect(data / "atlas.sqlite", timeout=0)  # another writer, not waiting at all
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            seen.append(True)
        except sqlite3.OperationalError as exc:  # "database is locked": the upload's transaction holds it
            seen.append(False)
            assert "locked" in str(exc)
        finally:
            probe.close()
        return write_jsonl(samples)

    with Atlas(data, model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("first", [f"alpha beta gamma sample {i}" for i in range(8)], progress=False)
        monkeypatch.setattr(uploads, "write_jsonl", encode_and_probe)
        seen.clear()
        atlas.add("second", [f"delta epsilon zeta sample {i}" for i in range(8)], progress=False)
        atlas.append("second", [f"eta theta iota sample {i}" for i in range(8)], progress=False)
    assert seen and all(seen), seen  # every encoding ran while another writer could still write


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, filled (a real ENOSPC on every write); skipped where mounting is not permitted."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        with open(mount / "filler", "wb") as fh:
            try:
                while True:
                    fh.write(b"x" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_temporary_directory_is_a_507_naming_it_and_nothing_is_stored(
        serve: Any, tiny_lm: Any, full_tmpfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = serve(lm=tiny_lm)
    monkeypatch.setattr(tempfile, "tempdir", str(full_tmpfs))  # TMPDIR of the serving process
    big = "".join(json.dumps({"text": f"sample {i} " + "word " * 40}) + "\n" for i in range(6000)).encode()
    assert len(big) > 1 << 20  # spooled to the temporary directory
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        r = http.post("/v1/tasks", data={"name": "big"}, files={"file": ("big.jsonl", big, "application/jsonl")})
        assert r.status_code == 507, r.text
        assert r.json()["code"] == "insufficient_storage" and "TMPDIR" in r.json()["message"]
        assert int(r.headers["Retry-After"]) >= 1
        r = http.post("/v1/spaces/import", files={"file": ("x.jsonl", big, "application/jsonl")})
        assert r.status_code == 507, r.text
        monkeypatch.undo()  # space again: the same upload is stored
        assert http.get("/v1/tasks").json()["total"] == 0
        r = http.post("/v1/tasks", data={"name": "big"}, files={"file": ("big.jsonl", big, "application/jsonl")})
        assert r.status_code == 202, r.text


def test_the_server_s_own_os_errors_are_named_not_blamed_on_the_body() -> None:
    from service.errors import os_error

    with pytest.raises(OSError) as full, open("/dev/full", "wb") as fh:
        fh.write(b"x")
        fh.flush()
    assert os_error(full.value) is not None and os_error(full.value).status_code == 507  # type: ignore[union-attr]
    files = os_error(OSError(errno.EMFILE, "Too many open files"))
    assert files is not None and files.status_code == 503 and files.retry_after_s
    assert os_error(OSError(errno.EACCES, "Permission denied")) is None  # not the server's to name: a 500
    assert os_error(ValueError("x")) is None


def test_running_out_of_open_files_is_told_from_a_storage_fault() -> None:
    """SQLite says "unable to open database file" when the process is out of descriptors too: it read as a storage
    fault (503, "the operator must make the data directory writable", Retry-After 60) for a condition of a moment."""
    import sys

    code = (
        "import os, resource\n"
        "from service.errors import near_open_file_limit\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "print(near_open_file_limit())\n"
        "held = []\n"
        "try:\n"
        "    while True:\n"
        "        held.append(os.open(os.devnull, os.O_RDONLY))\n"
        "except OSError:\n"
        "    pass\n"
        "print(near_open_file_limit())\n"
        "for fd in held[:20]:\n"
        "    os.close(fd)\n"
        "print(near_open_file_limit())\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "False"]
