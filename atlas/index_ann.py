"""Two-stage candidate search for large spaces: a compact coarse stage, then an exact re-rank.

A signature is a unit float32 vector of length ``m`` (4096 for the bundled model); exact search
reads all ``16 KiB x N`` of them per query (about 140 ms at N = 100k on one core). Signatures of
real tasks are structured — tasks come in families, and most of their variance lives in a few
hundred directions — so :class:`TwoStageIndex` searches a compact copy first:

1. **Coarse stage** — ``IndexPreTransform(LinearTransform(m -> dim), IndexIVFFlat(dim, nlist))``:
   every signature is projected on the ``dim`` (default 256) leading right-singular vectors of a
   training sample (an *uncentred* projection, so inner products are preserved in that subspace),
   and stored in an inverted file of ``nlist ~ sqrt(N)`` lists; a query scans ``nprobe`` lists of
   1 KiB codes and keeps ``R = max(rerank_min, rerank_factor * k)`` candidates.
2. **Exact re-rank** — the ``R`` candidates' full float32 vectors are read from an
   ``IndexIDMap2(IndexFlatIP(m))`` (by id, no scan) and scored exactly; the top ``k`` are returned
   with their exact inner products.

The projection is learnt by a randomised SVD (two power iterations) of at most 8,192 sampled
signatures — seconds at m = 4096, where a full PCA eigendecomposition takes minutes on two cores —
and the lists by k-means in the projected space. Memory per task: ``4 m`` bytes (full vectors) +
``4 dim`` (codes) + ids, about 17.4 KiB at m = 4096 (flat: 16.4 KiB). Both stages support
``add_with_ids`` / ``remove_ids``, so the index follows the change log like a flat one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faiss
import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session
from threadpoolctl import threadpool_limits

from atlas.models import Signature
from atlas.repository import bytes_to_vectors

PROJECTION_SAMPLE = 8192
"""At most this many signatures train the projection."""


def learn_projection(sample: np.ndarray, dim: int, *, seed: int = 0, power_iters: int = 2) -> np.ndarray:
    """Leading right-singular vectors of ``sample`` (uncentred), shape ``(dim, m)``, orthonormal rows.

    Parameters
    ----------
    sample : ndarray, shape (n, m), float32
        Training signatures.
    dim
        Number of directions (clipped to ``min(n, m)``).
    seed
        Seed of the random test matrix.
    power_iters
        Subspace iterations (2 is plenty for a decaying spectrum).
    """
    x = np.ascontiguousarray(sample, dtype=np.float32)
    n, m = x.shape
    dim = max(1, min(dim, n, m))
    width = min(m, n, dim + 16)
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(x @ rng.standard_normal((m, width)).astype(np.float32))
    for _ in range(power_iters):
        q, _ = np.linalg.qr(x.T @ q)
        q, _ = np.linalg.qr(x @ q)
    _, _, vt = np.linalg.svd(q.T @ x, full_matrices=False)
    return np.ascontiguousarray(vt[:dim], dtype=np.float32)


class TwoStageIndex:
    """Coarse IVF over projected codes + exact re-rank on full vectors (see the module docstring).

    Parameters
    ----------
    full
        ``IndexIDMap2(IndexFlatIP(m))`` holding the full vectors.
    coarse
        ``IndexPreTransform(LinearTransform, IndexIVFFlat)`` holding the codes, same ids.
    rerank_min, rerank_factor
        Candidates re-ranked per query: ``max(rerank_min, rerank_factor * k)``.
    """

    def __init__(self, full: Any, coarse: Any, *, rerank_min: int = 128, rerank_factor: int = 4) -> None:
        self.full = full
        self.coarse = coarse
        transform = faiss.downcast_VectorTransform(coarse.chain.at(0))
        self._proj = faiss.vector_to_array(transform.A).reshape(transform.d_out, transform.d_in)  # type: ignore[attr-defined]
        self.rerank_min = rerank_min
        self.rerank_factor = rerank_factor

    @classmethod
    def train(cls, sample: np.ndarray, *, nlist: int, dim: int = 256, seed: int = 0, **kwargs: Any) -> TwoStageIndex:
        """An empty index whose projection and lists are trained on ``sample`` (shape ``(n, m)``)."""
        x = np.ascontiguousarray(sample, dtype=np.float32)
        m = x.shape[1]
        with threadpool_limits(limits=1):  # BLAS / OpenMP threads only contend on these small products
            proj = learn_projection(x[:PROJECTION_SAMPLE], dim, seed=seed)
        dim = proj.shape[0]
        transform = faiss.LinearTransform(m, dim, False)
        faiss.copy_array_to_vector(proj.ravel(), transform.A)
        transform.is_trained = True
        nlist = max(1, min(nlist, len(x)))
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.min_points_per_centroid = 1  # small samples are fine: the lists only route the scan
        ivf.cp.seed = seed
        coarse = faiss.IndexPreTransform(transform, ivf)
        with threadpool_limits(limits=1):
            coarse.train(x)
        return cls(faiss.IndexIDMap2(faiss.IndexFlatIP(m)), coarse, **kwargs)

    # -- the faiss-like surface the index manager uses -------------------------------------------

    @property
    def ntotal(self) -> int:
        """Number of vectors."""
        return int(self.full.ntotal)

    @property
    def d(self) -> int:
        """Vector length ``m``."""
        return int(self.full.d)

    @property
    def dim(self) -> int:
        """Length of the coarse codes."""
        return int(self.ivf.d)

    @property
    def ivf(self) -> Any:
        """The coarse inverted file."""
        return faiss.extract_index_ivf(self.coarse)

    @property
    def nlist(self) -> int:
        """Number of coarse lists."""
        return int(self.ivf.nlist)

    @property
    def nprobe(self) -> int:
        """Coarse lists scanned per query."""
        return int(self.ivf.nprobe)

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self.ivf.nprobe = max(1, min(int(value), self.nlist))

    def add_with_ids(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        """Add vectors with their task ids to both stages."""
        self.full.add_with_ids(vectors, ids)
        self.coarse.add_with_ids(vectors, ids)

    def remove_ids(self, ids: np.ndarray) -> int:
        """Remove ids from both stages; return how many were removed from the full store."""
        self.coarse.remove_ids(ids)
        return int(self.full.remove_ids(ids))

    def ids(self) -> np.ndarray:
        """Every stored id."""
        return faiss.vector_to_array(self.full.id_map).astype(np.int64)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by exact inner product among the coarse candidates; ``-1`` ids pad short rows."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        n = self.ntotal
        r = min(n, max(self.rerank_min, self.rerank_factor * k))
        scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        out = np.full((len(q), k), -1, dtype=np.int64)
        if n == 0:
            return scores, out
        # Project with einsum rather than the pre-transform's sgemm: one query is too small for
        # BLAS threads, which only contend (20 ms instead of 0.2 ms on a loaded 2-core box).
        _, cand = self.ivf.search(np.ascontiguousarray(np.einsum("dm,qm->qd", self._proj, q)), r)
        for i in range(len(q)):
            c = cand[i][cand[i] >= 0]
            if not len(c):
                continue
            # einsum, not BLAS: a (R, m) x (m,) product is too small for threads, which only contend
            exact = np.einsum("rm,m->r", self.full.reconstruct_batch(c), q[i])
            order = np.argsort(-exact, kind="stable")[:k]
            scores[i, : len(order)] = exact[order]
            out[i, : len(order)] = c[order]
        return scores, out

    # -- files -----------------------------------------------------------------------------------

    def write(self, full_path: Path, coarse_path: Path) -> None:
        """Write the two stages to two files (callers make the writes atomic)."""
        faiss.write_index(self.full, str(full_path))
        faiss.write_index(self.coarse, str(coarse_path))

    @classmethod
    def read(cls, full_path: Path, coarse_path: Path, **kwargs: Any) -> TwoStageIndex:
        """Read an index written by :meth:`write`; raises ``ValueError`` when the stages disagree."""
        full = faiss.read_index(str(full_path))
        coarse = faiss.read_index(str(coarse_path))
        if not isinstance(full, faiss.IndexIDMap2) or not isinstance(coarse, faiss.IndexPreTransform):
            raise ValueError("not a two-stage index")
        if full.ntotal != coarse.ntotal or full.d != coarse.d:
            raise ValueError("the two stages hold different vectors")
        return cls(full, coarse, **kwargs)


def training_sample(session: Session, space_id: int, m: int, take: int, *, chunk: int = 2048) -> np.ndarray:
    """At most ``take`` signatures of a space drawn at random (seeded by the space), shape ``(n, m)``."""
    all_ids = np.array(
        session.execute(select(Signature.task_id).where(Signature.space_id == space_id)).scalars().all(),
        dtype=np.int64,
    )
    rng = np.random.default_rng(space_id)
    chosen = rng.choice(all_ids, size=min(len(all_ids), take), replace=False)
    parts = [np.empty((0, m), np.float32)]
    for start in range(0, len(chosen), chunk):
        part = chosen[start : start + chunk].tolist()
        rows = session.execute(select(Signature.vector).where(Signature.task_id.in_(part))).scalars().all()
        parts.append(bytes_to_vectors(rows, m))
    return np.ascontiguousarray(np.concatenate(parts))


def read_signatures(session: Session, task_ids: list[int], m: int, *, chunk: int = 500) -> tuple[list[int], np.ndarray]:
    """The stored signatures of ``task_ids`` (those that have one): ``(ids, vectors)``."""
    found: list[int] = []
    blobs: list[bytes] = []
    for start in range(0, len(task_ids), chunk):
        part = task_ids[start : start + chunk]
        for task_id, vector in session.execute(
            select(Signature.task_id, Signature.vector).where(Signature.task_id.in_(part))
        ):
            found.append(int(task_id))
            blobs.append(vector)
    return found, bytes_to_vectors(blobs, m)
