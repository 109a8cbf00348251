"""FAISS index per space, derived from SQL.

The ``signatures`` table is the truth; each space's FAISS index is a cache of it at a sequence
number, its *watermark* (see :mod:`atlas.changes`). An :class:`IndexManager` — one per API replica or
embedded process — keeps one :class:`SpaceIndex` per space and:

* on :meth:`~IndexManager.open`, loads each persisted index whose metadata (database identity, space
  fingerprints, kind, checksum) is valid, then catches up from the change sequence; a missing,
  corrupt, foreign or hopelessly stale file (watermark ahead of SQL, or behind pruned changes, or
  more pending changes than a rebuild costs) is rebuilt from SQL;
* :meth:`~IndexManager.catch_up` applies ``changes`` with ``seq > watermark`` (last op per task wins;
  an upsert re-reads the signature, so applying twice is harmless);
* :meth:`~IndexManager.persist` writes ``<space>.faiss`` and ``<space>.meta.json`` atomically
  (temporary file, fsync, rename; the checksum in the metadata binds the two files);
* :meth:`~IndexManager.search` runs under the space's read lock; updates take the write lock only
  for the in-memory apply, and a rebuild builds the new index aside and swaps it in, so searches
  always see a whole index at one watermark.

Index kinds, chosen by size: ``flat`` — ``IndexIDMap2(IndexFlatIP(m))``, exact inner product
(signatures are unit vectors, so this is cosine); ``ivf`` — ``IndexIVFFlat`` with ``nlist ~ sqrt(N)``
lists trained on a random sample of the stored signatures, ``nprobe`` lists searched with exact inner
products inside them; used once a space has at least ``ivf_min_size`` signatures (default 20,000;
``kind="auto"`` or ``"ivf"``; ``"flat"`` keeps every space exact) and retrained by a rebuild when the
space has grown 4x since training. Measured at m = 4096 on the 2-core dev box (one thread,
``bench/results/store.md``): flat ~6 ms at 10k; IVF (nprobe 16) ~4 ms at 100k with recall@10 = 1.0 on
clustered signatures — task signatures cluster by domain, which is what IVF's coarse quantizer exploits.
``use_gpu`` mirrors flat indexes to a GPU for search when faiss-gpu is installed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from atlas import changes
from atlas.errors import InvalidInput, NotFound
from atlas.models import CHANGE_DELETE, Signature, Space
from atlas.repository import bytes_to_vectors, count_signatures, iter_signatures

log = logging.getLogger(__name__)

IndexKind = Literal["auto", "flat", "ivf"]
FORMAT_VERSION = 1
_READ_CHUNK = 2048


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
    nlist: int = 0
    trained_n: int = 0
    written_at: float = 0.0


@dataclass
class OpenReport:
    """How a space's index was obtained by :meth:`IndexManager.open` / first use."""

    space_id: int
    action: Literal["loaded", "caught_up", "rebuilt"]
    reason: str
    applied: int = 0
    seconds: float = 0.0


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
    nlist: int = 0
    trained_n: int = 0
    dirty: bool = True
    lock: RWLock = field(default_factory=RWLock)
    gpu_index: Any = None

    @property
    def count(self) -> int:
        """Number of vectors in the index."""
        return len(self.ids)


def _file_checksum(path: Path) -> str:
    """``crc32:<hex>:<size>`` of a file: detects torn, truncated or bit-rotted index files (it is not
    a defence against tampering; the index directory is trusted like the database)."""
    crc = 0
    size = 0
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return f"crc32:{crc:08x}:{size}"


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not supported on every platform / filesystem
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_atomic(path: Path, writer: Any) -> None:
    """Write via ``writer(tmp_path)``, fsync, then rename over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        writer(tmp)
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


class IndexManager:
    """One FAISS index per space, derived from and kept in step with SQL.

    Parameters
    ----------
    factory
        Session factory (a read-only one is fine: the manager never writes SQL).
    directory
        Where ``<space>.faiss`` / ``<space>.meta.json`` live; ``None`` keeps indexes in memory only.
    kind
        ``"auto"``/``"ivf"`` (exact flat below ``ivf_min_size``, IVF above) or ``"flat"`` (always exact).
    nprobe
        IVF lists searched per query (16 of ``sqrt(N)`` lists: 5 % of a 100k space).
    ivf_min_size
        Spaces smaller than this stay flat (below ~20k signatures exact flat search takes a few ms at
        m = 4096, see ``bench/results/store.md``).
    rebuild_ratio
        Rebuild instead of catching up when more than ``rebuild_ratio * count + 1000`` changes are
        pending.
    catch_up_interval_s
        :meth:`search` with ``fresh=True`` checks SQL for new changes at most this often.
    use_gpu
        Search on a GPU copy of flat indexes when faiss-gpu is available.
    """

    def __init__(
        self,
        factory: sessionmaker[Session],
        directory: Path | str | None = None,
        *,
        kind: IndexKind = "auto",
        nprobe: int = 16,
        ivf_min_size: int = 20_000,
        rebuild_ratio: float = 0.5,
        catch_up_interval_s: float = 0.25,
        use_gpu: bool = False,
    ) -> None:
        if kind not in ("auto", "flat", "ivf"):
            raise InvalidInput(f"unknown index kind {kind!r}")
        self.factory = factory
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.kind: IndexKind = kind
        self.nprobe = nprobe
        self.ivf_min_size = ivf_min_size
        self.rebuild_ratio = rebuild_ratio
        self.catch_up_interval_s = catch_up_interval_s
        self.use_gpu = use_gpu and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
        if use_gpu and not self.use_gpu:
            log.warning("faiss-gpu is not available; searching on the CPU")
        self._gpu_res: Any = faiss.StandardGpuResources() if self.use_gpu else None
        self._spaces: dict[int, SpaceIndex] = {}
        self._spaces_lock = threading.Lock()
        self._apply_locks: dict[int, threading.RLock] = {}
        self._catch_up_lock = threading.Lock()
        self._seen_seq = -1
        self._last_check = 0.0
        self.reports: dict[int, OpenReport] = {}
        self._instance_id: str | None = None
        self.listeners: list[Callable[[int, list[int] | None], None]] = []
        """Called with ``(space_id, task_ids)`` after changes of those tasks were applied, and with
        ``(space_id, None)`` after a rebuild: caches derived from SQL (``atlas.caches.StateCache``) follow
        the same change log as the index."""

    # -- paths ---------------------------------------------------------------------------------

    def index_path(self, space_id: int) -> Path:
        """Path of the persisted FAISS file of a space."""
        assert self.directory is not None
        return self.directory / f"space-{space_id}.faiss"

    def meta_path(self, space_id: int) -> Path:
        """Path of the persisted metadata of a space."""
        assert self.directory is not None
        return self.directory / f"space-{space_id}.meta.json"

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> list[OpenReport]:
        """Load or build the index of every space in SQL; return what was done for each."""
        with self.factory() as session:
            space_ids = [int(i) for i in session.execute(select(Space.id).order_by(Space.id)).scalars()]
        return [self._ensure(space_id) for space_id in space_ids]

    def _apply_lock(self, space_id: int) -> threading.RLock:
        with self._spaces_lock:
            return self._apply_locks.setdefault(space_id, threading.RLock())

    def _ensure(self, space_id: int) -> OpenReport:
        """Return the report of a space's index, loading or building it on first use."""
        with self._apply_lock(space_id):
            if space_id in self._spaces:
                return self.reports[space_id]
            t0 = time.perf_counter()
            with self.factory() as session:
                space = session.get(Space, space_id)
                if space is None:
                    raise NotFound(f"space {space_id} does not exist", {"space_id": space_id})
                if self._instance_id is None:
                    self._instance_id = changes.instance_id(session)
                loaded, reason = self._try_load(session, space)
            if loaded is not None:
                self._install(loaded)
                applied = self._catch_up_space(loaded)
                action: Literal["loaded", "caught_up", "rebuilt"] = "caught_up" if applied else "loaded"
                report = OpenReport(space_id, action, reason, applied)
            else:
                self._install(self._build(space_id))
                report = OpenReport(space_id, "rebuilt", reason)
            report.seconds = time.perf_counter() - t0
            self.reports[space_id] = report
            log.info("index of space %s: %s (%s)", space_id, report.action, report.reason)
            return report

    def _notify(self, space_id: int, task_ids: list[int] | None) -> None:
        for listener in self.listeners:
            try:
                listener(space_id, task_ids)
            except Exception:
                log.warning("an index change listener failed", exc_info=True)

    def _install(self, si: SpaceIndex) -> None:
        self._notify(si.space_id, None)
        with self._spaces_lock:
            old = self._spaces.get(si.space_id)
            if old is not None:
                si.lock = old.lock
        if old is None:
            with self._spaces_lock:
                self._spaces[si.space_id] = si
            return
        with old.lock.write(), self._spaces_lock:  # swap so that no search sees a torn state
            self._spaces[si.space_id] = si

    # -- loading -------------------------------------------------------------------------------

    def _try_load(self, session: Session, space: Space) -> tuple[SpaceIndex | None, str]:
        """Load a persisted index if it is valid and worth catching up; else say why not."""
        if self.directory is None:
            return None, "no index directory"
        meta_path, index_path = self.meta_path(space.id), self.index_path(space.id)
        if not meta_path.exists() or not index_path.exists():
            return None, "no persisted index"
        try:
            meta = IndexMeta(**json.loads(meta_path.read_text()))
        except (ValueError, TypeError) as exc:
            return None, f"unreadable metadata ({exc})"
        expected = (
            FORMAT_VERSION, self._instance_id, space.id, space.model_fingerprint, space.spec_fingerprint, space.m
        )
        found = (
            meta.format, meta.instance_id, meta.space_id, meta.model_fingerprint, meta.spec_fingerprint, meta.m
        )
        if found != expected:
            return None, "persisted index belongs to another database, space or format"
        if meta.kind != self._kind_for(meta.count):
            return None, f"index kind changed ({meta.kind} -> {self._kind_for(meta.count)})"
        if _file_checksum(index_path) != meta.checksum:
            return None, "checksum mismatch (corrupt or half-written index file)"
        sql_seq, pruned = changes.last_seq(session), changes.pruned_seq(session)
        if meta.watermark > sql_seq:
            return None, f"index watermark {meta.watermark} is ahead of SQL ({sql_seq})"
        if meta.watermark < pruned:
            return None, f"changes after watermark {meta.watermark} were pruned"
        pending = changes.count_since(session, meta.watermark, space_id=space.id)
        if pending > self.rebuild_ratio * meta.count + 1000:
            return None, f"{pending} pending changes: rebuilding is cheaper"
        try:
            index = faiss.read_index(str(index_path))
        except RuntimeError as exc:
            return None, f"unreadable index file ({exc})"
        ids = self._ids_of(index)
        if index.ntotal != meta.count or index.d != space.m or len(ids) != meta.count:
            return None, "index contents do not match its metadata"
        si = SpaceIndex(
            space_id=space.id, model_fingerprint=space.model_fingerprint, spec_fingerprint=space.spec_fingerprint,
            m=space.m, kind=meta.kind, index=index, watermark=meta.watermark, ids=ids, nlist=meta.nlist,
            trained_n=meta.trained_n, dirty=False,
        )
        self._configure(si)
        return si, "watermark matches SQL" if meta.watermark == sql_seq else f"{pending} changes to apply"

    @staticmethod
    def _ids_of(index: Any) -> set[int]:
        if isinstance(index, faiss.IndexIDMap2 | faiss.IndexIDMap):
            return set(faiss.vector_to_array(index.id_map).tolist())
        ivf = faiss.extract_index_ivf(index)
        ids: list[int] = []
        invlists = ivf.invlists
        for lst in range(ivf.nlist):
            n = invlists.list_size(lst)
            if n:
                ptr = invlists.get_ids(lst)
                ids.extend(faiss.rev_swig_ptr(ptr, n).tolist())
                invlists.release_ids(lst, ptr)
        return set(ids)

    def _kind_for(self, n: int) -> str:
        return "ivf" if self.kind != "flat" and n >= self.ivf_min_size else "flat"

    def _configure(self, si: SpaceIndex) -> None:
        if si.kind == "ivf":
            faiss.extract_index_ivf(si.index).nprobe = min(self.nprobe, max(si.nlist, 1))

    # -- building ------------------------------------------------------------------------------

    def _build(self, space_id: int) -> SpaceIndex:
        """Build a space's index from the ``signatures`` table (does not touch the live index)."""
        with self.factory() as session:
            space = session.get(Space, space_id)
            if space is None:
                raise NotFound(f"space {space_id} does not exist", {"space_id": space_id})
            # Read the watermark first: every change <= it is visible to the reads below, and
            # re-applying the few that happen during the build later is harmless.
            watermark = changes.last_seq(session)
            n = count_signatures(session, space_id)
            kind = self._kind_for(n)
            nlist = trained_n = 0
            if kind == "ivf":
                nlist = max(1, round(math.sqrt(n)))
                train = self._training_sample(session, space, nlist)
                trained_n = len(train)
                quantizer = faiss.IndexFlatIP(space.m)
                index = faiss.IndexIVFFlat(quantizer, space.m, nlist, faiss.METRIC_INNER_PRODUCT)
                index.train(train)
                del train
            else:
                index = faiss.IndexIDMap2(faiss.IndexFlatIP(space.m))
            ids: set[int] = set()
            for chunk_ids, vectors in iter_signatures(session, space_id, space.m, chunk=_READ_CHUNK):
                index.add_with_ids(vectors, chunk_ids)
                ids.update(chunk_ids.tolist())
            si = SpaceIndex(
                space_id=space_id, model_fingerprint=space.model_fingerprint, spec_fingerprint=space.spec_fingerprint,
                m=space.m, kind=kind, index=index, watermark=watermark, ids=ids, nlist=nlist, trained_n=trained_n,
            )
        self._configure(si)
        return si

    @staticmethod
    def _training_sample(session: Session, space: Space, nlist: int) -> np.ndarray:
        all_ids = np.array(
            session.execute(select(Signature.task_id).where(Signature.space_id == space.id)).scalars().all(),
            dtype=np.int64,
        )
        rng = np.random.default_rng(space.id)
        take = min(len(all_ids), max(64 * nlist, 4096))
        chosen = np.sort(rng.choice(all_ids, size=take, replace=False))
        parts = []
        for start in range(0, take, _READ_CHUNK):
            part = chosen[start : start + _READ_CHUNK].tolist()
            rows = session.execute(
                select(Signature.vector).where(Signature.task_id.in_(part)).order_by(Signature.task_id)
            ).scalars().all()
            parts.append(bytes_to_vectors(rows, space.m))
        return np.ascontiguousarray(np.concatenate(parts))

    def rebuild(self, space_id: int) -> OpenReport:
        """Rebuild a space's index from SQL and swap it in (searches continue on the old one)."""
        t0 = time.perf_counter()
        with self._apply_lock(space_id):
            if self._instance_id is None:
                with self.factory() as session:
                    self._instance_id = changes.instance_id(session)
            si = self._build(space_id)
            self._install(si)
        self._catch_up_space(si)
        report = OpenReport(space_id, "rebuilt", "requested", seconds=time.perf_counter() - t0)
        self.reports[space_id] = report
        return report

    # -- catching up ---------------------------------------------------------------------------

    def catch_up(self, space_id: int | None = None, *, wait: bool = True) -> int:
        """Apply committed changes since each index's watermark; return how many were applied.

        Parameters
        ----------
        space_id
            Only this space (loading its index if needed); default all spaces, discovering new ones.
        wait
            If another thread is catching up, wait for it (``True``) or return 0 at once.
        """
        if not self._catch_up_lock.acquire(blocking=wait):
            return 0
        try:
            self._last_check = time.monotonic()
            with self.factory() as session:
                seq = changes.last_seq(session)
                if space_id is None and seq == self._seen_seq:
                    return 0
                if space_id is None:
                    targets = [int(i) for i in session.execute(select(Space.id)).scalars()]
                else:
                    targets = [space_id]
            applied = 0
            for sid in targets:
                if sid not in self._spaces:
                    applied += self._ensure(sid).applied
                else:
                    applied += self._catch_up_space(self._spaces[sid])
            if space_id is None:
                self._seen_seq = seq
            return applied
        finally:
            self._catch_up_lock.release()

    def _catch_up_space(self, si: SpaceIndex) -> int:
        with self._apply_lock(si.space_id):
            si = self._spaces.get(si.space_id, si)
            applied = 0
            with self.factory() as session:
                head = changes.last_seq(session)
                if head == si.watermark:
                    return 0
                if head < si.watermark or si.watermark < changes.pruned_seq(session):
                    reason = "SQL is behind the index" if head < si.watermark else "changes were pruned"
                    log.warning("rebuilding index of space %s: %s", si.space_id, reason)
                    fresh = self._build(si.space_id)
                    self._install(fresh)
                    return fresh.count
                while True:
                    batch = changes.changes_since(session, si.watermark, space_id=si.space_id, limit=10_000)
                    if not batch:
                        break
                    self._apply(session, si, batch)
                    applied += len(batch)
                    si.watermark = batch[-1].seq
                # Every change <= head is visible now, including those of other spaces.
                si.watermark = max(si.watermark, head)
                si.dirty = True
            grown_past_flat = si.kind == "flat" and self._kind_for(si.count) == "ivf"
            outgrew_training = si.kind == "ivf" and si.count > 4 * max(si.trained_n, 1)
            if grown_past_flat or outgrew_training:
                self._install(self._build(si.space_id))
        return applied

    def _apply(self, session: Session, si: SpaceIndex, batch: list[changes.ChangeRecord]) -> None:
        last_op: dict[int, str] = {}
        for ch in batch:
            last_op[ch.task_id] = ch.op
        upserts = [t for t, op in last_op.items() if op != CHANGE_DELETE]
        found_ids: list[int] = []
        blobs: list[bytes] = []
        for start in range(0, len(upserts), 500):
            part = upserts[start : start + 500]
            for task_id, vector in session.execute(
                select(Signature.task_id, Signature.vector).where(Signature.task_id.in_(part))
            ):
                found_ids.append(int(task_id))
                blobs.append(vector)
        vectors = bytes_to_vectors(blobs, si.m)
        remove = np.array(sorted(t for t in last_op if t in si.ids), dtype=np.int64)
        with si.lock.write():
            if len(remove):
                si.index.remove_ids(remove)
                si.ids.difference_update(remove.tolist())
            if found_ids:
                si.index.add_with_ids(vectors, np.array(found_ids, dtype=np.int64))
                si.ids.update(found_ids)
            si.gpu_index = None
        self._notify(si.space_id, list(last_op))

    # -- searching -----------------------------------------------------------------------------

    def search(
        self, space_id: int, queries: np.ndarray, k: int, *, fresh: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` stored signatures by inner product.

        Parameters
        ----------
        space_id
            The space to search (its index is loaded or built on first use).
        queries : ndarray, shape (q, m) or (m,), float32
            Unit query vectors.
        k
            Neighbours per query.
        fresh
            First apply new changes from SQL (at most every ``catch_up_interval_s``; never waits for
            another thread's catch-up).

        Returns
        -------
        scores : ndarray, shape (q, min(k, count)), float32
            Inner products, descending.
        ids : ndarray, shape (q, min(k, count)), int64
            Task ids; ``-1`` where an IVF search found fewer than ``k``.
        """
        if k < 1:
            raise InvalidInput("k must be at least 1", {"k": k})
        if space_id not in self._spaces:
            self._ensure(space_id)
        if fresh and time.monotonic() - self._last_check >= self.catch_up_interval_s:
            self.catch_up(wait=False)
        si = self._spaces[space_id]
        q = np.ascontiguousarray(np.atleast_2d(np.asarray(queries, dtype=np.float32)))
        if q.ndim != 2 or q.shape[1] != si.m:
            raise InvalidInput(f"queries must have shape (q, {si.m})", {"shape": list(np.shape(queries))})
        with si.lock.read():
            si = self._spaces[space_id]  # a rebuild may have swapped it in
            n = si.index.ntotal
            if n == 0:
                return np.empty((q.shape[0], 0), np.float32), np.empty((q.shape[0], 0), np.int64)
            index = self._search_index(si)
            scores, ids = index.search(q, min(k, n))
        return scores, ids

    def _search_index(self, si: SpaceIndex) -> Any:
        if not self.use_gpu or si.kind != "flat":
            return si.index
        if si.gpu_index is None:  # benign race: two readers may both copy; one wins
            si.gpu_index = faiss.index_cpu_to_gpu(self._gpu_res, 0, si.index)
        return si.gpu_index

    # -- persistence ---------------------------------------------------------------------------

    def persist(self, space_id: int | None = None, *, force: bool = False) -> list[int]:
        """Atomically write changed indexes (or ``space_id``'s) to disk; return the spaces written."""
        if self.directory is None:
            return []
        written = []
        targets = [space_id] if space_id is not None else list(self._spaces)
        for sid in targets:
            si = self._spaces.get(sid)
            if si is None or not (si.dirty or force):
                continue
            with self._apply_lock(sid):  # no apply between writing the file and reading its watermark
                si = self._spaces[sid]
                with si.lock.read():
                    _write_atomic(self.index_path(sid), lambda p, idx=si.index: faiss.write_index(idx, str(p)))
                meta = IndexMeta(
                    format=FORMAT_VERSION, instance_id=self._instance_id or "", space_id=sid,
                    model_fingerprint=si.model_fingerprint, spec_fingerprint=si.spec_fingerprint, m=si.m,
                    kind=si.kind, watermark=si.watermark, count=si.count, checksum=_file_checksum(self.index_path(sid)),
                    nlist=si.nlist, trained_n=si.trained_n, written_at=time.time(),
                )
                _write_atomic(self.meta_path(sid), lambda p, m=meta: p.write_text(json.dumps(asdict(m), indent=1)))
                _fsync_dir(self.index_path(sid).parent)
                si.dirty = False
            written.append(sid)
        return written

    # -- introspection -------------------------------------------------------------------------

    def stats(self, space_id: int) -> dict[str, Any]:
        """Kind, count, watermark and last open report of a space's index."""
        if space_id not in self._spaces:
            self._ensure(space_id)
        si = self._spaces[space_id]
        report = self.reports.get(space_id)
        return {
            "space_id": space_id, "kind": si.kind, "count": si.count, "watermark": si.watermark,
            "nlist": si.nlist, "nprobe": self.nprobe if si.kind == "ivf" else None,
            "opened": asdict(report) if report else None,
        }

    def ids(self, space_id: int) -> np.ndarray:
        """Sorted task ids currently in a space's index."""
        if space_id not in self._spaces:
            self._ensure(space_id)
        si = self._spaces[space_id]
        with si.lock.read():
            return np.array(sorted(si.ids), dtype=np.int64)

    def watermark(self, space_id: int) -> int:
        """Watermark of a space's index."""
        if space_id not in self._spaces:
            self._ensure(space_id)
        return self._spaces[space_id].watermark
