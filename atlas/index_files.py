"""Files and locks of the FAISS indexes (:mod:`atlas.index`): metadata, checksums, atomic writes.

``<space>.faiss`` (and, for two-stage indexes, ``<space>.coarse.faiss``) plus ``<space>.meta.json``
are written atomically (temporary file, fsync, rename); the CRC32 checksums in the metadata bind the
files together, so a torn, truncated or foreign file is detected and the index rebuilt from SQL.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import faiss
from pydantic import TypeAdapter

from atlas.index_ann import TwoStageIndex

FORMAT_VERSION = 2
"""Version of the persisted layout (2: two-stage ``ivf`` indexes with a coarse file)."""


class RWLock:
    """Readers share, a writer is exclusive; waiting writers go first (no writer starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        """Hold the lock shared."""
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """Hold the lock exclusively."""
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass
class IndexMeta:
    """Contents of ``<space>.meta.json``."""

    format: int
    instance_id: str
    space_id: int
    model_fingerprint: str
    spec_fingerprint: str
    m: int
    kind: str
    watermark: int
    count: int
    checksum: str
    coarse_checksum: str = ""
    dim: int = 0
    nlist: int = 0
    trained_n: int = 0
    written_at: float = 0.0
    watermark_mark: str = ""
    """``atlas.changes.mark`` of the change at ``watermark`` ("" in files of before: not checked)."""


_META: TypeAdapter[IndexMeta] = TypeAdapter(IndexMeta)


NO_INDEX_DIR = "no index directory"
NO_PERSISTED_INDEX = "no persisted index"


@dataclass
class OpenReport:
    """How a space's index was obtained by :meth:`IndexManager.open` / first use."""

    space_id: int
    action: Literal["loaded", "caught_up", "rebuilt"]
    reason: str
    applied: int = 0
    seconds: float = 0.0

    @property
    def damaged(self) -> bool:
        """Rebuilt from SQL because files were there and could not be used (corrupt, of another store, stale): worth
        an operator's attention, unlike a first start or a removed index directory."""
        return self.action == "rebuilt" and self.reason not in (NO_INDEX_DIR, NO_PERSISTED_INDEX)


@dataclass
class SpaceIndex:
    """The in-memory index of one space and its bookkeeping."""

    space_id: int
    model_fingerprint: str
    spec_fingerprint: str
    m: int
    kind: str
    index: Any
    watermark: int
    ids: set[int] = field(default_factory=set)
    content_seq: int = -1
    """Change-log position of the last change to this space's own tasks that the index reflects (the
    build's or the loaded file's watermark until a change of the space is applied): what derived per-space state
    (the ranking's whitening) is keyed on, so that other spaces' changes leave it alone."""
    nlist: int = 0
    trained_n: int = 0
    dirty: bool = True
    persisted_watermark: int = -1
    watermark_mark: str = ""
    """:func:`atlas.changes.mark` of the change at ``watermark`` ("" when unknown): a catch-up that finds
    another change there (a database restored under a running replica) rebuilds instead of catching up."""
    lock: RWLock = field(default_factory=RWLock)
    gpu_index: Any = None

    @property
    def count(self) -> int:
        """Number of vectors in the index."""
        return len(self.ids)


def file_checksum(path: Path) -> str:
    """``crc32:<hex>:<size>`` of a file: detects torn, truncated or bit-rotted index files (it is not
    a defence against tampering; the index directory is trusted like the database)."""
    crc = 0
    size = 0
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return f"crc32:{crc:08x}:{size}"


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not supported on every platform / filesystem
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, writer: Any) -> None:
    """Write via ``writer(tmp_path)``, fsync, then rename over ``path`` (its directory made again if it was removed
    while the service ran: every save failed, with a traceback a second, until someone made it by hand)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        writer(tmp)
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def remove_stale_temp_files(directory: Path, *, dead_after_s: float = 60.0, any_after_s: float = 3600.0) -> int:
    """Delete the temporary files of :func:`write_atomic` that a killed process left (its ``finally`` never ran: one
    index-sized file per crash, never removed); return how many. A file is stale when its writer's pid is gone and it
    is older than ``dead_after_s``, or older than ``any_after_s`` whatever the pid (another container's process):
    another live process writing into the same directory (a library beside a server) keeps its file."""
    removed, now = 0, time.time()
    for tmp in directory.glob(".space-*.tmp"):
        try:
            age = now - tmp.stat().st_mtime
            pid = int(tmp.name.rsplit(".", 3)[-3])
        except (OSError, ValueError, IndexError):
            continue
        if age > any_after_s or (age > dead_after_s and not _alive(pid)):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, not ours
        return True
    return True


class IndexFiles:
    """The persisted files of the spaces' indexes in one directory.

    ``space-<id>.faiss`` (flat index, or the full-vector stage of a two-stage index),
    ``space-<id>.coarse.faiss`` (coarse stage, two-stage only) and ``space-<id>.meta.json``.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.removed_temp_files = remove_stale_temp_files(directory)

    def index_path(self, space_id: int) -> Path:
        """Flat index or full-vector stage."""
        return self.directory / f"space-{space_id}.faiss"

    def coarse_path(self, space_id: int) -> Path:
        """Coarse stage of a two-stage index."""
        return self.directory / f"space-{space_id}.coarse.faiss"

    def meta_path(self, space_id: int) -> Path:
        """Metadata."""
        return self.directory / f"space-{space_id}.meta.json"

    def read_meta(self, space_id: int) -> tuple[IndexMeta | None, str]:
        """The metadata of a space's files, or ``None`` and why not."""
        meta_path, index_path = self.meta_path(space_id), self.index_path(space_id)
        if not meta_path.exists() or not index_path.exists():
            return None, NO_PERSISTED_INDEX
        try:  # every field of its type: a valid JSON ``"count": null`` stopped the service from starting
            return _META.validate_json(meta_path.read_bytes(), strict=True), ""
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            return None, f"unreadable metadata ({str(exc).splitlines()[0]})"

    def checksums_match(self, meta: IndexMeta) -> bool:
        """Whether the files on disk are the ones the metadata describes."""
        if file_checksum(self.index_path(meta.space_id)) != meta.checksum:
            return False
        if meta.kind != "ivf":
            return True
        coarse = self.coarse_path(meta.space_id)
        return coarse.exists() and file_checksum(coarse) == meta.coarse_checksum

    def read_index(self, meta: IndexMeta) -> Any:
        """Read the index the metadata describes (raises ``RuntimeError`` / ``ValueError`` if unreadable)."""
        if meta.kind == "ivf":
            return TwoStageIndex.read(self.index_path(meta.space_id), self.coarse_path(meta.space_id))
        return faiss.read_index(str(self.index_path(meta.space_id)))

    def write(self, index: Any, meta: IndexMeta) -> IndexMeta:
        """Atomically write ``index`` and then its metadata (checksums filled in here)."""
        sid = meta.space_id
        if isinstance(index, TwoStageIndex):
            write_atomic(self.index_path(sid), lambda p: faiss.write_index(index.full, str(p)))
            write_atomic(self.coarse_path(sid), lambda p: faiss.write_index(index.coarse, str(p)))
            meta.coarse_checksum = file_checksum(self.coarse_path(sid))
            meta.dim = index.dim
        else:
            write_atomic(self.index_path(sid), lambda p: faiss.write_index(index, str(p)))
        meta.checksum = file_checksum(self.index_path(sid))
        write_atomic(self.meta_path(sid), lambda p: p.write_text(json.dumps(asdict(meta), indent=1)))
        fsync_dir(self.directory)
        return meta
