"""Spaces: list, get, export (JSON lines), import (all or nothing, then the index catches up)."""

from __future__ import annotations

import gzip
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from atlas import space_io
from atlas.errors import InvalidInput, NotFound, PayloadTooLarge
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

    def import_file(self, file: BinaryIO, *, on_conflict: str = "fail",
                    max_bytes: int | None = None) -> tuple[int, int, list[str]]:
        """:meth:`import_space` of an export file, read through a memory map (not copied into memory); a gzipped
        export (``export x.jsonl.gz``) is decompressed first, to at most ``max_bytes``."""
        with gunzipped(file, max_bytes) as plain, space_io.map_export(plain) as data:
            return self.import_space(data, on_conflict=on_conflict)

    def import_space(self, data: space_io.ExportBytes, *, on_conflict: str = "fail") -> tuple[int, int, list[str]]:
        """Restore an export (all or nothing), then bring the index up to date: returns
        ``(space_id, imported, skipped_names)``."""
        space_id, imported, skipped = space_io.import_space(self.store.write, data, on_conflict=on_conflict,
                                                                fingerprint_aliases=self.store.fingerprint_aliases)
        self.index.catch_up(space_id)
        return space_id, imported, skipped


GZIP_MAGIC = b"\x1f\x8b"


@contextmanager
def gunzipped(file: BinaryIO, max_bytes: int | None) -> Iterator[BinaryIO]:
    """``file`` as it is, or, when its first bytes say it is gzipped (whatever its name), its content decompressed into
    a temporary file of at most ``max_bytes`` (:class:`PayloadTooLarge` past it: a small bomb is not inflated whole).
    The CLI's and the client's imports decompressed a ``.gz`` export; the REST import and library mode read its
    compressed bytes as "not a FisherAtlas space export header" (a parity review, 2026-12-07)."""
    start = file.read(len(GZIP_MAGIC))
    file.seek(0)
    if start != GZIP_MAGIC:
        yield file
        return
    with tempfile.TemporaryFile() as out:
        written = 0
        try:
            with gzip.GzipFile(fileobj=file, mode="rb") as packed:
                while chunk := packed.read(1 << 20):
                    written += len(chunk)
                    if max_bytes is not None and written > max_bytes:
                        raise PayloadTooLarge(f"the gzipped export holds more than the import limit of {max_bytes} "
                                              "bytes (setting max_import_bytes)", {"max_import_bytes": max_bytes})
                    out.write(chunk)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise InvalidInput(f"the export is gzipped but cannot be decompressed ({exc})") from None
        out.seek(0)
        yield out
