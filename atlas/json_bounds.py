"""Bounded counts of JSON values in raw bytes, before a parser builds them.

A JSON document of a few megabytes can hold millions of values (``[{},{},…]``); ``json.loads`` or pydantic then
build millions of Python objects (a 63 MB body of ``{}`` items: 1.6 GB of memory) before any validation can refuse
it. These functions count *structural tokens* (``{ [ ] } , :`` outside strings; strings are skipped whole by one
regular expression, so brackets inside them do not count) without building anything per value, and stop as soon
as a limit is passed. Used by the HTTP edge (:mod:`service.uploads`; :func:`json_array_length` counts an upload's
samples there), the sample readers (:mod:`atlas.sample_io`) and the space import (:mod:`atlas.space_io`).
"""

from __future__ import annotations

import json
import mmap
import re

from atlas.errors import PayloadTooLarge

MAX_JSON_VALUES = 100_000
"""Most structural tokens a JSON document (or one line of JSON Lines) may hold where no legitimate one comes near:
a request body that is not an upload (``/v1/route/fit`` with 2,000 examples: about 10,000), one line of a space
export (about 17,000 at most: metadata ≤ 16 KiB, ≤ 256 stored calibration scores)."""

TOKENS_PER_SAMPLE = 8
"""Most structural tokens one sample of a JSON upload holds (``{"text":…,"prompt":…,"completion":…},``)."""

STRUCTURAL_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{},:]', re.DOTALL)
"""A JSON string (skipped whole) or one structural character. The closing quote is optional, so a string left open
is one match to the end, never a failed one: with it required, each escaped quote of an unclosed string started a
new scan to the end (quadratic, before any parser ran: 40 KB of ``"\\"\\"…`` took 4.9 s, a 150 KB route body 75 s of
the event loop)."""

_LINE_TOKENS = re.compile(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"?|[\[\]{},:\n]')


_STRING_OR_KEY = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?(\s*:)?', re.DOTALL)
"""A JSON string, matched whole (its closing quote optional, as in :data:`STRUCTURAL_TOKENS`), and the colon after
it when it is an object's key: a pattern for keys alone restarted inside values at each escaped quote (4.8 MB of
samples holding ``\\"`` took 2.4 s)."""


def json_key_count(data: bytes) -> int:
    """The number of object keys in JSON ``data`` (strings followed by a colon); linear, one regular expression, no
    Python object per value (``service.uploads`` compares it with the keys a validated body holds: more means a
    repeated key)."""
    strings = _STRING_OR_KEY.findall(data)  # per string: b"" for a value, the colon for a key
    return len(strings) - strings.count(b"")


def upload_value_limit(max_samples: int) -> int:
    """Most structural tokens of a JSON upload allowed ``max_samples`` samples: its samples and its task's fields."""
    return MAX_JSON_VALUES + TOKENS_PER_SAMPLE * int(max_samples)


def json_token_count(data: bytes, stop_after: int) -> int:
    """The number of structural tokens of JSON ``data``; counting stops once past ``stop_after``.

    Linear in ``data`` and bounded in work by ``stop_after`` tokens: no Python object is built per value.
    """
    n = 0
    for match in STRUCTURAL_TOKENS.finditer(data):
        if match.group()[0] != 0x22:  # not a string
            n += 1
            if n > stop_after:
                break
    return n


def first_item_over(data: bytes, limit: int, max_items: int | None = None) -> int | None:
    """The index (0-based) of the first element of the top-level JSON array ``data`` holding more than ``limit``
    structural tokens, or ``None``; one pass (strings skipped whole) that stops there, or at element ``max_items``
    (index ``max_items`` is returned: there are more elements than that, which a caller refuses anyway; without the
    stop, 64 MB of ``[{},{},…]`` took 16 s of CPU to walk). An array read element by element builds one element at a
    time: it is each element, not the whole file, whose values must be bounded (a wide table of 40,000 rows, fields
    the reader ignores, passed a bound on the file's total and was refused)."""
    depth, item, n = 0, 0, 0
    for match in STRUCTURAL_TOKENS.finditer(data):
        tok = match.group()
        if tok[0] == 0x22:  # a string
            continue
        if tok in (b"[", b"{"):
            depth += 1
            inside = depth >= 2  # the top-level array's own bracket is no element's
        elif tok in (b"]", b"}"):
            depth -= 1
            inside = depth >= 1
        elif depth == 1:  # a comma between elements
            item, n = item + 1, 0
            if max_items is not None and item >= max_items:
                return item
            continue
        else:
            inside = depth >= 2
        if inside:
            n += 1
            if n > limit:
                return item
    return None


def first_line_over(data: bytes | mmap.mmap, limit: int) -> int | None:
    """The number (1-based) of the first line of JSON Lines ``data`` holding more than ``limit`` structural tokens,
    or ``None``; one bounded pass (strings skipped whole, a string never spans lines in JSON Lines)."""
    line, n = 1, 0
    for match in _LINE_TOKENS.finditer(data):
        tok = match.group()
        if tok == b"\n":
            line, n = line + 1, 0
        elif tok[0] != 0x22:  # not a string
            n += 1
            if n > limit:
                return line
    return None


def json_array_length(body: bytes, key: str, stop_after: int | None = None, *, max_tokens: int | None = None) -> int:
    """A lower bound on the number of elements of the top-level object's array ``key`` (-1 if absent).

    Scans tokens with one regular expression (strings skipped whole, so brackets inside them do not
    count) without building any Python object per element: a request holding millions of samples is
    refused (413) before pydantic would materialise them.

    With ``max_tokens``, the same pass counts the structural tokens of the whole body (it goes on past the
    array) and raises :class:`PayloadTooLarge` as soon as they pass ``max_tokens``: millions of values in other
    fields, or inside the elements, are refused as well, after at most ``max_tokens`` steps.
    """
    key_tok = json.dumps(key).encode()
    depth, target, count, seen_key, tokens = 0, -1, 0, 0, 0
    done: int | None = None
    prev = b""
    for match in STRUCTURAL_TOKENS.finditer(body):
        tok = match.group()
        if max_tokens is not None and tok[0] != 0x22:  # not a string
            tokens += 1
            if tokens > max_tokens:
                raise PayloadTooLarge(f"the request body holds more than {max_tokens} JSON values",
                                      {"max_json_values": max_tokens})
        if done is not None:
            continue
        if depth == target and prev in (b"[", b",") and tok not in (b"]", b","):
            count += 1
            if stop_after is not None and count > stop_after:
                return count
        if depth == 1 and tok == key_tok and prev in (b"{", b","):
            seen_key = 1
        elif seen_key == 1 and tok == b":":
            seen_key = 2
        else:
            if seen_key == 2 and tok == b"[" and target < 0:
                target = 2
            seen_key = 0
        if tok in (b"[", b"{"):
            depth += 1
        elif tok in (b"]", b"}"):
            if depth == target:
                if max_tokens is None:
                    return count
                done = count
            depth -= 1
        prev = tok
    if done is not None:
        return done
    return count if target > 0 else -1
