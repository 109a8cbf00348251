"""Upload file types: which reader a file name selects (:func:`atlas.sample_io.read_samples`).

Only known suffixes are read. Any other was read as plain text, one sample per line, which changed the data
silently: a ``.tsv`` kept its header and tabs in every sample, a ``.jsonlines`` its JSON syntax.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from atlas.errors import InvalidInput

__all__ = ["FILE_FORMATS", "check_plain_text", "file_format"]

FILE_FORMATS: dict[str, str] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".jsonlines": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv",
    ".parquet": "parquet", ".txt": "text", ".text": "text", "": "text",
}
"""Upload file suffix (lower case, after an optional ``.gz`` is removed) → format; ``""``: no suffix."""


def file_format(filename: str) -> str:
    """The format of an upload named ``filename`` (a key of :data:`FILE_FORMATS`' values).

    Raises
    ------
    InvalidInput
        A suffix that is not a known format (422), naming the ones that are.
    """
    suffix = _suffix(filename)
    fmt = FILE_FORMATS.get(suffix)
    if fmt is None:
        known = ", ".join(k for k in FILE_FORMATS if k)
        raise InvalidInput(f"{filename}: unknown file type {suffix!r}; FisherAtlas reads {known} (each optionally "
                           "gzipped, .gz); rename a plain-text file (one sample per line) to .txt",
                           {"filename": filename, "suffix": suffix, "supported": [k for k in FILE_FORMATS if k]})
    return fmt


def check_plain_text(filename: str, first_line: str) -> None:
    """Refuse a file without a suffix whose first non-blank line is JSON — an object, an array, or the lone ``{`` or
    ``[`` that opens a pretty-printed document: read as plain text, every sample kept its JSON syntax (``{"text": …}``,
    or a ``.json`` file's ``[`` and ``  {`` lines) — a JSON file that lost its name's suffix became a task of wrong
    samples, silently (reviews, 2026-12-01 and 2026-12-07). A suffix-less file of other text is read as plain text.

    Raises
    ------
    InvalidInput
        (422) naming the suffixes to give it.
    """
    line = first_line.strip()
    if _suffix(filename) or not line.startswith(("{", "[")):
        return
    if line in ("{", "["):
        what = "opens a JSON document; name it .json"
    else:
        try:
            parsed = json.loads(line)
        except ValueError:
            return
        if isinstance(parsed, dict):
            what = "is a JSON object; name it .jsonl (one JSON object a line)"
        elif isinstance(parsed, list):
            what = "is a JSON array; name it .json"
        else:
            return
    raise InvalidInput(f"{filename}: a file without a suffix is read as plain text, but its first line {what}, or "
                       ".txt to take each line as a text",
                       {"filename": filename, "suffix": "", "supported": [k for k in FILE_FORMATS if k]})


def _suffix(filename: str) -> str:
    """The format suffix of an upload's name: lower case, after an optional ``.gz`` is removed (``""``: none)."""
    name = PurePosixPath(filename.replace("\\", "/")).name.lower()
    return PurePosixPath(name.removesuffix(".gz")).suffix
