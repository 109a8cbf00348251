"""A JSON record that repeats a sample field is refused, not read with its last value (2026-12-07).

JSON allows an object to repeat a key and decoders keep the last value: ``{"text": "a", "text": "b"}`` was stored
as the sample ``"b"``, and ``"a"`` was lost without a word. The readers now refuse such a record with a 422 naming
the field and the line (or item); a repeated field the reader does not use keeps JSON's last value, and repeated
keys anywhere in task metadata are refused (metadata is stored whole, so no value of it may be dropped).
The HTTP side: ``tests/service/test_repeated_json_keys_api.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas.errors import InvalidInput
from atlas.sample_io import loads_json, parse_upload
from atlas.samples import check_metadata

_KEYS = st.sampled_from(["text", "prompt", "completion", "label", "id", "Text"])
_VALUES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _object(pairs: list[tuple[str, Any]]) -> str:
    """A JSON object written pair by pair, so that a key may repeat."""
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"


@settings(max_examples=120, deadline=None)
@given(pairs=st.lists(st.tuples(_KEYS, _VALUES), min_size=1, max_size=7),
       mode=st.sampled_from(["text", "completion"]),
       container=st.sampled_from(["jsonl", "json_array", "json_samples"]),
       before=st.integers(0, 3))
def test_a_repeated_sample_field_is_refused_and_any_other_keeps_the_last_value(
        pairs: list[tuple[str, Any]], mode: str, container: str, before: int) -> None:
    read = ("text",) if mode == "text" else ("prompt", "completion")
    good = _object([(k, "fine") for k in read])
    record = _object(pairs)
    if container == "jsonl":
        data, name, where = "\n".join([good] * before + [record]) + "\n", "a.jsonl", f"line {before + 1}"
    elif container == "json_array":
        data, name, where = "[" + ", ".join([good] * before + [record]) + "]", "a.json", f"item {before}"
    else:
        data, name, where = '{"samples": [' + ", ".join([good] * before + [record]) + "]}", "a.json", f"item {before}"
    keys = [k for k, _ in pairs]
    repeated_read = [k for k in read if keys.count(k) > 1]
    missing = [k for k in read if k not in keys]
    if repeated_read:
        with pytest.raises(InvalidInput) as err:
            parse_upload(data.encode(), name, mode)  # type: ignore[arg-type]
        assert where in err.value.message and "more than once" in err.value.message, err.value.message
        assert err.value.detail is not None and err.value.detail["field"] in repeated_read
    elif missing:
        with pytest.raises(InvalidInput, match="missing field"):
            parse_upload(data.encode(), name, mode)  # type: ignore[arg-type]
    else:
        samples = parse_upload(data.encode(), name, mode)  # type: ignore[arg-type]
        last = dict(pairs)  # a repeated field the reader does not use keeps JSON's last value
        assert [tuple(getattr(s, k) for k in read) for s in samples[before:]] == [tuple(last[k] for k in read)]


def test_a_json_file_repeating_its_samples_key_is_refused() -> None:
    data = b'{"samples": [{"text": "a"}], "samples": [{"text": "b"}]}'
    with pytest.raises(InvalidInput, match="'samples' is given more than once"):
        parse_upload(data, "a.json", "text")


def test_repeated_metadata_keys_are_refused_at_any_depth() -> None:
    for raw in ('{"a": 1, "a": 2}', '{"a": {"b": 1, "c": [{"d": 1, "d": 1}]}}'):
        with pytest.raises(InvalidInput, match="more than once"):
            check_metadata(loads_json(raw, "form field 'metadata'"), where="form field 'metadata'")
    assert check_metadata(loads_json('{"a": {"b": 1}, "b": {"a": 2}}', "m")) == {"a": {"b": 1}, "b": {"a": 2}}
