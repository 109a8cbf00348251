"""Task names: the one stored form of a name and the names no task may take."""

from __future__ import annotations

import unicodedata

from atlas.errors import InvalidInput
from atlas.samples import INVISIBLE_CHARS, refuse_control_chars

_ONCE_ALLOWED = INVISIBLE_CHARS | frozenset("\u2028\u2029")
"""Characters an exported name may hold (names could, until 2026-11-25 and 2026-12-07)."""

RESERVED_NAME = "none"
"""The task name no new task may take (in any case): ``fit`` reads the label as "the prompt belongs to no task"."""


def normalize_name(name: str, *, imported: bool = False) -> str:
    """A task name as stored: surrounding whitespace removed, NFC-normalised, 1-300 characters, no NUL, control
    or invisible characters, not ``none`` in any case (422 otherwise: ``fit`` labels read it as "no task"), not ASCII
    digits alone (they read as a task id wherever a name or an id is taken: the CLI found the task named "3" for
    ``tasks delete 3``, and task 3 could not be named).
    ``imported``: an export's name, where invisible characters, line and paragraph separators, ``none`` and digits
    alone are kept (names could hold them before 2026-11-25, 2026-12-07, 2026-11-28 and 2026-12-07, and an import is
    all or nothing; such a task is labelled, and found by the CLI, by its id).

    Raises
    ------
    InvalidInput
        A name that breaks one of these rules.
    """
    clean = name.strip()
    if not clean or len(clean) > 300:
        raise InvalidInput("a task name must have 1 to 300 characters", {"name": name[:300]})
    if "\x00" in clean or any(0xD800 <= ord(ch) <= 0xDFFF for ch in clean):
        raise InvalidInput("a task name cannot hold NUL characters or lone surrogates")
    refuse_control_chars(clean, "a task name", allowed=_ONCE_ALLOWED if imported else frozenset())
    if not imported and clean.casefold() == RESERVED_NAME:
        raise InvalidInput(f'a task cannot be named {clean!r}: "{RESERVED_NAME}" labels a prompt of no task (fit)',
                           {"name": clean})
    if not imported and clean.isascii() and clean.isdigit():
        raise InvalidInput(f"a task cannot be named {clean!r}: a name of digits alone reads as a task id (the CLI, the "
                           "client's find_task and fit labels take a name or an id); add a letter", {"name": clean})
    return unicodedata.normalize("NFC", clean)  # one stored form: a decomposed 'café' is the same name
