"""Secrets out of text: URL passwords, API keys and bearer tokens, file paths, and bounded sizes.

Used by the error renderer (messages and details shown to clients), the log filter (every log record)
and the CLI (``migrate`` prints the database URL). Pure functions on strings and JSON-like values.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

_URL_PASSWORD = re.compile(r"(?P<scheme>://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")
"""A URL's password, found from its ``://`` (the scheme before it is kept as it is). A pattern starting at the
scheme tried a match from every letter of a long run, each scanning the run to its end (quadratic: 40,000 letters in
a query string took 1.6 s of the event loop in the access log)."""
_OPEN_URL_PASSWORD = re.compile(r"(?P<scheme>://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)$")
"""A URL's password that a cut left without its ``@`` (:func:`redact_cut`)."""
REDACT_MARGIN = 512
"""Characters past a cut that are redacted with it (a secret straddling the cut is still found)."""
_API_KEY = re.compile(r"\bfa_[A-Za-z0-9_\-]{8,}")
_ASSIGNED = re.compile(r"(?i)\b(x-api-key|api[_-]?key|password|passwd|secret|token)(\s*[:=]\s*)(['\"]?)[^\s'\",;&]+")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)()[^\s'\",;]+")
_PATH = re.compile(r"(?<![\w:/.\-])(?:~|\.{1,2})?/(?:[\w.\-+@%]+/)*[\w.\-+@%]+/?|\b[A-Za-z]:\\[^\s'\"]+")


def redact_secrets(text: str) -> str:
    """``text`` with URL passwords, API keys (``fa_...``) and ``key=value`` style secrets masked."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)  # "scheme" is its "://"
    text = _API_KEY.sub("fa_" + MASK, text)
    text = _ASSIGNED.sub(lambda m: f"{m[1]}{m[2]}{m[3]}{MASK}", text)
    return _BEARER.sub(lambda m: f"{m[1]}{m[2]}{MASK}", text)


def redact_paths(text: str) -> str:
    """``text`` with absolute and relative file-system paths replaced by their last component (a model
    directory ``/home/me/models/gpt2`` reads ``gpt2``)."""

    def last(m: re.Match[str]) -> str:
        parts = [p for p in re.split(r"[/\\]", m.group(0)) if p not in ("", "~", ".", "..")]
        return parts[-1] if parts else "<path>"

    return _PATH.sub(last, text)


def truncate(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def redact_cut(text: str, limit: int = 300) -> str:
    """``text`` with its secrets masked (:func:`redact_secrets`), cut to ``limit`` characters (:func:`truncate`),
    reading no more of a long text than needed: a window of the cut plus :data:`REDACT_MARGIN` characters, widened
    while masking shrinks it below the cut, so a huge input costs about what a short one does. A URL password the
    window's end leaves without its ``@`` is masked too; the count said is of the whole text."""
    window = limit + REDACT_MARGIN
    while True:
        if len(text) <= window:
            return truncate(redact_secrets(text), limit)
        shown = _OPEN_URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}", redact_secrets(text[:window]))
        if len(shown) >= limit:
            return f"{shown[:limit]}... (cut from {len(text):,} characters)"
        window *= 2


def bounded(value: Any, *, max_str: int = 300, max_items: int = 20, max_depth: int = 4) -> Any:
    """A JSON-like ``value`` bounded in size: strings truncated, lists and dicts cut, nesting capped.

    Secrets in strings are masked as well (:func:`redact_secrets`).
    """
    if max_depth < 0:
        return "..."
    if isinstance(value, str):
        return redact_cut(value, max_str)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, bytes):
        return bounded(value[: max_str * 4].decode("utf-8", errors="replace"), max_str=max_str)
    kw = {"max_str": max_str, "max_items": max_items, "max_depth": max_depth - 1}
    if isinstance(value, dict):
        items = list(value.items())
        out = {truncate(str(k), 100): bounded(v, **kw) for k, v in items[:max_items]}
        if len(items) > max_items:
            out["..."] = f"{len(items) - max_items} more entries"
        return out
    if isinstance(value, list | tuple | set | frozenset):
        seq = list(value)
        out_list = [bounded(v, **kw) for v in seq[:max_items]]
        if len(seq) > max_items:
            out_list.append(f"... {len(seq) - max_items} more items")
        return out_list
    return redact_cut(str(value), max_str)
