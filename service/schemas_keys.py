"""Response models of ``/v1/keys`` (API key management), shared by the routes and the client."""

from __future__ import annotations

import datetime as dt
import warnings
from typing import Any

from pydantic import BaseModel

from atlas.vocabulary import Scope as ScopeName


class _KeyMapping(BaseModel):
    """The client's key methods returned dicts until 2026-12-07: ``key["scopes"]`` and ``key.get(...)`` still read a
    field, with a :class:`DeprecationWarning` (read the attribute)."""

    def __getitem__(self, name: str) -> Any:
        warnings.warn(f"{type(self).__name__}[{name!r}] is deprecated: read .{name}", DeprecationWarning, stacklevel=2)
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        """``self[name]``, or ``default`` for a field it has not (deprecated: read the attribute)."""
        warnings.warn(f"{type(self).__name__}.get({name!r}) is deprecated: read .{name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(self, name, default)


class KeyOut(_KeyMapping):
    """A key without its secret."""

    id: int
    name: str
    prefix: str
    scopes: list[str]
    created_at: dt.datetime | None = None
    last_used_at: dt.datetime | None = None
    revoked: bool = False


class KeyCreated(KeyOut):
    """A new key: ``key`` is the plaintext, shown only in this answer."""

    key: str


class CurrentKey(_KeyMapping):
    """The key of the calling request: ``key_id`` is null for an anonymous caller (the service asks no key, and
    such a caller holds every scope)."""

    key_id: int | None
    name: str
    scopes: list[ScopeName]


class KeyList(_KeyMapping):
    """All keys."""

    items: list[KeyOut]
