"""Scale-out chaos: the compose deployment as processes, with SIGKILLs under load.

PostgreSQL, Redis, two API processes and two worker processes, each started with the command and the
environment ``docker-compose.yml`` gives its service (only addresses, the model, the device and the data
directory are replaced for this machine). Clients add, append and route against both APIs while, in every
round, one API process and one worker are SIGKILLed at a random point and restarted. Afterwards:

* every acknowledged add (202) is a task present exactly once, every acknowledged append a job;
* every job ends (none stays queued or running);
* every request was answered or refused with 503/429 (or its connection was cut by the kill) — never 500.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import func, select

from tests.service.conftest import free_port
from tests.service.test_prompt_service import _prompts
from tests.service.test_remote_workers import REDIS_URL, Proc, _until

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 3
ROUND_S = 6.0


def _compose_service(name: str) -> tuple[list[str], dict[str, str]]:
    """Command and environment of a compose service (YAML merge keys resolved by the loader)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    svc = compose["services"][name]
    return list(svc["command"]), {k: str(v) for k, v in svc["environment"].items()}


def _console_script() -> str:
    script = Path(sys.executable).with_name("fisher-atlas")
    return str(script) if script.exists() else (shutil.which("fisher-atlas") or "fisher-atlas")


@pytest.fixture
def cluster(pg_database: Any, tiny_model_dir: Path, tmp_path: Path) -> Any:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        pytest.skip(f"Redis at {REDIS_URL} is unreachable: {exc}")
    db_url = pg_database()
    queue = f"fa_chaos_{uuid.uuid4().hex[:8]}"
    local = {"FISHER_ATLAS_DATABASE_URL": db_url, "FISHER_ATLAS_REDIS_URL": REDIS_URL, "FISHER_ATLAS_DEVICE": "cpu",
             "FISHER_ATLAS_MODEL": str(tiny_model_dir), "FISHER_ATLAS_SKETCH_DIM": "256",
             "FISHER_ATLAS_CELERY_QUEUE": queue, "FISHER_ATLAS_JOB_STALE_AFTER_S": "3",
             "FISHER_ATLAS_CHECKPOINT_EVERY": "10", "FISHER_ATLAS_MAX_TOKENS_PER_SAMPLE": "64",
             "FISHER_ATLAS_PROMPT_TIMEOUT_S": "8"}
    # The schema, as compose's prestart does (fisher-atlas migrate), and an admin key (api requires keys).
    from atlas import apikeys, db
    from migrations import upgrade

    upgrade(db_url)
    engine = db.make_engine(db_url)
    with db.session_factory(engine).begin() as s:
        _, key = apikeys.create_api_key(s, "chaos", ["admin"])
    procs: dict[str, Proc] = {}

    def start(name: str) -> Proc:
        service = "api" if name.startswith("api") else "worker"
        command, env = _compose_service(service)
        env.update(local)
        env["FISHER_ATLAS_DATA_DIR"] = str(tmp_path / name)
        args = [_console_script(), *command[1:]]
        if service == "api":
            port = procs[name].port if name in procs else free_port()  # type: ignore[attr-defined]
            args[args.index("--host") + 1] = "127.0.0.1"
            args[args.index("--port") + 1] = str(port)
        p = Proc(args, env, tmp_path / f"{name}.log")
        if service == "api":
            p.port = port  # type: ignore[attr-defined]
        procs[name] = p
        return p

    yield {"start": start, "procs": procs, "key": key, "engine": engine}
    for p in procs.values():
        p.kill(signal.SIGKILL)
    engine.dispose()
    client = redis.Redis.from_url(REDIS_URL)
    for k in client.scan_iter(match=f"{queue}*"):
        client.delete(k)


def test_kill_api_and_worker_under_load(cluster: Any) -> None:
    start, procs, key = cluster["start"], cluster["procs"], cluster["key"]
    for name in ("worker-1", "worker-2", "api-1", "api-2"):
        start(name)
    headers = {"X-API-Key": key}

    def url(name: str) -> str:
        return f"http://127.0.0.1:{procs[name].port}"

    for name in ("api-1", "api-2"):
        _until(lambda n=name: _ready(url(n), headers), 90, f"{name} to serve prompts", procs[name])

    statuses: Counter[int] = Counter()
    acked_adds: dict[str, int] = {}
    acked_appends: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client_loop(seed: int) -> None:
        rng = random.Random(seed)
        n = 0
        while not stop.is_set():
            api = rng.choice(["api-1", "api-2"])
            op = rng.random()
            try:
                with httpx.Client(base_url=url(api), headers=headers, timeout=20) as http:
                    if op < 0.3:
                        name = f"t{seed}-{n}"
                        n += 1
                        body = {"name": name, "samples": [{"text": t} for t in _prompts(12, seed * 1000 + n)]}
                        r = _retry(http, "/v1/tasks", body, idem=f"add-{name}")
                        if r is not None and r.status_code == 202:
                            with lock:
                                acked_adds[name] = r.json()["task"]["id"]
                    elif op < 0.45 and acked_adds:
                        with lock:
                            tid = rng.choice(list(acked_adds.values()))
                        body = {"samples": [{"text": t} for t in _prompts(4, rng.randrange(10**6))]}
                        r = _retry(http, f"/v1/tasks/{tid}/samples", body, idem=f"app-{seed}-{n}-{tid}")
                        n += 1
                        if r is not None and r.status_code == 202:
                            with lock:
                                acked_appends.append(r.json()["job"]["id"])
                    else:
                        r = http.post("/v1/route", json={"prompt": _prompts(1, rng.randrange(10**6))[0]})
                    if r is not None:
                        with lock:
                            statuses[r.status_code] += 1
            except httpx.TransportError:
                with lock:
                    statuses[-1] += 1  # connection cut by a kill
            time.sleep(0.02)

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    rng = random.Random(7)
    try:
        for _ in range(ROUNDS):
            time.sleep(rng.uniform(0.5, ROUND_S))
            api, worker = rng.choice(["api-1", "api-2"]), rng.choice(["worker-1", "worker-2"])
            procs[api].kill(signal.SIGKILL)
            procs[worker].kill(signal.SIGKILL)
            time.sleep(rng.uniform(0.2, 1.5))
            start(worker)
            start(api)
            _until(lambda a=api: _ok(url(a)), 90, f"{api} to restart", procs[api])
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)

    assert statuses[500] == 0, statuses
    assert set(statuses) <= {200, 202, 409, 429, 503, -1}, statuses
    assert statuses[200] > 0 and statuses[202] > 0, statuses
    # Every acknowledged job ends; every acknowledged add is there exactly once.
    from atlas.models import Job, Task

    engine = cluster["engine"]

    def unfinished() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(Job)
                                    .where(Job.status.in_(["queued", "running"]))).scalar_one())

    _until(lambda: unfinished() == 0, 180, "every job to end")
    with engine.connect() as conn:
        names = Counter(conn.execute(select(Task.name)).scalars())
        jobs = dict(conn.execute(select(Job.id, Job.status)).all())
    for name in acked_adds:
        assert names[name] == 1, (name, names[name])
    assert all(jobs.get(j) == "succeeded" for j in acked_appends), {j: jobs.get(j) for j in acked_appends}
    assert sum(1 for j in jobs.values() if j == "succeeded") >= len(acked_adds)


def _retry(http: httpx.Client, path: str, body: dict[str, Any], *, idem: str) -> httpx.Response | None:
    """POST with an Idempotency-Key, retried (same key) on 503/429 and cut connections, as a client does."""
    for _ in range(5):
        try:
            r = http.post(path, json=body, headers={"Idempotency-Key": idem})
        except httpx.TransportError:
            time.sleep(0.3)
            continue
        if r.status_code not in (429, 503):
            return r
        time.sleep(0.3)
    return None


def _ok(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _ready(url: str, headers: dict[str, str]) -> bool:
    try:
        r = httpx.post(url + "/v1/route", json={"prompt": "are the workers up yet"}, headers=headers, timeout=20)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 or (r.status_code == 409 and "no task" in r.text)


if os.environ.get("FISHER_ATLAS_CHAOS_ROUNDS"):
    ROUNDS = int(os.environ["FISHER_ATLAS_CHAOS_ROUNDS"])
