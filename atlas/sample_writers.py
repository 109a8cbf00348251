"""Sample writers, the inverse of :mod:`atlas.sample_io`'s readers: JSON Lines (the store's format, with
:func:`decode_jsonl`), CSV, Parquet and plain text. Used by the store, tests and benchmarks; a sample one of them
writes is read back unchanged by :func:`atlas.sample_io.read_samples` (plain text holds only samples that
:func:`text_representable` accepts)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable

from atlas.samples import Mode, Sample, mode_fields


def _fields(mode: Mode) -> list[str]:
    return list(mode_fields(mode))


def write_jsonl(samples: Iterable[Sample]) -> bytes:
    """JSON Lines, one ``Sample.canonical_json()`` per line (non-ASCII kept raw, as UTF-8)."""
    return "".join(s.canonical_json() + "\n" for s in samples).encode("utf-8")


def write_csv(samples: Iterable[Sample], mode: Mode) -> bytes:
    """CSV with a header row (``csv`` module, minimal quoting)."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    keys = _fields(mode)
    writer.writerow(keys)
    for s in samples:
        writer.writerow([getattr(s, k) for k in keys])
    return buf.getvalue().encode("utf-8")


def write_parquet(samples: Iterable[Sample], mode: Mode, *, compression: str = "zstd") -> bytes:
    """Parquet with one string column per field (pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = _fields(mode)
    rows = list(samples)
    table = pa.table({k: pa.array([getattr(s, k) for s in rows], type=pa.string()) for k in keys})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression=compression)
    return buf.getvalue()


def text_representable(sample: Sample) -> bool:
    """Whether plain text can hold this sample on one line."""
    t = sample.text
    return (t is not None and "\n" not in t and not t.endswith("\r") and bool(t.strip())
            and not t.startswith("\ufeff"))  # a leading U+FEFF on line 1 reads as a byte-order mark


def write_text(samples: Iterable[Sample]) -> bytes:
    """Plain text, one sample per line; ``ValueError`` for a sample that is not representable."""
    out = []
    for i, s in enumerate(samples):
        if not text_representable(s):
            raise ValueError(f"sample {i} cannot be written as one line of plain text")
        out.append(s.text or "")
    return "".join(t + "\n" for t in out).encode("utf-8")


def decode_jsonl(data: bytes) -> list[Sample]:
    """Samples of trusted canonical JSON Lines (the store's format), split on ``"\\n"`` only."""
    return [Sample.model_validate_json(line) for line in data.split(b"\n") if line.strip()]
