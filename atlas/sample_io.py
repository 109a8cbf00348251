"""One reader per sample format: JSON Lines, JSON, CSV, Parquet and plain text (their writers:
:mod:`atlas.sample_writers`).

Upload, the store (an upload's samples are kept as gzip JSON Lines), export and import all use these
functions and their writers, so a sample that one of them writes is read back unchanged by the others.

Rules every reader keeps:

* **Lines end at ``"\\n"`` only.** U+0085, U+2028, U+2029 and ``\\x1c``-``\\x1e`` are ordinary characters
  inside JSON strings (raw or escaped) and inside text lines; ``str.splitlines`` is never used. A
  ``"\\r"`` before the ``"\\n"`` (CRLF files) is dropped in plain text and is whitespace in JSON Lines. CSV and
  TSV rows too: a bare ``"\\r"`` inside a quoted field is kept, inside an unquoted one refused (422 naming the row:
  Python's ``csv`` ended the row there). Each line is decoded on its own, so invalid UTF-8 is named by its line.
* **Streaming with limits.** Records are read one at a time and the reader stops with
  :class:`~atlas.errors.PayloadTooLarge` (413) as soon as the sample count passes ``max_samples``, a
  sample passes ``max_sample_chars`` or the decoded content passes ``max_bytes`` (this also bounds
  decompression: Parquet pages, including zstd, and ``.gz`` files), so nothing much larger than the
  limits is ever held in memory.
* **Every parse error is a 4xx naming the line or row**: 422 :class:`~atlas.errors.InvalidInput` for
  malformed input (including JSON nested too deeply and unreadable Parquet), 413 for limits.
* **NUL characters in samples round-trip** on every database: samples are stored as compressed bytes,
  never in a text column. (Task names and metadata, which live in text/JSON columns, refuse NUL with
  422: see :func:`atlas.samples.check_metadata`.) Lone surrogates cannot be encoded as UTF-8 and are
  refused with 422.

Plain text holds one sample per line, so a text with ``"\\n"``, a trailing ``"\\r"``, a leading
U+FEFF (read as a byte-order mark) or only whitespace cannot be written as plain text
(:func:`atlas.sample_writers.write_text` raises ``ValueError``).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import IO, Any, cast

from atlas.errors import InvalidInput, PayloadTooLarge
from atlas.file_formats import check_plain_text, file_format
from atlas.json_bounds import MAX_JSON_VALUES, first_item_over, json_token_count, upload_value_limit
from atlas.parquet_child import read_parquet_isolated
from atlas.sample_limits import SampleCounter, SampleLimits
from atlas.samples import (
    Mode,
    RepeatedKeys,
    Sample,
    check_columns,
    json_object,
    mode_fields,
    record_values,
    sample_of,
)

__all__ = [
    "SampleLimits",
    "loads_json",
    "parse_upload",
    "read_samples",
]


# --------------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------------


def read_samples(source: bytes | IO[bytes], filename: str, mode: Mode,
                 limits: SampleLimits | None = None) -> list[Sample]:
    """Read an uploaded file into samples, by extension.

    ``.jsonl``/``.ndjson``/``.jsonlines``: one object per line; ``.json``: an array of objects (or
    ``{"samples": [...]}``); ``.csv``/``.tsv``: a header row and one row per sample (comma- or tab-separated);
    ``.parquet``: columns; ``.txt``/``.text`` or a name without a suffix (unless its first line is a JSON object):
    plain text, one sample per non-blank line (text mode only). A further ``.gz`` suffix means gzip. Any other
    suffix is refused: read as plain text, a ``.tsv`` kept its header and tabs and a ``.jsonlines`` its JSON syntax
    in every sample. Text mode reads ``text``; completion mode reads ``prompt`` and ``completion``.

    Raises
    ------
    InvalidInput
        Malformed input (422), naming the line or row; a file type that is not one of these.
    PayloadTooLarge
        A limit passed (413).
    """
    return [sample_of(v) for v in _read_values(source, filename, mode, limits)]


def _read_values(source: bytes | IO[bytes], filename: str, mode: Mode,
                 limits: SampleLimits | None = None) -> list[tuple[str, ...]]:
    lim = limits or SampleLimits()
    raw: IO[bytes] = io.BytesIO(source) if isinstance(source, bytes | bytearray | memoryview) else source
    fmt = file_format(filename)
    counter = SampleCounter(lim, filename)
    try:
        if filename.lower().endswith(".gz"):
            gz = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
            stream = io.BufferedReader(_BoundedReader(gz, lim.max_bytes, filename), 1 << 16)
        else:
            stream = io.BufferedReader(_BoundedReader(raw, lim.max_bytes, filename), 1 << 16)
        if fmt != "parquet":  # the file's first bytes, whatever its lines (a first line blank or of one character)
            _refuse_utf16(stream.peek(64)[:64], filename)
        if fmt == "parquet":  # in a child process (a crafted footer aborted the process that read it); the
            # compressed bytes are bounded by the upload, the decompressed ones by the reader
            return read_parquet_isolated(stream.read() if filename.lower().endswith(".gz") else raw.read(),
                                         filename, mode, lim)
        if fmt == "jsonl":
            return list(_read_jsonl(stream, filename, mode, counter))
        if fmt == "json":
            return _read_json(stream, filename, mode, counter)
        if fmt in ("csv", "tsv"):
            return list(_read_csv(stream, filename, mode, counter, delimiter="\t" if fmt == "tsv" else ","))
        if mode != "text":
            raise InvalidInput(
                f"{filename}: plain text uploads hold one text per line and need mode 'text'; "
                "use JSONL, CSV or Parquet with 'prompt' and 'completion' for mode 'completion'"
            )
        return list(_read_text(stream, filename, counter))
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise InvalidInput(f"{filename}: not a readable gzip file: {exc}") from None


class _BoundedReader(io.RawIOBase):
    """A binary reader that raises 413 once more than ``limit`` bytes were read."""

    def __init__(self, inner: IO[bytes], limit: int, filename: str) -> None:
        self.inner = inner
        self.limit = limit
        self.filename = filename
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.inner.read(len(b))
        n = len(data)
        self.total += n
        if self.total > self.limit:
            raise PayloadTooLarge(f"{self.filename}: the decoded content exceeds {self.limit} bytes",
                                  {"max_bytes": self.limit})
        b[:n] = data
        return n


def _lines(stream: IO[bytes], filename: str, max_line: int, max_blank: int, *,
           keep_ends: bool = False, max_chars: int | None = None) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line, split on ``b"\\n"`` only (binary ``readline``), each decoded on its own
    so that invalid UTF-8 is named by its line; at most ``max_blank`` blank lines (a gzipped upload of 64 MB of
    newlines held no sample but cost 20 s of CPU to walk); ``keep_ends``: each line with its line ending (for the CSV
    reader: a quoted field keeps its line breaks); ``max_chars``: a line is one sample of at most that many characters
    (plain text), and a line over ``max_line`` bytes is refused by that limit (a CJK line was told of bytes and
    "fields")."""
    lineno = blank = 0
    while True:
        raw = stream.readline(max_line + 1)
        if not raw:
            return
        lineno += 1
        if not raw.strip():
            blank += 1
            if blank > max_blank:
                raise PayloadTooLarge(f"{filename}: more than {max_blank} blank lines", {"max_blank_lines": max_blank})
        if len(raw) > max_line and not raw.endswith(b"\n"):
            if max_chars is not None:
                raise PayloadTooLarge(f"{filename}: line {lineno}: the sample has more than {max_chars} characters; "
                                      f"the limit is {max_chars}", {"line": lineno, "max_sample_chars": max_chars})
            raise PayloadTooLarge(f"{filename}: line {lineno} is longer than {max_line} bytes (its fields the reader "
                                  "does not use count too)",
                                  {"line": lineno, "max_line_bytes": max_line})
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.endswith(b"\n") and not keep_ends:
            raw = raw[:-1]
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{filename}: line {lineno} is not valid UTF-8 (byte {exc.start} of the line)"
                               + (_GZIP_HINT if lineno == 1 and raw.startswith(_GZIP_MAGIC) else ""),
                               {"line": lineno}) from None


def _refuse_utf16(head: bytes, filename: str) -> None:
    """Refuse a file whose first bytes (``head``) are UTF-16: one without a byte-order mark read as valid UTF-8 with a
    NUL after every character (a sample ``f\\x00i\\x00r\\x00…``, and a sample ``\\x00`` of each line end's
    second byte), stored silently; one with a mark was said "not valid UTF-8 (byte 0)"."""
    marked = head.startswith((b"\xff\xfe", b"\xfe\xff"))
    even = len(head) - len(head) % 2
    interleaved = even >= 4 and any(not any(head[i:even:2]) and all(head[1 - i:even:2]) for i in (0, 1))
    if marked or interleaved:
        raise InvalidInput(f"{filename}: the file is UTF-16 text ("
                           + ("its byte-order mark" if marked else "a NUL byte beside every character")
                           + "); FisherAtlas reads UTF-8: re-encode the file as UTF-8", {"encoding": "utf-16"})


_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_HINT = (": its bytes are gzip-compressed — a compressed upload's name ends in .gz (and it is compressed once: "
              "a .gz whose content is gzip again reads as this)")


@contextlib.contextmanager
def _json_errors(where: str) -> Iterator[None]:
    """Every failure of the JSON decoder inside the block, deep nesting included, as an :class:`InvalidInput`
    naming ``where`` (and the line of a text of several: a JSON file's error was named by its column alone)."""
    try:
        yield
    except json.JSONDecodeError as exc:
        lines = "\n" in exc.doc
        at = f"line {exc.lineno}, column {exc.colno}" if lines else f"column {exc.colno}"
        hint = ("; one JSON value a line is a JSON-lines file, named .jsonl"
                if exc.msg == "Extra data" and lines and where.removesuffix(".gz").endswith(".json") else "")
        raise InvalidInput(f"{where} is not valid JSON: {exc.msg} ({at}){hint}",
                           {"line": exc.lineno} if lines else None) from None
    except RecursionError:
        raise InvalidInput(f"{where}: JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{where} is not UTF-8 (byte {exc.start})") from None
    except ValueError:  # Python's limit on integer digits (4300): the only other failure of the decoder
        raise InvalidInput(f"{where}: a number in it has too many digits") from None


_DECODER = json.JSONDecoder(object_pairs_hook=json_object)
"""The readers' JSON decoder: objects that repeat a key are :class:`atlas.samples.RepeatedKeys`, so that a record
repeating a sample field is refused rather than read with its last value."""


def loads_json(text: str | bytes, where: str) -> Any:
    """``json.loads`` whose every failure is an :class:`InvalidInput` naming ``where``; an object that repeats a
    key is a :class:`atlas.samples.RepeatedKeys` (:func:`atlas.samples.json_object`)."""
    with _json_errors(where):
        if isinstance(text, bytes):
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        return _DECODER.decode(text)


def _read_jsonl(stream: IO[bytes], filename: str, mode: Mode, counter: SampleCounter) -> Iterator[tuple[str, ...]]:
    for lineno, line in _lines(stream, filename, counter.limits.max_line_bytes, counter.limits.max_samples):
        if not line.strip(" \t\r"):
            continue
        where = f"{filename}: line {lineno}"
        yield counter.add(record_values(loads_json(line, where), mode, where), where)


def parse_upload(data: bytes, filename: str, mode: Mode, limits: SampleLimits | None = None) -> list[Sample]:
    """The samples of an upload held in memory: :func:`read_samples` on ``data`` (library mode's entry point).

    Parameters
    ----------
    data : bytes
        The file's content.
    filename : str
        Its name; the suffix selects the reader (:func:`atlas.file_formats.file_format`).
    mode : {"text", "completion"}
        The fields each record must have.
    limits : SampleLimits, optional
        Bounds applied while reading (defaults: :class:`SampleLimits`).

    Raises
    ------
    InvalidInput
        Malformed input, naming the line or row (422).
    PayloadTooLarge
        A limit passed (413).
    """
    return read_samples(data, filename, mode, limits)


def _read_json(stream: IO[bytes], filename: str, mode: Mode, counter: SampleCounter) -> list[tuple[str, ...]]:
    data = stream.read()
    raw = data if isinstance(data, bytes) else data.encode()
    # Bounded before any value is built: one element (or the {"samples": …} object) of millions of values, say in
    # an ignored field, took 1.7 GB for a 63 MB file and was then accepted. A top-level array is read one element
    # at a time, so each element is bounded (MAX_JSON_VALUES, as a line of JSON lines); any other document at once.
    if raw.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"[":
        most = counter.limits.max_samples
        item = first_item_over(raw, MAX_JSON_VALUES, max_items=most)
        if item is not None and item >= most:
            raise PayloadTooLarge(f"{filename} holds more than {most} samples", {"max_samples": most})
        if item is not None:
            raise PayloadTooLarge(f"{filename}: item {item} holds more than {MAX_JSON_VALUES} JSON values",
                                  {"item": item, "max_json_values": MAX_JSON_VALUES})
    else:
        limit = upload_value_limit(counter.limits.max_samples)
        if json_token_count(raw, limit) > limit:
            raise PayloadTooLarge(f"{filename} holds more than {limit} JSON values ({counter.limits.max_samples} "
                                  "samples allowed; a top-level array of samples is read one at a time and has no "
                                  "such bound)", {"max_json_values": limit, "max_samples": counter.limits.max_samples})
    try:
        text = data.decode("utf-8-sig", errors="strict") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{filename} is not valid UTF-8 (byte {exc.start})"
                           + (_GZIP_HINT if bytes(data[:2]) == _GZIP_MAGIC else "")) from None
    decoder = _DECODER
    pos = _skip_ws(text, 0)
    if pos < len(text) and text[pos] == "[":  # stream the array element by element
        out: list[tuple[str, ...]] = []
        pos = _skip_ws(text, pos + 1)
        if pos < len(text) and text[pos] == "]":
            return out
        while True:
            where = f"{filename}: item {len(out)}"
            with _json_errors(where):
                record, pos = decoder.raw_decode(text, pos)
            out.append(counter.add(record_values(record, mode, where), where))
            pos = _skip_ws(text, pos)
            if pos < len(text) and text[pos] == ",":
                pos = _skip_ws(text, pos + 1)
                continue
            if pos < len(text) and text[pos] == "]" and _skip_ws(text, pos + 1) == len(text):
                return out
            raise InvalidInput(f"{filename}: malformed JSON array after item {len(out) - 1}")
    records = loads_json(text, filename)
    if isinstance(records, RepeatedKeys) and "samples" in records.repeated:
        raise InvalidInput(f"{filename}: field 'samples' is given more than once (JSON decoders keep the last and drop "
                           "the others)", {"field": "samples"})
    if isinstance(records, dict) and isinstance(records.get("samples"), list):
        records = records["samples"]
    if not isinstance(records, list):
        raise InvalidInput(f"{filename}: expected a JSON array of samples")
    return [counter.add(record_values(r, mode, f"{filename}: item {i}"), f"{filename}: item {i}")
            for i, r in enumerate(records)]


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _read_text(stream: IO[bytes], filename: str, counter: SampleCounter) -> Iterator[tuple[str, ...]]:
    max_line = 4 * counter.limits.max_sample_chars + 2
    for lineno, line in _lines(stream, filename, max_line, counter.limits.max_samples,
                               max_chars=counter.limits.max_sample_chars):
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip():
            continue
        where = f"{filename}: line {lineno}"
        if not counter.n:  # the first sample of a suffix-less file
            check_plain_text(filename, line)
        yield counter.add(record_values({"text": line}, "text", where), where)


def _read_csv(stream: IO[bytes], filename: str, mode: Mode, counter: SampleCounter,
              delimiter: str = ",") -> Iterator[tuple[str, ...]]:
    limit = counter.limits.max_sample_chars + 1
    if csv.field_size_limit() < limit:
        csv.field_size_limit(limit)
    # Lines split on "\n" only, as every other format's, each decoded on its own (invalid UTF-8 named by its line: the
    # text wrapper's error named a row and byte of its read-ahead chunk); a bare "\r" in an unquoted field is an error,
    # not a row end (a sample was split in two where a .txt upload kept it whole).
    # (Blank rows are bounded below: a blank line inside a quoted field, a paragraph break, is no blank row.)
    lines = (line for _, line in _lines(stream, filename, counter.limits.max_line_bytes, counter.limits.max_bytes,
                                        keep_ends=True))
    # strict: a field opened by a quote must be closed by one (a lenient reader dropped the quotes of
    # '"Stop!" he cried' and merged every row after an unbalanced quote into one sample, silently)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    row_no = 1
    try:
        header = next(reader, None)
        if header is None:
            return
        # only a column the mode reads must be named once: a spreadsheet's export ends with empty names
        # ("text,label,,") and other columns may repeat (which of two "text" columns is meant cannot be told)
        needed = set(mode_fields(mode))
        twice = sorted(name for name, n in Counter(header).items() if n > 1 and name in needed)
        if twice:
            raise InvalidInput(f"{filename}: the header names {', '.join(map(repr, twice))} more than once",
                               {"columns": twice})
        check_columns(header, mode, filename)  # once, naming the header: not "row 2: missing field" per row
        # A row that names the columns again is a second file's header (an Excel export's starts with a BOM, and may
        # end in empty columns): refused, not stored as a sample. Only for a header of two named columns or more: a
        # one-column file's row equal to its column's name is a sample as likely (a word list holding "text").
        named_header = _header_like(header) if sum(1 for f in header if f.strip()) >= 2 else None
        blank = 0
        for row in reader:
            row_no = reader.line_num
            if not row:
                blank += 1
                if blank > counter.limits.max_samples:  # a bomb of newlines: see _lines
                    raise PayloadTooLarge(f"{filename}: more than {counter.limits.max_samples} blank rows",
                                          {"max_blank_lines": counter.limits.max_samples})
                continue
            where = f"{filename}: row {reader.line_num}"
            if named_header and _header_like(row) == named_header:  # two files joined (cat a.csv b.csv)
                raise InvalidInput(f"{where} repeats the header row (files joined together?): remove it",
                                   {"row": reader.line_num})
            if len(row) > len(header) and any(f.strip() for f in row[len(header):]):  # an unquoted comma
                what = "a tab" if delimiter == "\t" else "a comma"
                raise InvalidInput(f"{where}: {len(row)} fields but the header has {len(header)} (quote a field "
                                   f"that contains {what})", {"row": reader.line_num})
            record = dict(zip(header, row, strict=False))
            yield counter.add(record_values(record, mode, where), where)
    except csv.Error as exc:
        where = f"{filename}: row {reader.line_num or row_no}"
        if "field larger than field limit" in str(exc):
            raise PayloadTooLarge(f"{where}: a field is longer than {counter.limits.max_sample_chars} characters (in "
                                  "any column, read or not)",
                                  {"max_sample_chars": counter.limits.max_sample_chars}) from None
        kind = "TSV" if delimiter == "\t" else "CSV"
        if "new-line character seen in unquoted field" in str(exc):
            raise InvalidInput(f"{where}: malformed {kind}: a carriage return (\\r) inside an unquoted field (rows end "
                               f"at \\n only): quote the field, or upload the text as .txt or .jsonl",
                               {"row": reader.line_num or row_no}) from None
        raise InvalidInput(f"{where}: malformed {kind}: {exc} (a field that starts with a double quote is a quoted "
                           f"field: close it, and double every quote inside it; or upload the text as .txt or .jsonl)",
                           {"row": reader.line_num or row_no}) from None


def _header_like(row: list[str]) -> tuple[str, ...]:
    """A CSV row as a header compares: without a leading BOM and trailing empty fields."""
    fields = [row[0].removeprefix("\ufeff"), *row[1:]] if row else []
    while fields and not fields[-1].strip():
        fields.pop()
    return tuple(fields)
