"""Found by a resource-exhaustion review (2026-12-07), against real SQLite files and a real service.

* A large upload held SQLite's write lock while it was serialised, hashed and compressed (about 7 s for 53 MB):
  other writers' 5 s busy timeout ran out, and concurrent uploads admitted by the upload slots got 503.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

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
