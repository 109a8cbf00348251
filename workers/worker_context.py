"""What a worker holds to run jobs: :class:`WorkerContext` (settings, the store, the model and one extractor per
space) and :func:`ensure_space` (the space of a worker's model and sketch spec)."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from atlas import db, repository
from atlas.errors import IncompatibleSpace
from atlas.models import Space
from atlas.settings import Settings

if TYPE_CHECKING:
    from atlas.index import IndexManager
    from workers.extraction import Extractor
    from workers.model_loading import LoadedModel

@dataclass
class WorkerContext:
    """What a worker needs to run jobs: settings, the store, the model, optionally the index.

    Parameters
    ----------
    settings
        Runtime configuration (model, device, ``checkpoint_every``, ``job_stale_after_s``, ...).
    factory
        Read-write session factory of the store.
    index
        When given (embedded mode), the index is caught up right after a job stores a signature.
    lm
        A loaded model to use (e.g. the one the API already holds); else loaded on first use from
        ``settings.model``.
    max_attempts
        Attempts before a job fails for good (default ``settings.job_max_attempts``).
    """

    settings: Settings
    factory: sessionmaker[Session]
    index: IndexManager | None = None
    lm: LoadedModel | None = None
    max_attempts: int | None = None
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    shutdown: threading.Event = field(default_factory=threading.Event)
    _extractors: dict[int, Extractor] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts is None:
            self.max_attempts = self.settings.job_max_attempts
        self.ro_factory: sessionmaker[Session] = db.session_factory(self.factory.kw["bind"], readonly=True)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, lm: LoadedModel | None = None, index: IndexManager | None = None
    ) -> WorkerContext:
        """Context with its own engine for ``settings.resolved_database_url()`` (schema must exist)."""
        engine = db.make_engine(settings.resolved_database_url())
        return cls(settings=settings, factory=db.session_factory(engine), index=index, lm=lm)

    @property
    def heartbeat_every_s(self) -> float:
        """Heartbeat period: a quarter of the staleness threshold, at most 10 s."""
        return max(0.05, min(self.settings.job_stale_after_s / 4.0, 10.0))

    def model(self) -> LoadedModel:
        """The worker's model, loaded on first use."""
        with self._lock:
            if self.lm is None:
                from workers.model_loading import load_configured_model

                self.lm = load_configured_model(self.settings)
            return self.lm

    def extractor_for(self, space: Space) -> Extractor:
        """The extractor of a space (its model fingerprint and sketch spec), built once.

        Raises
        ------
        IncompatibleSpace
            This worker's model is not the space's model, or the stored spec is not reproducible.
        """
        with self._lock:
            cached = self._extractors.get(space.id)
        if cached is not None:
            return cached
        from fishersketch import SketchSpec
        from workers.extraction import Extractor

        lm = self.model()
        if lm.fingerprint.key() != space.model_fingerprint:
            raise IncompatibleSpace(
                f"this worker serves model {lm.name!r} (fingerprint {lm.fingerprint.key()}), but the job's "
                f"space {space.id} needs model {space.model_name!r} (fingerprint {space.model_fingerprint}); "
                "run a worker with that model",
                {"space_id": space.id, "worker_model": lm.fingerprint.key(), "space_model": space.model_fingerprint},
            )
        spec = SketchSpec.from_dict(space.spec)
        if spec.fingerprint() != space.spec_fingerprint:
            raise IncompatibleSpace(
                f"space {space.id} was created with sketch spec {space.spec_fingerprint}, which this version "
                f"of fishersketch reproduces as {spec.fingerprint()}",
                {"space_id": space.id},
            )
        extractor = Extractor(lm, lm.make_sketcher(spec),
                              max_tokens_per_sample=self.settings.max_tokens_per_sample)
        with self._lock:
            return self._extractors.setdefault(space.id, extractor)


def ensure_space(session: Session, lm: LoadedModel, settings: Settings) -> Space:
    """The space of ``lm`` with the sketch spec of ``settings`` (created on first use; one stored under the model's
    previous fingerprint is re-keyed, see :func:`atlas.space_repository.get_or_create_space`)."""
    spec = lm.make_spec(m=settings.sketch_dim, seed=settings.sketch_seed, error_projection=settings.error_projection)
    return repository.get_or_create_space(
        session, model_fingerprint=lm.fingerprint.key(), spec_fingerprint=spec.fingerprint(), model_name=lm.name,
        d=spec.d, K=spec.K, m=spec.m, seed=spec.seed, spec=spec.to_dict(),
        previous_fingerprints=lm.fingerprint.previous_keys,
    )
