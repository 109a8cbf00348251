"""Uploaded Parquet read in a child process: a crafted footer made pyarrow's C++ reader throw an exception it could not
turn into a Python error, and the uncaught ``parquet::ParquetException`` aborted the whole API process (SIGABRT, every
request and in-process job with it; a data-integrity review, 2026-12-07). A child that dies takes only the upload.

The parent writes one JSON line (``filename``, ``mode``, ``limits``) and then the file's bytes on the child's stdin;
the child answers one JSON object on stdout: ``{"values": [[...], ...]}`` or ``{"error": "invalid" | "too_large",
"message", "detail"}``. JSON, not pickle: the API process decodes nothing but data. The child runs ``python -P -m
atlas.parquet_child``: the server's working directory is not on its path (an ``atlas/`` folder there was imported).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from atlas.errors import InvalidInput, PayloadTooLarge
from atlas.sample_limits import SampleLimits
from atlas.samples import Mode

log = logging.getLogger(__name__)

CHILD_TIMEOUT_S = 300.0
"""Longest a child may take to read one upload (a 64 MiB file of small values takes seconds)."""


def read_parquet_isolated(data: bytes, filename: str, mode: Mode, limits: SampleLimits) -> list[tuple[str, ...]]:
    """:func:`atlas.sample_parquet.read_parquet` of ``data`` in a child process.

    Raises
    ------
    InvalidInput
        The file is not readable Parquet: its reader refused it, crashed on it (killed by a signal) or took over
        :data:`CHILD_TIMEOUT_S` (422).
    PayloadTooLarge
        A limit passed (413).
    RuntimeError
        The child could not run (this installation's fault, not the file's: a 500, its error logged).
    """
    package_root = str(Path(__file__).resolve().parents[1])  # importable as the parent imported it (tests, a checkout)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
           "OMP_NUM_THREADS": "1"}
    header = json.dumps({"filename": filename, "mode": mode, "limits": dataclasses.asdict(limits)}).encode()
    try:
        done = subprocess.run([sys.executable, "-P", "-m", "atlas.parquet_child"], input=header + b"\n" + data,
                              capture_output=True, env=env, timeout=CHILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise InvalidInput(f"{filename}: not a readable Parquet file: reading it took over {CHILD_TIMEOUT_S:.0f} s",
                           {"filename": filename}) from None
    try:  # an answer written whole stands, however the child ended after it
        answer = json.loads(done.stdout) if done.stdout else None
    except ValueError:
        answer = None
    if done.returncode < 0 and not isinstance(answer, dict):  # killed by a signal: the reader aborted on the file
        log.warning("the Parquet reader of %r crashed (signal %d): %s", filename, -done.returncode,
                    done.stderr[-500:].decode(errors="replace"))
        raise InvalidInput(f"{filename}: not a readable Parquet file: its reader crashed on it (signal "
                           f"{-done.returncode})", {"filename": filename})
    if not isinstance(answer, dict):
        raise RuntimeError(f"the Parquet reader process failed (exit status {done.returncode}): "
                           f"{done.stderr[-2000:].decode(errors='replace')}")
    if "values" in answer:
        return [tuple(v) for v in answer["values"]]
    kind = PayloadTooLarge if answer.get("error") == "too_large" else InvalidInput
    raise kind(str(answer.get("message")), answer.get("detail"))


def _child() -> None:
    """The child: read the request on stdin, answer on stdout (see the module docstring)."""
    from atlas.sample_limits import SampleCounter
    from atlas.sample_parquet import read_parquet, short_error

    header = json.loads(sys.stdin.buffer.readline())
    data = sys.stdin.buffer.read()
    filename, mode, limits = header["filename"], header["mode"], SampleLimits(**header["limits"])
    try:
        values = list(read_parquet(io.BytesIO(data), filename, mode, SampleCounter(limits, filename)))
        answer: dict[str, object] = {"values": values}
    except PayloadTooLarge as exc:
        answer = {"error": "too_large", "message": exc.message, "detail": exc.detail}
    except InvalidInput as exc:
        answer = {"error": "invalid", "message": exc.message, "detail": exc.detail}
    except Exception as exc:  # a reader error the checks did not turn into one: said as theirs are
        answer = {"error": "invalid", "message": f"{filename}: not a readable Parquet file: {short_error(exc)}",
                  "detail": None}
    sys.stdout.buffer.write(json.dumps(answer).encode())
    sys.stdout.buffer.flush()
    # no interpreter teardown: pyarrow's C++ threads ending with it aborted the child now and then ("terminate called
    # without an active exception", SIGABRT) after its answer was written, and a valid file was refused at random
    os._exit(0)


if __name__ == "__main__":
    _child()
