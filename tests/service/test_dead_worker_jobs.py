"""Jobs run on workers elsewhere: the API puts a dead worker's job back to ``queued`` (it stayed ``running`` until
a worker of its model came back, and a cancel waited for that worker)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import update

from atlas import job_store
from atlas.models import Job, utcnow


def _running_job_of_a_dead_worker(serve: Any, tiny_lm: Any, data: Path, stale_s: float) -> int:
    """A job claimed by a worker that then died: heartbeat older than the staleness window."""
    embedded = serve(lm=tiny_lm, data_dir=data, overrides={"start_runner": False})
    r = httpx.post(f"{embedded.url}/v1/tasks", json={"name": "t", "samples": [{"text": "alpha beta gamma delta"}]})
    assert r.status_code == 202, r.text
    job_id = int(r.json()["job"]["id"])
    store = embedded.app.state.container.store
    with store.write.begin() as s:
        assert job_store.claim_job(s, job_id, worker="dead-worker", stale_after_s=stale_s) is not None
        s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow() - dt.timedelta(seconds=60)))
    return job_id


def test_an_api_without_a_model_requeues_a_dead_workers_job(serve: Any, tiny_lm: Any, redis_url: str,
                                                              tmp_path: Path) -> None:
    data = tmp_path / "store"
    job_id = _running_job_of_a_dead_worker(serve, tiny_lm, data, stale_s=1.0)
    api = serve(lm=None, data_dir=data, queue="celery", prompt_service="redis", redis_url=redis_url,
                job_stale_after_s=1.0, overrides={"start_runner": False})
    with httpx.Client(base_url=api.url, timeout=30) as http:
        deadline = time.monotonic() + 15
        while (job := http.get(f"/v1/jobs/{job_id}").json())["status"] == "running":
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["status"] == "queued" and job["error"] == job_store.DEAD_WORKER_NOTE, job
        cancelled = http.post(f"/v1/jobs/{job_id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text


def test_a_live_workers_job_is_left_running(serve: Any, tiny_lm: Any, redis_url: str, tmp_path: Path) -> None:
    """The same API leaves a job alone while its worker heartbeats."""
    data = tmp_path / "store"
    job_id = _running_job_of_a_dead_worker(serve, tiny_lm, data, stale_s=1.0)
    store = None
    api = serve(lm=None, data_dir=data, queue="celery", prompt_service="redis", redis_url=redis_url,
                job_stale_after_s=1.0, overrides={"start_runner": False})
    store = api.app.state.container.store
    deadline = time.monotonic() + 4  # eight sweep periods
    while time.monotonic() < deadline:
        with store.write.begin() as s:
            s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow()))
        time.sleep(0.1)
    job = httpx.get(f"{api.url}/v1/jobs/{job_id}").json()
    assert job["status"] == "running" and job["error"] is None, job
