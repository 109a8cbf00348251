"""Spaces: list, get, export (JSON lines), import (all or nothing, then the index catches up)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

from atlas import space_io
from atlas.errors import NotFound
from atlas.index import IndexManager
from atlas.models import Space
from atlas.store import Store


class SpaceService:
    """Spaces of the store (see the module docstring)."""

    def __init__(self, store: Store, index: IndexManager) -> None:
        self.store = store
        self.index = index

    def all(self) -> list[dict[str, Any]]:
        """Every space with its task count."""
        return self.store.list_spaces()

    def get(self, ref: str | int | None) -> dict[str, Any]:
        """One space (by id, ``default`` or model name) with its task count."""
        with self.store.read() as session:
            space_id = self.store.resolve_space(session, ref).id
        for s in self.store.list_spaces():
            if s["id"] == space_id:
                return s
        raise NotFound(f"space {ref} does not exist", {"space": str(ref)})

    def export_lines(self, ref: str | int | None) -> tuple[Space, Iterator[bytes]]:
        """A space as JSON lines (:func:`atlas.space_io.export_lines`)."""
        with self.store.read() as session:
            space = self.store.resolve_space(session, ref)
            ids = space_io.ready_task_ids(session, space.id)
            session.expunge(space)
        return space, space_io.export_lines(self.store.read, space, ids)

    def import_file(self, file: BinaryIO, *, on_conflict: str = "fail") -> tuple[int, int, list[str]]:
        """:meth:`import_space` of an export file, read through a memory map (not copied into memory)."""
        with space_io.map_export(file) as data:
            return self.import_space(data, on_conflict=on_conflict)

    def import_space(self, data: space_io.ExportBytes, *, on_conflict: str = "fail") -> tuple[int, int, list[str]]:
        """Restore an export (all or nothing), then bring the index up to date: returns
        ``(space_id, imported, skipped_names)``."""
        space_id, imported, skipped = space_io.import_space(self.store.write, data, on_conflict=on_conflict,
                                                                fingerprint_aliases=self.store.fingerprint_aliases)
        self.index.catch_up(space_id)
        return space_id, imported, skipped
