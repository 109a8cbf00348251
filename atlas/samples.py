"""Samples of a task and their stable identifiers.

A sample is either a text (``mode="text"``: every next-token position counts) or a
prompt/completion pair (``mode="completion"``: only completion tokens count).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

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


def main_field(sample: Sample) -> str | None:
    """The field a sample is sketched on: ``text`` for a text sample, ``completion`` for a prompt/completion pair.
    A sample whose main field is missing or blank (:func:`is_blank`) counts no token."""
    return sample.text if sample.text is not None else sample.completion


def sample_chars(sample: Sample) -> int:
    """Characters of a sample (text, or prompt + completion): what ``max_sample_chars`` bounds."""
    return sum(len(v) for v in (sample.text, sample.prompt, sample.completion) if v is not None)


def is_blank(value: str | None) -> bool:
    """Missing, empty, or whitespace only (Unicode's too: ``\u2028``, ``\x85``, ``\x1c``…, as ``str.strip``)."""
    return value is None or not value.strip()


def sample_id(sample: Sample) -> int:
    """Stable 63-bit identifier of a sample's content.

    The FisherSketch A/B split is a hash of this id and the sketch seed, so the same sample lands in
    the same split whichever process, shard or retry handles it.
    """
    digest = hashlib.blake2b(sample.canonical_json().encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


_TEXT_KEYS = ("text",)
_PAIR_KEYS = ("prompt", "completion")


def mode_fields(mode: Mode) -> tuple[str, ...]:
    """The fields a sample of ``mode`` has: ``("text",)`` or ``("prompt", "completion")``."""
    return _TEXT_KEYS if mode == "text" else _PAIR_KEYS


def record_to_sample(record: object, mode: Mode, where: str) -> Sample:
    """Validate one parsed record (a dict) for ``mode`` and build a :class:`Sample`.

    Raises :class:`InvalidInput` naming ``where`` for a non-object, a missing or non-string field, or a
    lone surrogate (not encodable as UTF-8, so not storable).
    """
    values = record_values(record, mode, where)
    return Sample(**dict(zip(mode_fields(mode), values, strict=True)))


class RepeatedKeys(dict[str, Any]):
    """A decoded JSON object that was given some of its keys more than once (``repeated``): JSON allows it and a
    decoder keeps the last value, so the earlier ones would be lost without a word. Built by
    :func:`json_object` (the sample readers' ``object_pairs_hook``) only for such objects."""

    __slots__ = ("repeated",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.repeated = [key for key, n in Counter(key for key, _ in pairs).items() if n > 1]


def json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of the sample readers: a plain ``dict``, or a :class:`RepeatedKeys` when a key repeats
    (a record whose sample field repeats is then refused by :func:`record_values`; other fields keep JSON's
    last value)."""
    obj = dict(pairs)
    return obj if len(obj) == len(pairs) else RepeatedKeys(pairs)


def unique_keys_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for JSON whose every key is read (a request body, task metadata): an object that
    repeats a key raises :class:`InvalidInput` (422) naming it, instead of keeping JSON's last value."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        key = RepeatedKeys(pairs).repeated[0]
        raise InvalidInput(f"key {key!r} is given more than once in one object (JSON decoders keep the last value "
                           "and drop the others)", {"key": key})
    return obj


def nested_keys(node: object) -> int:
    """The keys of every object within a decoded JSON value (dicts and lists, at every depth)."""
    if isinstance(node, dict):
        return len(node) + sum(nested_keys(v) for v in node.values())
    return sum(nested_keys(v) for v in node) if isinstance(node, list) else 0


def refuse_repeated_keys(body: bytes, keys_given: int) -> None:
    """Refuse (422) a JSON text that repeats a key in one object, once a model parser that keeps the last value has
    read it: ``keys_given`` is the keys the parsed value holds. The text is decoded a second time only when it holds
    more key tokens (one regular expression, nothing built per value) than that — only when a key repeats, or fields
    the model ignores are there (every string is matched whole: a key's text inside a value does not count)."""
    from atlas.json_bounds import json_key_count

    if json_key_count(body) > keys_given:
        # a repeated key raises InvalidInput; what the model parser read and Python's cannot leaves nothing to judge by
        with contextlib.suppress(ValueError, RecursionError):
            json.loads(body, object_pairs_hook=unique_keys_object)


def record_values(record: object, mode: Mode, where: str) -> tuple[str, ...]:
    """The validated values of a record: ``(text,)`` or ``(prompt, completion)`` (see :func:`record_to_sample`).
    A record decoded by :func:`json_object` that repeats one of these fields is refused: which value is the
    sample cannot be told, and keeping the last would lose the others."""
    if not isinstance(record, dict):
        raise InvalidInput(f"{where}: expected an object with {_keys_for(mode)}, got {type(record).__name__}")
    keys = mode_fields(mode)
    if isinstance(record, RepeatedKeys) and (twice := [k for k in keys if k in record.repeated]):
        raise InvalidInput(f"{where}: field '{twice[0]}' is given more than once (which value is the sample "
                           "cannot be told; JSON decoders keep the last and drop the others)", {"field": twice[0]})
    missing = [k for k in keys if k not in record or record[k] is None]
    if missing:
        raise InvalidInput(f"{where}: missing field(s) {missing} for mode '{mode}'"
                           + fields_hint([k for k in record if record[k] is not None], mode))
    for k in keys:
        v = record[k]
        if not isinstance(v, str):
            raise InvalidInput(f"{where}: field '{k}' must be a string, got {type(v).__name__}")
        if not is_valid_unicode(v):
            raise InvalidInput(f"{where}: field '{k}' holds a lone surrogate (not valid Unicode text)")
    return tuple(record[k] for k in keys)


def fields_hint(found: Sequence[object], mode: Mode, kind: Literal["record", "header", "columns"] = "record") -> str:
    """What a record, a CSV/TSV header or a Parquet file's columns (``kind``) that lack ``mode``'s fields have
    instead, and what to do: the other mode when its fields are there, a field named in another case, else the names
    found (for a header: that a table's first row names its columns)."""
    names = [str(k) for k in found]
    what = "fields" if kind == "record" else "columns"
    other, other_mode = (_PAIR_KEYS, "completion") if mode == "text" else (_TEXT_KEYS, "text")
    if all(k in names for k in other):
        # said for an append too, where no mode can be chosen: what the file is for, not what to pick
        return f" (the {what} are {names[:10]}: samples for a task of mode '{other_mode}')"
    cased = [n for n in names if n.strip().lower() in _TEXT_KEYS + _PAIR_KEYS and n not in _TEXT_KEYS + _PAIR_KEYS]
    if cased:
        return f" (found {cased[:3]}: {what[:-1]} names are lower case, 'text' or 'prompt' and 'completion')"
    if kind == "header":
        return (f" (the header is {names[:10]}: a table's first row names its columns; for one sample per line "
                "without a header, use a .txt file)")
    return f" (the {what} are {names[:10]})" if names else ""


def check_columns(header: Sequence[object], mode: Mode, where: str,
                  kind: Literal["header", "columns"] = "header") -> None:
    """Raise :class:`InvalidInput` once, for the whole table, when its header (or a Parquet file's columns: ``kind``)
    lacks a field ``mode`` needs."""
    missing = [k for k in mode_fields(mode) if k not in header]
    if missing:
        raise InvalidInput(f"{where}: missing column(s) {missing} for mode '{mode}'" + fields_hint(header, mode, kind),
                           {"missing": missing})


def sample_of(values: tuple[str, ...]) -> Sample:
    """The :class:`Sample` of :func:`record_values`' output."""
    if len(values) == 1:
        return Sample(text=values[0])
    return Sample(prompt=values[0], completion=values[1])


def is_valid_unicode(text: str) -> bool:
    """False when ``text`` cannot be encoded as UTF-8 (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_storable_text(text: str) -> bool:
    """Whether ``text`` can be stored in, or compared with, a text column on every database: no NUL (PostgreSQL
    refuses it in any text parameter) and valid Unicode (:func:`is_valid_unicode`).

    A name, space reference or filter that fails this cannot match anything stored: lookups answer "not
    found", filters an empty list, and new names are refused (422).
    """
    return "\x00" not in text and is_valid_unicode(text)


BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Bidirectional embeddings, overrides and isolates: they reorder how the text around them is displayed."""


INVISIBLE_CHARS = frozenset("\u00ad\u061c\u180e\u200b\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff")
"""Characters that display as nothing (soft hyphen, zero-width space and no-break space, word joiner, invisible
operators, direction marks): ``chem`` and ``chem\u200b`` would look the same. Zero-width (non-)joiners are
not among them: they shape Persian, Indic and emoji text."""


def is_control_char(ch: str) -> bool:
    """Whether ``ch`` would act on a terminal or on how text is displayed rather than print: a control character
    (Unicode category Cc: newlines, tabs, ESC, DEL, C1), a line or paragraph separator (U+2028, U+2029: a line break
    wherever Unicode line breaking is followed), a bidirectional override or an invisible character."""
    return unicodedata.category(ch) in _BREAKING or ch in BIDI_CONTROLS or ch in INVISIBLE_CHARS


_BREAKING = frozenset({"Cc", "Zl", "Zp"})


def name_forms(name: str) -> set[str]:
    """The stored forms a looked-up name can match: as given and NFC-normalised (names are stored NFC since
    2026-11-25, so ``café`` typed composed or decomposed finds the same task)."""
    return {name, unicodedata.normalize("NFC", name)}


def control_chars(text: str) -> list[str]:
    """The characters of ``text`` for which :func:`is_control_char` holds."""
    return [ch for ch in text if is_control_char(ch)]


def refuse_control_chars(text: str, what: str, *, allowed: frozenset[str] = frozenset()) -> None:
    """Raise :class:`InvalidInput` naming ``what`` (e.g. "a task name") and the code points when ``text`` holds a
    control character (:func:`is_control_char`) not in ``allowed``: an escape sequence in a name rewrote the terminal
    of whoever listed it."""
    bad = [(i, c) for i, c in enumerate(text) if is_control_char(c) and c not in allowed]
    if bad:  # each character named with its first place: a direction mark is invisible where it was typed
        first = {c: i for i, c in reversed(bad)}
        found = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, 'control character')} at character {i + 1}"
                          for c, i in sorted(first.items(), key=lambda kv: kv[1])[:3])
        more = f" and {len(first) - 3} more" if len(first) > 3 else ""
        raise InvalidInput(f"{what} cannot hold control characters (newlines, line separators, tabs, escape codes), "
                           "bidirectional overrides or invisible characters (zero-width spaces, direction marks): "
                           f"found {found}{more}",
                           {"characters": sorted({f"U+{ord(c):04X}" for c in first})})


def _keys_for(mode: Mode) -> str:
    return "'text'" if mode == "text" else "'prompt' and 'completion'"


def samples_from_records(records: list[object], mode: Mode, *, source: str = "samples") -> list[Sample]:
    """Validate JSON records (e.g. a request body's ``samples``) into samples."""
    return [record_to_sample(r, mode, f"{source}[{i}]") for i, r in enumerate(records)]


MAX_METADATA_BYTES = 16 * 1024
"""Most bytes of a task's metadata as compact JSON (a list page of 1,000 tasks stays under 16 MiB)."""
MAX_METADATA_DEPTH = 16
"""Deepest nesting of objects/arrays in task metadata."""


def check_metadata(metadata: object, *, where: str = "metadata") -> dict[str, Any]:
    """Validate task metadata: a JSON object of at most :data:`MAX_METADATA_BYTES` bytes (compact JSON)
    and :data:`MAX_METADATA_DEPTH` levels, with no NUL character in any key or string (text and
    JSON columns of PostgreSQL cannot hold NUL, so every database refuses it alike).

    Raises
    ------
    InvalidInput
        (422) naming the problem.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidInput(f"{where} must be a JSON object")
    _check_node(metadata, 1, where)
    try:
        size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode())
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidInput(f"{where} is not representable as JSON: {exc}") from None
    if size > MAX_METADATA_BYTES:
        raise InvalidInput(f"{where} has {size} bytes as JSON; the limit is {MAX_METADATA_BYTES}",
                           {"bytes": size, "max_bytes": MAX_METADATA_BYTES})
    return dict(metadata)


def _bounded_metadata(value: dict[str, Any]) -> dict[str, Any]:
    try:
        return check_metadata(value)
    except InvalidInput as exc:
        raise ValueError(exc.message) from None


Metadata = Annotated[dict[str, Any], AfterValidator(_bounded_metadata)]
"""Pydantic type of task metadata in request bodies (:func:`check_metadata` as a validator: 422)."""
METADATA_DOC = f"at most {MAX_METADATA_BYTES} bytes as JSON and {MAX_METADATA_DEPTH} levels deep, no NUL"


def _check_node(node: object, depth: int, where: str) -> None:
    if isinstance(node, dict | list):
        if depth > MAX_METADATA_DEPTH:
            raise InvalidInput(f"{where} is nested deeper than {MAX_METADATA_DEPTH} levels",
                               {"max_depth": MAX_METADATA_DEPTH})
        if isinstance(node, RepeatedKeys):
            raise InvalidInput(f"{where}: key {node.repeated[0]!r} is given more than once in one object (JSON "
                               "decoders keep the last value and drop the others)", {"key": node.repeated[0]})
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(key, str):
                _check_text(key, where)
            _check_node(value, depth + 1, where)
    elif isinstance(node, str):
        _check_text(node, where)


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise InvalidInput(f"{where}: NUL characters are not allowed in metadata")
    if not is_valid_unicode(text):
        raise InvalidInput(f"{where}: lone surrogates are not allowed in metadata")
