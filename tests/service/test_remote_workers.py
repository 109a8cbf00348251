"""Scale-out shape with real processes: model-free API processes, worker processes, real Redis and PostgreSQL.

* An API process that cannot load any model (its model is a path that does not exist) plus one worker
  give the same route answers as the embedded service over the same store.
* A worker SIGKILLed while requests wait: every caller gets an answer or a 503 within the documented
  bound, a restarted worker serves again, and a job interrupted by the kill still completes.
* Two models at once (two tiny architectures): each space's jobs and prompts reach the worker of its model;
  a space whose model no worker serves answers 503 at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from tests.service.conftest import free_port
from tests.service.test_prompt_service import _prompts, _wait_job

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
M = 256
TIMEOUT_S = 8.0  # prompt_timeout_s of the API processes: the documented bound of a waiting request


class Proc:
    """A subprocess with the test's ``FISHER_ATLAS_*`` environment and a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        full = dict(os.environ)
        full.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
                     "PYTHONPATH": os.pathsep.join(p for p in [str(REPO), full.get("PYTHONPATH", "")] if p)})
        full.update(env)
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(args, cwd=REPO, env=full, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture
def deployment(pg_database: Any, redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Shared settings of one deployment (a fresh database, its own queue names); kills its processes."""
    prefix = f"fa_test_{uuid.uuid4().hex[:8]}"
    db_url = pg_database()
    procs: list[Proc] = []
    env = {"FISHER_ATLAS_DATABASE_URL": db_url, "FISHER_ATLAS_REDIS_URL": redis_url, "FISHER_ATLAS_DEVICE": "cpu",
           "FISHER_ATLAS_SKETCH_DIM": str(M), "FISHER_ATLAS_CELERY_QUEUE": prefix,
           "FISHER_ATLAS_JOB_STALE_AFTER_S": "3", "FISHER_ATLAS_CHECKPOINT_EVERY": "20",
           "FISHER_ATLAS_MAX_TOKENS_PER_SAMPLE": "64"}

    def worker(model: Path, name: str) -> Proc:
        p = Proc([sys.executable, "-c", "from workers.celery_app import run_worker; run_worker()"],
                 {**env, "FISHER_ATLAS_MODEL": str(model), "FISHER_ATLAS_DATA_DIR": str(tmp_path / name)},
                 tmp_path / f"{name}.log")
        procs.append(p)
        return p

    def api(name: str) -> tuple[Proc, str]:
        port = free_port()
        p = Proc([sys.executable, "-m", "uvicorn", "--factory", "service.app:create_app", "--host", "127.0.0.1",
                  "--port", str(port), "--log-level", "warning"],
                 {**env, "FISHER_ATLAS_QUEUE": "celery", "FISHER_ATLAS_MODEL": str(tmp_path / "no-such-model"),
                  "FISHER_ATLAS_PROMPT_TIMEOUT_S": str(TIMEOUT_S), "FISHER_ATLAS_DATA_DIR": str(tmp_path / name)},
                 tmp_path / f"{name}.log")
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        _until(lambda: _ok(url + "/healthz"), 60, f"API {name} to start", p)
        return p, url

    yield {"env": env, "db_url": db_url, "worker": worker, "api": api, "prefix": prefix}
    for p in procs:
        p.kill(signal.SIGKILL)
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _until(predicate: Any, timeout: float, what: str, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"process exited while waiting for {what}:\n{proc.log()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{proc.log()}" if proc else ""))


def _served(url: str, space: str | None = None) -> bool:
    body: dict[str, Any] = {"prompt": "is anybody serving this model", "threshold": -1}
    if space is not None:
        body["space"] = space
    try:
        return httpx.post(url + "/v1/route", json=body, timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def _add_tasks(http: httpx.Client, n: int, space: str | None = None, seed: int = 0) -> list[int]:
    jobs = []
    for t in range(n):
        body: dict[str, Any] = {"name": f"task-{seed}-{t}", "samples": [{"text": p} for p in _prompts(30, seed + t)]}
        if space is not None:
            body["space"] = space
        r = http.post("/v1/tasks", json=body)
        assert r.status_code == 202, r.text
        jobs.append(r.json()["job"]["id"])
    return jobs


def test_remote_mode_equals_embedded(deployment: dict[str, Any], tiny_model_dir: Path, tiny_lm: Any,
                                     serve: Any, tmp_path: Path) -> None:
    _api, url = deployment["api"]("api")
    # no worker yet: not ready (it answered ready while every route and upload was a 503)
    ready = httpx.get(url + "/readyz", timeout=10)
    assert ready.status_code == 503 and ready.json()["checks"]["model"] is False, ready.text
    # the reason the routes give (it said "the default space cannot be read (see the database's check)" beside a
    # database check that passed)
    assert ready.json()["detail"]["model"].startswith("no space exists yet: start a worker"), ready.text
    w = deployment["worker"](tiny_model_dir, "worker")
    _until(lambda: _served(url), 90, "the worker to serve prompts", w)
    prompts = _prompts(20, seed=900)
    prompts.append(" ".join(prompts))  # over the workers' 64-token limit: the answer says it was cut
    with httpx.Client(base_url=url, timeout=60) as http:
        for job in _add_tasks(http, 3):
            _wait_job(http, job)
        remote = [http.post("/v1/route", json={"prompt": p, "k": 3, "threshold": -1}) for p in prompts]
        assert all(r.status_code == 200 for r in remote), remote[0].text
        assert http.get("/readyz").json()["checks"]["model"] is True
    # The embedded service over the same store and model.
    embedded = serve(lm=tiny_lm, database_url=deployment["db_url"], sketch_dim=M, max_tokens_per_sample=64,
                     overrides={"start_runner": False})
    with httpx.Client(base_url=embedded.url, timeout=60) as http:
        local = [http.post("/v1/route", json={"prompt": p, "k": 3, "threshold": -1}).json() for p in prompts]
    for r, e in zip(remote, local, strict=True):
        got = r.json()
        assert [m["task_id"] for m in got["matches"]] == [m["task_id"] for m in e["matches"]]
        np.testing.assert_allclose([m["score"] for m in got["matches"]], [m["score"] for m in e["matches"]],
                                   atol=1e-5)
        assert got["truncated"] == e["truncated"]
    cut = [r.json()["truncated"] for r in remote]
    assert cut[-1] and not all(cut), cut

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*[client.post("/v1/route", json={"prompt": p, "k": 3, "threshold": -1})
                                          for p in _prompts(64, seed=901)])

    answers = asyncio.run(burst())
    assert all(r.status_code == 200 and r.json()["matches"] for r in answers)
    _import_a_twin_space_keeps_the_served_default(url)


def _import_a_twin_space_keeps_the_served_default(url: str) -> None:
    """An export of another deployment whose model has the workers' model name but other weights (another
    fingerprint) makes a newer space of that name: the model-free API took it as its default space, and every
    prompt without a space answered 503 "no worker serves" (a review, 2026-12-07)."""
    with httpx.Client(base_url=url, timeout=60) as http:
        served = http.get("/v1/spaces/default").json()
        lines = http.get(f"/v1/spaces/{served['id']}/export").content.splitlines(keepends=True)
        header = json.loads(lines[0])
        header["space"]["model_fingerprint"] = "the-same-name-other-weights@1"
        body = [(json.dumps(header) + "\n").encode(), *lines[1:-1]]
        body.append((json.dumps({"trailer": True, "n_tasks": len(lines) - 2,
                                 "sha256": hashlib.sha256(b"".join(body)).hexdigest()}) + "\n").encode())
        r = http.post("/v1/spaces/import", files={"file": ("twin.jsonl", b"".join(body))})
        assert r.status_code == 200, r.text
        twin = r.json()
        assert twin["space_id"] != served["id"] and twin["served"] is False, twin
        time.sleep(5.1)  # the API's cache of the resolved default space
        spaces = {s["id"]: s for s in http.get("/v1/spaces").json()["items"]}
        assert spaces[twin["space_id"]]["model_name"] == served["model_name"]
        assert spaces[served["id"]]["default"] and not spaces[twin["space_id"]]["default"], spaces
        r = http.post("/v1/route", json={"prompt": "still routed to the served space", "threshold": -1})
        assert r.status_code == 200, r.text
        matched = [http.get(f"/v1/tasks/{m['task_id']}").json()["space_id"] for m in r.json()["matches"]]
        assert matched and set(matched) == {served["id"]}, matched


def test_worker_sigkill_bounded_and_recovered(deployment: dict[str, Any], tiny_model_dir: Path,
                                              tmp_path: Path) -> None:
    w1 = deployment["worker"](tiny_model_dir, "w1")
    _api, url = deployment["api"]("api")
    _until(lambda: _served(url), 90, "the worker to serve prompts", w1)
    with httpx.Client(base_url=url, timeout=60) as http:
        for job in _add_tasks(http, 2):
            _wait_job(http, job)
        # A long job that the kill interrupts.
        r = http.post("/v1/tasks", json={"name": "long", "samples": [{"text": p} for p in _prompts(2000, 77)]})
        long_job = r.json()["job"]["id"]
        _until(lambda: http.get(f"/v1/jobs/{long_job}").json()["status"] == "running", 60, "the long job", w1)

    async def callers() -> list[tuple[int, float]]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async def one(p: str) -> tuple[int, float]:
                t0 = time.monotonic()
                r = await client.post("/v1/route", json={"prompt": p, "threshold": -1})
                return r.status_code, time.monotonic() - t0

            tasks = [asyncio.create_task(one(p)) for p in _prompts(48, seed=5)]
            await asyncio.sleep(0.05)
            w1.kill(signal.SIGKILL)  # mid-batch: requests are queued and in flight
            return await asyncio.gather(*tasks)

    results = asyncio.run(callers())
    interrupted = httpx.get(f"{url}/v1/jobs/{long_job}", timeout=30).json()["status"] == "running"
    assert {s for s, _ in results} <= {200, 503}, results
    bound = TIMEOUT_S + 5.0  # documented bound plus HTTP and process slack on a loaded box
    assert max(t for _, t in results) < bound, results
    # No worker now: 503 at once.
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/route", json={"prompt": "anyone there at all"}, timeout=30)
    assert r.status_code == 503 and time.monotonic() - t0 < 5.0, r.text
    w2 = deployment["worker"](tiny_model_dir, "w2")
    _until(lambda: _served(url), 90, "the restarted worker to serve prompts", w2)
    with httpx.Client(base_url=url, timeout=60) as http:
        job = _wait_job(http, long_job, timeout=180)  # resumed from its checkpoint by the new worker
        if interrupted:  # killed mid-job (not already finished): taken over by the new worker
            assert job["attempts"] >= 2


def test_two_models_reach_their_workers(deployment: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    from tests.tiny_models import save_tiny_llama

    llama_dir = save_tiny_llama(tmp_path / "tiny-llama")
    wa = deployment["worker"](tiny_model_dir, "gpt2-worker")
    wb = deployment["worker"](llama_dir, "llama-worker")
    _api, url = deployment["api"]("api")
    with httpx.Client(base_url=url, timeout=60) as http:
        _until(lambda: len(http.get("/v1/spaces").json()["items"]) == 2, 90, "both workers to announce", wb)
        spaces = {s["model_name"]: s for s in http.get("/v1/spaces").json()["items"]}
        sa = next(str(s["id"]) for n, s in spaces.items() if "gpt2" in n)
        sb = next(str(s["id"]) for n, s in spaces.items() if "llama" in n)
        _until(lambda: _served(url, sa) and _served(url, sb), 60, "both models to serve prompts", wa)
        jobs_a, jobs_b = _add_tasks(http, 2, space=sa, seed=10), _add_tasks(http, 2, space=sb, seed=20)
        for job in jobs_a + jobs_b:  # a job sent to the wrong model's worker would fail (incompatible space)
            _wait_job(http, job)
        # Each job went to its model's queue: nothing waits in the base queue, which no worker consumes (the API
        # sent every job there; they ran only when a worker's sweep found them, after job_stale_after_s).
        assert redis.Redis.from_url(deployment["env"]["FISHER_ATLAS_REDIS_URL"]).llen(deployment["prefix"]) == 0
        tasks = http.get("/v1/tasks").json()["items"]
        assert {t["space_id"] for t in tasks if t["name"].startswith("task-10")} == {int(sa)}
        assert {t["space_id"] for t in tasks if t["name"].startswith("task-20")} == {int(sb)}
        for space, prefix in ((sa, "task-10"), (sb, "task-20")):
            r = http.post("/v1/route", json={"prompt": _prompts(1, 10)[0], "space": space, "k": 2, "threshold": -1})
            assert r.status_code == 200, r.text
            assert all(m["name"].startswith(prefix) for m in r.json()["matches"])
        wb.kill(signal.SIGKILL)
        _until(lambda: http.post("/v1/route", json={"prompt": "to the llama please", "space": sb}).status_code == 503,
               15, "the llama space to answer 503")
        r = http.post("/v1/route", json={"prompt": "to the llama please", "space": sb})
        assert "llama" in r.json()["message"]
        r = http.post("/v1/tasks", json={"name": "late", "space": sb, "samples": [{"text": "no model for me"}]})
        assert r.status_code == 503, r.text
        assert _served(url, sa)


def test_a_front_end_without_a_model_says_which_settings_it_does_not_apply() -> None:
    """``FISHER_ATLAS_QUEUE=inprocess`` beside ``FISHER_ATLAS_PROMPT_SERVICE=redis`` sent jobs to Celery, and an API's
    error projection chose nothing, both silently (a review): :func:`service.container.remote_mode_notes` says so;
    its sketch size is no such setting (it picks which announced space is the default)."""
    from atlas.settings import Settings
    from service.container import remote_mode_notes

    assert remote_mode_notes(Settings(queue="celery", sketch_dim=1024)) == []  # it picks the default space
    notes = remote_mode_notes(Settings(prompt_service="redis", error_projection="dense"))
    assert len(notes) == 2 and "FISHER_ATLAS_QUEUE=inprocess is not used" in notes[0]
    assert notes[1].startswith("FISHER_ATLAS_ERROR_PROJECTION has no effect")
