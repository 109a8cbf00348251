"""One page of a listing (shared by the repositories)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing and the total number of matching rows."""

    items: list[T]
    total: int
    offset: int
    limit: int
