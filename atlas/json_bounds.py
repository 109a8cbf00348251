"""Bounded counts of JSON values in raw bytes, before a parser builds them.

A JSON document of a few megabytes can hold millions of values (``[{},{},…]``); ``json.loads`` or pydantic then
build millions of Python objects (a 63 MB body of ``{}`` items: 1.6 GB of memory) before any validation can refuse
it. These functions count *structural tokens* (``{ [ ] } , :`` outside strings; strings are skipped whole by one
regular expression, so brackets inside them do not count) without building anything per value, and stop as soon
as a limit is passed. Used by the HTTP edge (:mod:`service.uploads`), the sample readers
(:mod:`atlas.sample_io`) and the space import (:mod:`atlas.space_io`).
"""

from __future__ import annotations

import re

MAX_JSON_VALUES = 100_000
"""Most structural tokens a JSON document (or one line of JSON Lines) may hold where no legitimate one comes near:
a request body that is not an upload (``/v1/route/fit`` with 2,000 examples: about 10,000), one line of a space
export (about 17,000 at most: metadata ≤ 16 KiB, ≤ 256 stored calibration scores)."""

TOKENS_PER_SAMPLE = 8
"""Most structural tokens one sample of a JSON upload holds (``{"text":…,"prompt":…,"completion":…},``)."""

STRUCTURAL_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]')
"""A JSON string (skipped whole) or one structural character."""

_LINE_TOKENS = re.compile(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|[\[\]{},:\n]')


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


def first_line_over(data: bytes, limit: int) -> int | None:
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
