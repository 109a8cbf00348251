"""Samples of a task and their stable identifiers.

A sample is either a text (``mode="text"``: every next-token position counts) or a
prompt/completion pair (``mode="completion"``: only completion tokens count).
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict

from atlas.errors import InvalidInput
from atlas.vocabulary import ModeName

Mode = ModeName


class Sample(BaseModel):
    """One sample of a task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str | None = None
    prompt: str | None = None
    completion: str | None = None

    def canonical_json(self) -> str:
        """Canonical JSON used for hashing (sorted keys, no ``None`` fields)."""
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True, ensure_ascii=False)


def sample_id(sample: Sample) -> int:
    """Stable 63-bit identifier of a sample's content.

    The FisherSketch A/B split is a hash of this id and the sketch seed, so the same sample lands in
    the same split whichever process, shard or retry handles it.
    """
    digest = hashlib.blake2b(sample.canonical_json().encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


_TEXT_KEYS = ("text",)
_PAIR_KEYS = ("prompt", "completion")


def _record_to_sample(record: object, mode: Mode, where: str) -> Sample:
    """Validate one parsed record (a dict) for ``mode`` and build a :class:`Sample`."""
    if not isinstance(record, dict):
        raise InvalidInput(f"{where}: expected an object with {_keys_for(mode)}, got {type(record).__name__}")
    keys = _TEXT_KEYS if mode == "text" else _PAIR_KEYS
    missing = [k for k in keys if k not in record or record[k] is None]
    if missing:
        raise InvalidInput(f"{where}: missing field(s) {missing} for mode '{mode}'")
    values = {}
    for k in keys:
        v = record[k]
        if not isinstance(v, str):
            raise InvalidInput(f"{where}: field '{k}' must be a string, got {type(v).__name__}")
        values[k] = v
    return Sample(**values)


def _keys_for(mode: Mode) -> str:
    return "'text'" if mode == "text" else "'prompt' and 'completion'"


def _decode_utf8(data: bytes, filename: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{filename}: not valid UTF-8 (byte {exc.start}): re-encode the file as UTF-8",
            detail={"byte_offset": exc.start},
        ) from None


def samples_from_records(records: list[object], mode: Mode, *, source: str = "samples") -> list[Sample]:
    """Validate JSON records (e.g. a request body's ``samples``) into samples."""
    return [_record_to_sample(r, mode, f"{source}[{i}]") for i, r in enumerate(records)]


def parse_upload(data: bytes, filename: str, mode: Mode) -> list[Sample]:
    """Parse an uploaded file into samples.

    Formats, chosen by file extension (``.jsonl``/``.ndjson``, ``.json``, ``.csv``, ``.parquet``,
    anything else as plain text):

    * JSONL: one object per line, ``{"text"}`` (text mode) or ``{"prompt", "completion"}``
      (completion mode); blank lines are ignored.
    * JSON: an array of such objects.
    * CSV: a header row with the same column names.
    * Parquet: columns with the same names.
    * Plain text (text mode only): one sample per non-blank line.

    Raises
    ------
    InvalidInput
        Undecodable bytes, malformed rows or missing fields, with the line/row number.
    """
    name = filename.lower()
    if name.endswith(".parquet"):
        return _parse_parquet(data, filename, mode)
    text = _decode_utf8(data, filename)
    if name.endswith((".jsonl", ".ndjson")):
        out = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"{filename}: line {lineno} is not valid JSON: {exc.msg}") from None
            out.append(_record_to_sample(record, mode, f"{filename}: line {lineno}"))
        return out
    if name.endswith(".json"):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{filename}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
        if isinstance(records, dict) and isinstance(records.get("samples"), list):
            records = records["samples"]
        if not isinstance(records, list):
            raise InvalidInput(f"{filename}: expected a JSON array of samples")
        return samples_from_records(records, mode, source=filename)
    if name.endswith(".csv"):
        return _parse_csv(text, filename, mode)
    if mode != "text":
        raise InvalidInput(
            f"{filename}: plain text uploads hold one text per line and need mode 'text'; "
            "use JSONL, CSV or Parquet with 'prompt' and 'completion' for mode 'completion'"
        )
    return [Sample(text=line) for line in text.splitlines() if line.strip()]


def _parse_csv(text: str, filename: str, mode: Mode) -> list[Sample]:
    import csv
    import io

    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if reader.fieldnames is None:
            return []
        return [_record_to_sample(row, mode, f"{filename}: row {i}") for i, row in enumerate(reader, start=2)]
    except csv.Error as exc:
        raise InvalidInput(f"{filename}: malformed CSV: {exc}") from None


def _parse_parquet(data: bytes, filename: str, mode: Mode) -> list[Sample]:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidInput(f"{filename}: not a readable Parquet file: {exc}") from None
    keys = _TEXT_KEYS if mode == "text" else _PAIR_KEYS
    missing = [k for k in keys if k not in table.column_names]
    if missing:
        raise InvalidInput(f"{filename}: missing column(s) {missing} for mode '{mode}'")
    rows = table.select(list(keys)).to_pylist()
    return [_record_to_sample(r, mode, f"{filename}: row {i}") for i, r in enumerate(rows)]
