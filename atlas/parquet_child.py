"""Uploaded Parquet read in a child process: a crafted footer made pyarrow's C++ reader throw an exception it could not
turn into a Python error, and the uncaught ``parquet::ParquetException`` aborted the whole API process (SIGABRT, every
request and in-process job with it; a data-integrity review, 2026-12-07). A child that dies takes only the upload.

The parent sends ``(data, filename, mode, limits)`` pickled on the child's stdin; the child answers on stdout with
``("ok", values)`` or ``("error", kind, message, detail)`` pickled (``kind``: ``"invalid"`` 422 or ``"too_large"``
413). Run as ``python -m atlas.parquet_child``.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

from atlas.errors import InvalidInput, PayloadTooLarge
from atlas.sample_limits import SampleLimits
from atlas.samples import Mode

CHILD_TIMEOUT_S = 300.0
"""Longest a child may take to read one upload (a 64 MiB file of small values takes seconds)."""


def read_parquet_isolated(data: bytes, filename: str, mode: Mode, limits: SampleLimits) -> list[tuple[str, ...]]:
    """:func:`atlas.sample_parquet.read_parquet` of ``data`` in a child process.

    Raises
    ------
    InvalidInput
        The file is not readable Parquet — its reader raised, or crashed, or took over ``CHILD_TIMEOUT_S`` (422).
    PayloadTooLarge
        A limit passed (413).
    """
    package_root = str(Path(__file__).resolve().parents[1])  # importable as the parent imported it (tests, a checkout)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
           "OMP_NUM_THREADS": "1"}
    request = pickle.dumps((data, filename, mode, limits), protocol=pickle.HIGHEST_PROTOCOL)
    try:
        done = subprocess.run([sys.executable, "-m", "atlas.parquet_child"], input=request, capture_output=True,
                              env=env, timeout=CHILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise InvalidInput(f"{filename}: not a readable Parquet file: reading it took over {CHILD_TIMEOUT_S:.0f} s",
                           {"filename": filename}) from None
    if done.returncode != 0 or not done.stdout:
        raise InvalidInput(f"{filename}: not a readable Parquet file: its reader failed on it ({_how(done)})",
                           {"filename": filename})
    answer = pickle.loads(done.stdout)
    if answer[0] == "ok":
        return list(answer[1])
    _, kind, message, detail = answer
    raise (PayloadTooLarge if kind == "too_large" else InvalidInput)(message, detail)


def _how(done: subprocess.CompletedProcess[bytes]) -> str:
    """A child's end in words: its signal or exit status."""
    if done.returncode < 0:
        return f"it crashed with signal {-done.returncode}"
    return f"exit status {done.returncode}" if done.returncode else "no answer"


def _child() -> None:
    """The child: read the request on stdin, answer on stdout (see the module docstring)."""
    from atlas.sample_limits import SampleCounter
    from atlas.sample_parquet import read_parquet, short_error

    data, filename, mode, limits = pickle.loads(sys.stdin.buffer.read())
    try:
        values = list(read_parquet(io.BytesIO(data), filename, mode, SampleCounter(limits, filename)))
        answer: tuple[object, ...] = ("ok", values)
    except PayloadTooLarge as exc:
        answer = ("error", "too_large", exc.message, exc.detail)
    except InvalidInput as exc:
        answer = ("error", "invalid", exc.message, exc.detail)
    except Exception as exc:  # a reader error the checks did not turn into one: said as theirs are
        answer = ("error", "invalid", f"{filename}: not a readable Parquet file: {short_error(exc)}", None)
    sys.stdout.buffer.write(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _child()
