"""Task names: the one stored form of a name and the names no task may take."""

from __future__ import annotations

import unicodedata

from atlas.errors import InvalidInput
from atlas.samples import INVISIBLE_CHARS, is_control_char, refuse_control_chars

_ONCE_ALLOWED = INVISIBLE_CHARS | frozenset("\u2028\u2029")
"""Characters an imported name keeps as they are (names could hold them until 2026-11-25 and 2026-12-07; they move
no cursor). Any other control character of an imported name is written as its ``\\uXXXX`` escape."""

RESERVED_NAME = "none"
"""The task name no new task may take (in any case): ``fit`` reads the label as "the prompt belongs to no task"."""


def normalize_name(name: str, *, imported: bool = False, keep_form: bool = False) -> str:
    """A task name as stored: surrounding whitespace removed, NFC-normalised, 1-300 characters, no NUL, control
    or invisible characters, not ``none`` in any case (422 otherwise: ``fit`` labels read it as "no task"), not ASCII
    digits alone (they read as a task id wherever a name or an id is taken: the CLI found the task named "3" for
    ``tasks delete 3``, and task 3 could not be named).
    ``imported``: an export's name, where invisible characters, line and paragraph separators, ``none`` and digits
    alone are kept (names could hold them before 2026-11-25, 2026-12-07, 2026-11-28 and 2026-12-07, and an import is
    all or nothing; such a task is labelled, and found by the CLI, by its id), and any other control character (a
    newline, ESC, a bidirectional override: taken before 2026-11-25) is written as its ``\\uXXXX`` escape — an old
    store's own export was refused by its import, and kept as they were, a name's newline forged rows of ``tasks
    list``. ``keep_form``: not NFC-normalised (an import
    of two names of one normal form, which a store of names from before normalisation holds apart).

    Raises
    ------
    InvalidInput
        A name that breaks one of these rules.
    """
    clean = name.strip()
    if "\x00" in clean or any(0xD800 <= ord(ch) <= 0xDFFF for ch in clean):
        raise InvalidInput("a task name cannot hold NUL characters or lone surrogates")
    if imported:  # a store keeps the names taken before they were refused (2026-11-25): its export imports
        clean = "".join(f"\\u{ord(c):04x}" if is_control_char(c) and c not in _ONCE_ALLOWED else c for c in clean)
    if not clean or len(clean) > 300:
        raise InvalidInput("a task name must have 1 to 300 characters", {"name": name[:300]})
    if not imported:
        refuse_control_chars(clean, "a task name")
    if not imported and clean.casefold() == RESERVED_NAME:
        raise InvalidInput(f'a task cannot be named {clean!r}: "{RESERVED_NAME}" labels a prompt of no task (fit)',
                           {"name": clean})
    if not imported and clean.isascii() and clean.isdigit():
        raise InvalidInput(f"a task cannot be named {clean!r}: a name of digits alone reads as a task id (the CLI, the "
                           "client's find_task and fit labels take a name or an id); add a letter", {"name": clean})
    if keep_form:  # an import's name whose normal form another of its tasks has (both were stored apart)
        return clean
    stored = unicodedata.normalize("NFC", clean)  # one stored form: a decomposed 'café' is the same name
    if len(stored) > 300:  # NFC can lengthen a name (U+0958 is two characters in it): 300 of U+0958 made 600
        raise InvalidInput(f"a task name must have 1 to 300 characters; this one has {len(stored)} in its normal form "
                           "(NFC, as it is stored: some characters are written as two)", {"name": name[:300]})
    return stored
