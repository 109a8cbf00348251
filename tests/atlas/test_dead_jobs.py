"""A job whose worker died is detected by its heartbeat within seconds (defaults), not minutes."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from atlas import job_store, repository
from atlas.models import Job, utcnow
from atlas.samples import Sample
from atlas.settings import Settings
from tests.atlas.fixtures import make_space


def test_default_staleness_is_seconds_and_heartbeats_are_well_inside_it(
    tmp_path, factory: sessionmaker[Session]
) -> None:
    s = Settings(data_dir=tmp_path)
    assert s.job_stale_after_s <= 15.0
    from workers.worker_context import WorkerContext

    ctx = WorkerContext(settings=s, factory=factory)
    assert ctx.heartbeat_every_s <= s.job_stale_after_s / 4


def test_dead_worker_is_recoverable_after_the_default_staleness(factory: sessionmaker[Session]) -> None:
    stale = Settings().job_stale_after_s
    space = make_space(factory)
    with factory.begin() as s:
        _, job = repository.create_task_with_job(s, space.id, "t", "text", {}, [Sample(text="a"), Sample(text="b")])
        job_id = int(job.id)
    with factory.begin() as s:
        assert job_store.claim_job(s, job_id, worker="dead", stale_after_s=stale) is not None
    with factory.begin() as s:  # alive a moment ago: not recoverable
        assert job_store.recoverable_jobs(s, stale_after_s=stale) == []
        s.execute(update(Job).where(Job.id == job_id)
                  .values(heartbeat_at=utcnow() - dt.timedelta(seconds=stale + 0.5)))
    with factory.begin() as s:  # silent for the staleness window: dead, recoverable, re-claimable
        assert job_store.recoverable_jobs(s, stale_after_s=stale) == [job_id]
        assert job_store.claim_job(s, job_id, worker="alive", stale_after_s=stale) is not None
