"""The Parquet reader of uploads (:func:`atlas.sample_io.read_samples`): the mode's columns only, bounded before they
are decoded (declared and decoded sizes, each value's length)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from atlas.errors import InvalidInput, PayloadTooLarge
from atlas.parquet_pages import declared_page_bytes
from atlas.sample_limits import SampleCounter
from atlas.samples import Mode, check_columns, mode_fields, record_values

PARQUET_BATCH_ROWS = 64
"""Rows decoded per Parquet batch (bounds the memory of one batch)."""


def read_parquet(stream: IO[bytes], filename: str, mode: Mode, counter: SampleCounter) -> Iterator[tuple[str, ...]]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    keys = list(mode_fields(mode))
    lim = counter.limits
    try:  # the columns first: read_dictionary raises a bare KeyError for a column the file lacks, or a nested one
        schema = pq.read_schema(stream)
        check_columns(schema.names, mode, filename, "columns")
        for k in keys:  # (a list<string> column read as "not a readable Parquet file: b'text'")
            _check_string_type(schema.field(k).type, filename, k)
        stream.seek(0)
        # dictionary pages stay dictionaries until checked; a page whose checksum fails is refused (a flipped byte of
        # a data page was stored as altered text)
        pf = pq.ParquetFile(stream, read_dictionary=keys, page_checksum_verification=True)
        md = pf.metadata
        if md.num_rows > lim.max_samples:
            raise PayloadTooLarge(f"{filename}: {md.num_rows} rows exceed the limit of {lim.max_samples} samples",
                                  {"rows": md.num_rows, "max_samples": lim.max_samples})
        declared = 0
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            for c in range(rg.num_columns):
                col = rg.column(c)
                if col.path_in_schema in keys:  # a path that is not UTF-8 raised here, outside the try: a 500
                    declared += max(int(col.total_uncompressed_size), 0)
    except (InvalidInput, PayloadTooLarge):
        raise
    except Exception as exc:  # pyarrow raises many types for a damaged footer
        raise InvalidInput(f"{filename}: not a readable Parquet file: {short_error(exc)}") from None
    if declared <= lim.max_bytes:  # the footer's sum may lie: what the page headers declare, before any is decoded
        declared = max(declared, declared_page_bytes(stream, md, keys, filename))
    if declared > lim.max_bytes:
        raise PayloadTooLarge(f"{filename}: the columns hold {declared} bytes uncompressed; the limit is "
                              f"{lim.max_bytes}", {"bytes": declared, "max_bytes": lim.max_bytes})
    decoded = 0
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=keys, use_threads=False):
            for k in keys:
                lengths = _value_bytes(batch.column(k), filename, k)
                longest = int(pc.max(lengths).as_py() or 0) if len(lengths) else 0
                if longest > 4 * lim.max_sample_chars:
                    raise PayloadTooLarge(f"{filename}: a value of column {k!r} near row {row + 1} has {longest} "
                                          f"bytes; the limit is {lim.max_sample_chars} characters",
                                          {"max_sample_chars": lim.max_sample_chars, "row": row + 1})
                decoded += int(pc.sum(lengths).as_py() or 0)
                if decoded > lim.max_bytes:
                    raise PayloadTooLarge(f"{filename}: the decoded columns exceed {lim.max_bytes} bytes "
                                          f"(at row {row + 1})", {"max_bytes": lim.max_bytes, "row": row + 1})
            for record in batch.select(keys).to_pylist():
                row += 1
                where = f"{filename}: row {row}"
                yield counter.add(record_values(record, mode, where), where)
    except (InvalidInput, PayloadTooLarge):
        raise
    except Exception as exc:
        raise InvalidInput(f"{filename}: unreadable Parquet data near row {row + 1}: {short_error(exc)}") from None
    if row != md.num_rows:  # a column chunk that declares fewer values than its row group lost those rows silently
        raise InvalidInput(f"{filename}: not a readable Parquet file: its footer declares {md.num_rows} rows, its "
                           f"columns hold {row}", {"rows": md.num_rows, "read": row})


def _check_string_type(arrow_type: Any, filename: str, key: str) -> None:
    """Raise ``InvalidInput`` unless a column of ``arrow_type`` holds strings (or only nulls), naming the type the
    file declares (a dictionary column by its values' type: "binary", not "dictionary<values=binary, …>")."""
    import pyarrow as pa

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t)):
        raise InvalidInput(f"{filename}: column {key!r} must hold strings, not {t}", {"column": key, "type": str(t)})


def _value_bytes(col: Any, filename: str, key: str) -> Any:
    """Byte length of every value of a string column, without decoding dictionary columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    _check_string_type(col.type, filename, key)
    if pa.types.is_dictionary(col.type):
        return pc.take(pc.binary_length(col.dictionary), col.indices)
    return pc.binary_length(col) if not pa.types.is_null(col.type) else pa.array([], pa.int64())


def short_error(exc: BaseException, n: int = 300) -> str:
    """An exception's text, cut at ``n`` characters."""
    text = str(exc)
    return text if len(text) <= n else text[:n] + "…"
