"""Crafted Parquet uploads (a data-integrity review, 2026-12-07), through a real server; each failed before its fix:

* one footer byte changed made pyarrow's C++ reader throw an exception it cannot turn into a Python error: the uncaught
  ``parquet::ParquetException`` aborted the API process (SIGABRT) — uploads are now read in a child process;
* a column path that is not UTF-8 answered 500 (a ``UnicodeDecodeError`` outside the reader's checks);
* a column chunk declaring fewer values than its row group lost those rows silently (202, 250 of 300 samples);
* a ``string_view`` column (valid UTF-8 text) was refused.

The byte offsets are found in the file pyarrow writes (its footer's ``text`` names), not hard-coded.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.service.conftest import wait_job

ROWS = 300


def _file() -> tuple[bytes, list[int]]:
    """A 300-row file of six row groups, and where its footer names the column ``text`` (schema first)."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"sample number {i} " * 5 for i in range(ROWS)]}), buf, row_group_size=50,
                   compression="snappy")
    data = buf.getvalue()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    return data, [i for i in range(footer, len(data)) if data[i:i + 4] == b"text"]


def _changed(data: bytes, at: int, value: int) -> bytes:
    out = bytearray(data)
    out[at] = value
    return bytes(out)


def _upload(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return http.post("/v1/tasks", data={"name": name}, files={"file": (f"{name}.parquet", data)})


def test_crafted_parquet_footers_are_refused_and_the_service_lives(serve: Any, tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm)
    data, names = _file()
    with httpx.Client(base_url=svc.url, timeout=120) as http:
        r = _upload(http, "aborts", _changed(data, names[0] - 4, 0x24))  # the reader aborted the process
        assert r.status_code == 422 and "not a readable Parquet file" in r.json()["message"], r.text
        r = _upload(http, "path", _changed(data, names[1], 0xFF))  # the first chunk's path: b"\xffext"
        assert r.status_code == 422 and "not a readable Parquet file" in r.json()["message"], r.text
        short = _changed(data, data.index(bytes([0x64]), names[1]), 0)  # row group 0's num_values 50 -> 0
        assert pq.ParquetFile(io.BytesIO(short)).metadata.row_group(0).column(0).num_values == 0
        r = _upload(http, "short", short)
        assert r.status_code == 422 and f"declares {ROWS} rows" in r.json()["message"], r.text
        assert http.get("/v1/tasks").json()["total"] == 0  # nothing stored of the three
        # the same process answers, and reads a whole file whole
        r = _upload(http, "whole", data)
        assert r.status_code == 202, r.text
        wait_job(http, r.json()["job"]["id"])
        assert http.get(f"/v1/tasks/{r.json()['task']['id']}").json()["n_samples"] == ROWS
        view = io.BytesIO()
        pq.write_table(pa.table({"text": pa.array(["a string view column", "of two rows"], pa.string_view())}), view)
        r = _upload(http, "view", view.getvalue())
        assert r.status_code == 202, r.text


def test_the_reader_process_never_imports_from_the_working_directory(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m atlas.parquet_child`` put the server's working directory first on the child's path: an ``atlas``
    folder there ran for every Parquet upload (a diff review, 2026-12-07). The child runs with ``-P``."""
    from atlas.parquet_child import read_parquet_isolated
    from atlas.sample_limits import SampleLimits

    (tmp_path / "atlas").mkdir()
    (tmp_path / "atlas" / "__init__.py").write_text("raise SystemExit('the wrong atlas was imported')\n")
    monkeypatch.chdir(tmp_path)
    data, _ = _file()
    assert len(read_parquet_isolated(data, "a.parquet", "text", SampleLimits())) == ROWS
