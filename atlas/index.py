"""FAISS index per space, derived from SQL.

The ``signatures`` table is the truth; each space's FAISS index is a cache of it at a sequence
number, its *watermark* (see :mod:`atlas.changes`). An :class:`IndexManager` — one per API replica or
embedded process — keeps one :class:`SpaceIndex` per space and:

* on :meth:`~IndexManager.open`, loads each persisted index whose metadata (database identity, the change at
  its watermark, space fingerprints, kind, checksum) is valid, then catches up from the change sequence; a
  missing, corrupt, foreign or stale file (watermark ahead of SQL or behind pruned changes, too many pending
  changes, another history) is rebuilt from SQL;
* :meth:`~IndexManager.catch_up` applies ``changes`` with ``seq > watermark`` (last op per task wins;
  an upsert re-reads the signature, so applying twice is harmless);
* :meth:`~IndexManager.persist` writes ``<space>.faiss`` and ``<space>.meta.json`` atomically
  (temporary file, fsync, rename; the checksum in the metadata binds the two files);
* :meth:`~IndexManager.search` runs under the space's read lock; updates take the write lock only for the
  in-memory apply, and a rebuild builds the new index aside and swaps it in (a whole index at one watermark).

Index kinds, chosen by size: ``flat`` (``IndexIDMap2(IndexFlatIP(m))``, exact cosine, ~1.4 µs per task
per query at m = 4096) below ``ivf_min_size`` (4,096) signatures, else ``ivf`` — the two-stage
:class:`atlas.index_ann.TwoStageIndex` (IVF over 256-d projections, exact re-rank: exact scores,
recall@10 ≥ 0.99 at 10k–100k, ``bench/results/index.md``), trained on ≤ 16,384 sampled signatures and
retrained by a rebuild when it grows 4x past its size at training (``nlist ~ sqrt(n)``); ``kind="flat"``
keeps every space flat; ``use_gpu`` mirrors flat indexes to a GPU when faiss-gpu is installed.

The change log may be pruned (:meth:`IndexManager.compact`): an index whose watermark is below the pruned
point rebuilds from SQL instead of catching up, and a catch-up that raced with a prune notices it (the
pruned point is read after the changes) and rebuilds too.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from atlas import changes
from atlas.errors import InvalidInput, NotFound
from atlas.index_ann import TwoStageIndex, read_signatures, training_sample
from atlas.index_files import FORMAT_VERSION, NO_INDEX_DIR, IndexFiles, IndexMeta, OpenReport, SpaceIndex
from atlas.models import CHANGE_DELETE, Space
from atlas.repository import count_signatures, iter_signatures

log = logging.getLogger(__name__)

IndexKind = Literal["flat", "ivf", "auto"]
_READ_CHUNK = 2048
_TRAIN_SAMPLE = 16_384


class IndexManager:
    """One FAISS index per space, derived from and kept in step with SQL.

    Parameters
    ----------
    factory
        Session factory (a read-only one is fine: the manager never writes SQL).
    directory
        Where ``<space>.faiss`` / ``<space>.meta.json`` live; ``None`` keeps indexes in memory only.
    kind
        ``"flat"`` (always exact), or ``"ivf"`` / ``"auto"`` (same: flat below ``ivf_min_size``,
        two-stage above).
    nprobe
        Coarse lists scanned per query (32 of ``sqrt(N)`` lists: about 10% of a 100k space).
    ivf_min_size
        Spaces smaller than this stay flat.
    coarse_dim
        Length of the coarse codes of two-stage indexes.
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
        nprobe: int = 32,
        ivf_min_size: int = 4096,
        coarse_dim: int = 256,
        rebuild_ratio: float = 0.5,
        catch_up_interval_s: float = 0.25,
        use_gpu: bool = False,
    ) -> None:
        if kind not in ("flat", "ivf", "auto"):
            raise InvalidInput(f"unknown index kind {kind!r}")
        self.coarse_dim = coarse_dim
        self.factory = factory
        self.directory = Path(directory) if directory is not None else None
        self.files = IndexFiles(self.directory) if self.directory is not None else None
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
        self._seen_seq, self._seen_mark = -1, ""  # the head seen and its changes.mark (restores reuse numbers)
        self._last_check = 0.0
        self.reports: dict[int, OpenReport] = {}
        self._instance_id: str | None = None

    # -- paths ---------------------------------------------------------------------------------

    def index_path(self, space_id: int) -> Path:
        """Path of the persisted FAISS file of a space."""
        assert self.files is not None
        return self.files.index_path(space_id)

    def meta_path(self, space_id: int) -> Path:
        """Path of the persisted metadata of a space."""
        assert self.files is not None
        return self.files.meta_path(space_id)

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
            log.log(logging.WARNING if report.damaged else logging.INFO, "index of space %s: %s (%s)", space_id,
                    report.action, report.reason)
            return report

    def _install(self, si: SpaceIndex) -> None:
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
        if self.directory is None or self.files is None:
            return None, NO_INDEX_DIR
        meta, why = self.files.read_meta(space.id)
        if meta is None:
            return None, why
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
        if not self.files.checksums_match(meta):
            return None, "checksum mismatch (corrupt or half-written index file)"
        sql_seq, pruned = changes.last_seq(session), changes.pruned_seq(session)
        if meta.watermark > sql_seq:
            return None, f"index watermark {meta.watermark} is ahead of SQL ({sql_seq})"
        if meta.watermark < pruned:
            return None, f"changes after watermark {meta.watermark} were pruned"
        if not changes.same_history(session, meta.watermark, meta.watermark_mark):
            return None, "the change at the index's watermark differs in SQL (a database restored from a backup?)"
        pending = changes.count_since(session, meta.watermark, space_id=space.id)
        if pending > self.rebuild_ratio * meta.count + 1000:
            return None, f"{pending} pending changes: rebuilding is cheaper"
        try:
            index = self.files.read_index(meta)
        except (RuntimeError, ValueError) as exc:
            return None, f"unreadable index file ({exc})"
        ids = self._ids_of(index)
        if index.ntotal != meta.count or index.d != space.m or len(ids) != meta.count:
            return None, "index contents do not match its metadata"
        si = SpaceIndex(
            space_id=space.id, model_fingerprint=space.model_fingerprint, spec_fingerprint=space.spec_fingerprint,
            m=space.m, kind=meta.kind, index=index, watermark=meta.watermark, content_seq=meta.watermark, ids=ids,
            nlist=meta.nlist, trained_n=meta.trained_n, dirty=False, persisted_watermark=meta.watermark,
            watermark_mark=meta.watermark_mark,
        )
        self._configure(si)
        return si, "watermark matches SQL" if meta.watermark == sql_seq else f"{pending} changes to apply"

    @staticmethod
    def _ids_of(index: Any) -> set[int]:
        if isinstance(index, TwoStageIndex):
            return set(index.ids().tolist())
        return set(faiss.vector_to_array(index.id_map).tolist())

    def _kind_for(self, n: int) -> str:
        return "ivf" if self.kind != "flat" and n >= self.ivf_min_size else "flat"

    def _configure(self, si: SpaceIndex) -> None:
        if isinstance(si.index, TwoStageIndex):
            si.index.nprobe = self.nprobe

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
            index: Any
            if kind == "ivf":
                train = training_sample(session, space.id, space.m, _TRAIN_SAMPLE)
                trained_n = len(train)
                index = TwoStageIndex.train(train, nlist=max(1, round(math.sqrt(n))), dim=self.coarse_dim,
                                            seed=space.id)
                nlist = index.nlist
                del train
            else:
                index = faiss.IndexIDMap2(faiss.IndexFlatIP(space.m))
            ids: set[int] = set()
            for chunk_ids, vectors in iter_signatures(session, space_id, space.m, chunk=_READ_CHUNK):
                index.add_with_ids(vectors, chunk_ids)
                ids.update(chunk_ids.tolist())
            si = SpaceIndex(
                space_id=space_id, model_fingerprint=space.model_fingerprint, spec_fingerprint=space.spec_fingerprint,
                m=space.m, kind=kind, index=index, watermark=watermark, content_seq=watermark, ids=ids, nlist=nlist,
                trained_n=trained_n, watermark_mark=changes.mark(session, watermark) or "",
            )
        self._configure(si)
        return si

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
                log_head = changes.head(session, self._seen_seq)
                if space_id is None and log_head.unchanged(self._seen_mark):
                    return 0
                seq, seen_mark = log_head.seq, log_head.mark if space_id is None else ""
                targets = list(session.execute(select(Space.id)).scalars()) if space_id is None else [space_id]
            applied = 0
            for sid in targets:
                if sid not in self._spaces:
                    applied += self._ensure(sid).applied
                else:
                    applied += self._catch_up_space(self._spaces[sid])
            if space_id is None:
                self._seen_seq, self._seen_mark = seq, seen_mark
            return applied
        finally:
            self._catch_up_lock.release()

    def _catch_up_space(self, si: SpaceIndex) -> int:
        with self._apply_lock(si.space_id):
            si = self._spaces.get(si.space_id, si)
            applied = 0
            with self.factory() as session:
                log_head = changes.head(session, si.watermark)
                head = log_head.seq
                if log_head.unchanged(si.watermark_mark):
                    return 0
                if head < si.watermark or si.watermark < changes.pruned_seq(session):
                    return self._rebuild_now(si, "SQL is behind" if head < si.watermark else "changes were pruned")
                if not log_head.same_history(si.watermark_mark):
                    return self._rebuild_now(si, "the change at the watermark differs (a database restored?)")
                start = si.watermark
                while True:
                    batch = changes.changes_since(session, si.watermark, space_id=si.space_id, limit=10_000)
                    if not batch:
                        break
                    self._apply(session, si, batch)
                    applied += len(batch)
                    si.watermark = si.content_seq = batch[-1].seq
                if changes.pruned_seq(session) > start:  # a prune raced with the reads above
                    return self._rebuild_now(si, "changes were pruned during catch-up")
                # Every change <= head is visible now, including those of other spaces.
                si.watermark = max(si.watermark, head)
                si.watermark_mark, si.dirty = changes.mark(session, si.watermark) or "", True
            grown_past_flat = si.kind == "flat" and self._kind_for(si.count) == "ivf"
            outgrew_training = si.kind == "ivf" and si.count > 4 * max(si.trained_n, si.nlist ** 2, 1)
            if grown_past_flat or outgrew_training:
                self._install(self._build(si.space_id))
        return applied

    def _rebuild_now(self, si: SpaceIndex, reason: str) -> int:
        log.warning("rebuilding index of space %s: %s", si.space_id, reason)
        fresh = self._build(si.space_id)
        self._install(fresh)
        return fresh.count

    def _apply(self, session: Session, si: SpaceIndex, batch: list[changes.ChangeRecord]) -> None:
        last_op: dict[int, str] = {}
        for ch in batch:
            last_op[ch.task_id] = ch.op
        upserts = [t for t, op in last_op.items() if op != CHANGE_DELETE]
        found_ids, vectors = read_signatures(session, upserts, si.m)
        remove = np.array(sorted(t for t in last_op if t in si.ids), dtype=np.int64)
        with si.lock.write():
            if len(remove):
                si.index.remove_ids(remove)
                si.ids.difference_update(remove.tolist())
            if found_ids:
                si.index.add_with_ids(vectors, np.array(found_ids, dtype=np.int64))
                si.ids.update(found_ids)
            si.gpu_index = None

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
        self._space(space_id)
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
        if self.files is None:
            return []
        written = []
        for sid in [space_id] if space_id is not None else list(self._spaces):
            si = self._spaces.get(sid)
            if si is None or not (si.dirty or force):
                continue
            with self._apply_lock(sid):  # no apply between writing the file and reading its watermark
                si = self._spaces[sid]  # its mark, not SQL's now: the file must say which history it holds
                meta = IndexMeta(
                    format=FORMAT_VERSION, instance_id=self._instance_id or "", space_id=sid,
                    model_fingerprint=si.model_fingerprint, spec_fingerprint=si.spec_fingerprint, m=si.m,
                    kind=si.kind, watermark=si.watermark, count=si.count, checksum="", nlist=si.nlist,
                    trained_n=si.trained_n, written_at=time.time(), watermark_mark=si.watermark_mark,
                )
                with si.lock.read():
                    self.files.write(si.index, meta)
                si.dirty = False
                si.persisted_watermark = si.watermark
            written.append(sid)
        return written

    def compact(self, write_factory: sessionmaker[Session], *, retain: int = 100_000) -> int:
        """Prune the change log through a compaction point (:func:`atlas.changes.compact`); return the
        rows deleted. The floors are this manager's persisted watermarks (the in-memory ones when
        nothing is persisted), so its own files can still catch up after a restart. Call it after
        :meth:`persist`; other replicas that need pruned changes rebuild from SQL."""
        floors = [si.watermark if self.files is None else si.persisted_watermark for si in list(self._spaces.values())]
        with write_factory.begin() as session:
            return changes.compact(session, retain=retain, floors=[f for f in floors if f >= 0])

    def stats(self, space_id: int) -> dict[str, Any]:
        """Kind, count, watermark and last open report of a space's index."""
        si = self._space(space_id)
        report = self.reports.get(space_id)
        ivf = si.kind == "ivf"
        return {"space_id": space_id, "kind": si.kind, "count": si.count, "watermark": si.watermark, "nlist": si.nlist,
                "nprobe": self.nprobe if ivf else None, "coarse_dim": si.index.dim if ivf else None,
                "opened": asdict(report) if report else None}

    def ids(self, space_id: int) -> np.ndarray:
        """Sorted task ids currently in a space's index."""
        si = self._space(space_id)
        with si.lock.read():
            return np.array(sorted(si.ids), dtype=np.int64)

    def watermark(self, space_id: int) -> int:
        """Watermark of a space's index."""
        return self._space(space_id).watermark

    def history(self, space_id: int) -> tuple[int, str]:
        """(watermark, :func:`atlas.changes.mark` of the change at it) of a space's index."""
        si = self._space(space_id)
        return si.watermark, si.watermark_mark

    def content_mark(self, space_id: int) -> int:
        """:attr:`SpaceIndex.content_seq`: moves when the space's own tasks change, not when another space's do."""
        return self._space(space_id).content_seq

    def _space(self, space_id: int) -> SpaceIndex:
        if space_id not in self._spaces:
            self._ensure(space_id)
        return self._spaces[space_id]
