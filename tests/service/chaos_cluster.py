"""Scale-out chaos machinery shared by ``tests/service/test_chaos.py`` and ``bench/store/bench_chaos.py``.

The compose deployment as processes: PostgreSQL and Redis (already running), two API processes and two
worker processes, each started with the command and the environment ``docker-compose.yml`` gives its
service (only addresses, the model, the device and the data directory are replaced for this machine).

* :class:`ChaosCluster`: the migrated database, an admin key, and the processes (started, SIGKILLed and
  restarted by name: ``api-1``, ``api-2``, ``worker-1``, ``worker-2``).
* :func:`run_chaos`: clients add, append and route against both APIs while, in every round, one API
  process and one worker are SIGKILLed at a random point and restarted.
* :func:`check_store`: afterwards, what the store holds of the acknowledged writes.

Plain functions and classes, no pytest: the test asserts on what they return, the benchmark reports it.
"""

from __future__ import annotations

import random
import shutil
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import func, select

from tests.conftest import REDIS_URL
from tests.service.conftest import free_port
from tests.service.test_prompt_service import _prompts
from tests.service.test_remote_workers import Proc, _until

ROOT = Path(__file__).resolve().parents[2]
APIS = ("api-1", "api-2")
WORKERS = ("worker-1", "worker-2")
ALLOWED_STATUSES = frozenset({200, 202, 409, 429, 503, -1})
"""Every answer a client may see under chaos (-1: the connection was cut by a kill); never a 500."""


def compose_service(name: str) -> tuple[list[str], dict[str, str]]:
    """Command and environment of a compose service (YAML merge keys resolved by the loader)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    svc = compose["services"][name]
    return list(svc["command"]), {k: str(v) for k, v in svc["environment"].items()}


def console_script() -> str:
    """The ``fisher-atlas`` console script next to this interpreter (or on ``PATH``)."""
    script = Path(sys.executable).with_name("fisher-atlas")
    return str(script) if script.exists() else (shutil.which("fisher-atlas") or "fisher-atlas")


class ChaosCluster:
    """Two API and two worker processes on one PostgreSQL database and one Redis queue.

    Parameters
    ----------
    db_url
        An empty PostgreSQL database; migrated here, as compose's prestart does (``fisher-atlas migrate``).
    model_dir
        The model of the deployment (a directory, or ``bundled``): the workers sketch with it, the APIs
        load none.
    work_dir
        Data directories and one log file per process.
    redis_url
        The Redis of the job queue and the prompt channel; keys of this cluster's queue are removed by
        :meth:`close`.
    """

    def __init__(self, db_url: str, model_dir: Path | str, work_dir: Path, redis_url: str = REDIS_URL) -> None:
        from atlas import apikeys, db
        from migrations import upgrade

        self.work_dir = work_dir
        self.redis_url = redis_url
        self.queue = f"fa_chaos_{uuid.uuid4().hex[:8]}"
        self.local = {
            "FISHER_ATLAS_DATABASE_URL": db_url, "FISHER_ATLAS_REDIS_URL": redis_url, "FISHER_ATLAS_DEVICE": "cpu",
            "FISHER_ATLAS_MODEL": str(model_dir), "FISHER_ATLAS_SKETCH_DIM": "256",
            "FISHER_ATLAS_CELERY_QUEUE": self.queue, "FISHER_ATLAS_JOB_STALE_AFTER_S": "3",
            "FISHER_ATLAS_CHECKPOINT_EVERY": "10", "FISHER_ATLAS_MAX_TOKENS_PER_SAMPLE": "64",
            "FISHER_ATLAS_PROMPT_TIMEOUT_S": "8",
        }
        upgrade(db_url)
        self.engine = db.make_engine(db_url)
        with db.session_factory(self.engine).begin() as s:
            _, self.key = apikeys.create_api_key(s, "chaos", ["admin"])  # the api service requires keys
        self.procs: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}

    @property
    def headers(self) -> dict[str, str]:
        """The admin key's header."""
        return {"X-API-Key": self.key}

    def start(self, name: str) -> Proc:
        """Start (or restart, on the same port) process ``name`` with its compose command and environment."""
        service = "api" if name.startswith("api") else "worker"
        command, env = compose_service(service)
        env.update(self.local)
        env["FISHER_ATLAS_DATA_DIR"] = str(self.work_dir / name)
        args = [console_script(), *command[1:]]
        if service == "api":
            port = self.ports.setdefault(name, free_port())
            args[args.index("--host") + 1] = "127.0.0.1"
            args[args.index("--port") + 1] = str(port)
        p = Proc(args, env, self.work_dir / f"{name}.log")
        self.procs[name] = p
        return p

    def url(self, name: str) -> str:
        """Base URL of API process ``name``."""
        return f"http://127.0.0.1:{self.ports[name]}"

    def unfinished_jobs(self) -> int:
        """Jobs still queued or running."""
        from atlas.models import Job

        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(Job)
                                    .where(Job.status.in_(["queued", "running"]))).scalar_one())

    def close(self) -> None:
        """SIGKILL every process, release the database engine, remove this cluster's Redis keys."""
        import redis

        for p in self.procs.values():
            p.kill(signal.SIGKILL)
        self.engine.dispose()
        client = redis.Redis.from_url(self.redis_url)
        for k in client.scan_iter(match=f"{self.queue}*"):
            client.delete(k)


@dataclass
class ChaosRun:
    """What the clients saw during :func:`run_chaos`.

    ``statuses`` counts every HTTP attempt by status (-1: no answer), retries included; ``no_answer`` splits
    the -1s into ``refused`` (no process listening: the API was down) and ``cut`` (the connection broke);
    ``acked_adds`` maps each acknowledged (202) task name to its id; ``acked_appends`` lists the job ids of
    acknowledged appends; ``kills`` counts SIGKILLs per kind (``api``, ``worker``); ``restart_s`` holds, per
    round, the seconds from the kills until the restarted API answered again.
    """

    rounds: int
    statuses: Counter[int] = field(default_factory=Counter)
    acked_adds: dict[str, int] = field(default_factory=dict)
    acked_appends: list[int] = field(default_factory=list)
    kills: Counter[str] = field(default_factory=Counter)
    no_answer: Counter[str] = field(default_factory=Counter)
    restart_s: list[float] = field(default_factory=list)
    seconds: float = 0.0


def run_chaos(cluster: ChaosCluster, *, rounds: int, round_s: float, clients: int = 6, seed: int = 7,
              ready_timeout: float = 90.0) -> ChaosRun:
    """Start the four processes, load them with ``clients`` threads and SIGKILL one API and one worker per round.

    Clients pick an API at random and add (30 %), append to an acknowledged task (15 %) or route (the
    rest); adds and appends carry an Idempotency-Key and are retried with it on 503/429 and cut
    connections, as a client does. Each round sleeps up to ``round_s`` seconds, kills, restarts the
    worker and the API, and waits for the API to answer ``/healthz`` again.
    """
    for name in (*WORKERS, *APIS):
        cluster.start(name)
    for name in APIS:
        _until(lambda n=name: _ready(cluster.url(n), cluster.headers), ready_timeout, f"{name} to serve prompts",
               cluster.procs[name])

    run = ChaosRun(rounds=rounds)
    lock = threading.Lock()
    stop = threading.Event()

    def count(status: int | httpx.TransportError) -> None:
        with lock:
            if isinstance(status, httpx.TransportError):
                run.statuses[-1] += 1
                run.no_answer["refused" if isinstance(status, httpx.ConnectError) else "cut"] += 1
            else:
                run.statuses[status] += 1

    def client_loop(client_seed: int) -> None:
        rng = random.Random(client_seed)
        n = 0
        while not stop.is_set():
            api = rng.choice(APIS)
            op = rng.random()
            try:
                with httpx.Client(base_url=cluster.url(api), headers=cluster.headers, timeout=20) as http:
                    if op < 0.3:
                        name = f"t{client_seed}-{n}"
                        n += 1
                        body = {"name": name, "samples": [{"text": t} for t in _prompts(12, client_seed * 1000 + n)]}
                        r = _retry(http, "/v1/tasks", body, idem=f"add-{name}", count=count)
                        if r is not None and r.status_code == 202:
                            with lock:
                                run.acked_adds[name] = r.json()["task"]["id"]
                    elif op < 0.45 and run.acked_adds:
                        with lock:
                            tid = rng.choice(list(run.acked_adds.values()))
                        body = {"samples": [{"text": t} for t in _prompts(4, rng.randrange(10**6))]}
                        r = _retry(http, f"/v1/tasks/{tid}/samples", body, idem=f"app-{client_seed}-{n}-{tid}",
                                   count=count)
                        n += 1
                        if r is not None and r.status_code == 202:
                            with lock:
                                run.acked_appends.append(r.json()["job"]["id"])
                    else:
                        r = http.post("/v1/route", json={"prompt": _prompts(1, rng.randrange(10**6))[0]})
                        count(r.status_code)
            except httpx.TransportError as exc:
                count(exc)  # connection refused or cut by a kill
            time.sleep(0.02)

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    rng = random.Random(seed)
    try:
        for _ in range(rounds):
            time.sleep(rng.uniform(0.5, round_s))
            api, worker = rng.choice(APIS), rng.choice(WORKERS)
            killed = time.monotonic()
            cluster.procs[api].kill(signal.SIGKILL)
            cluster.procs[worker].kill(signal.SIGKILL)
            run.kills["api"] += 1
            run.kills["worker"] += 1
            time.sleep(rng.uniform(0.2, 1.5))
            cluster.start(worker)
            cluster.start(api)
            _until(lambda a=api: _ok(cluster.url(a)), ready_timeout, f"{api} to restart", cluster.procs[api])
            run.restart_s.append(time.monotonic() - killed)
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    run.seconds = time.monotonic() - t0
    return run


@dataclass
class StoreCheck:
    """The store after a chaos run: task names with their counts, job statuses, jobs left unfinished."""

    names: Counter[str]
    jobs: dict[int, str]
    unfinished: int
    waited_s: float

    def missing_adds(self, run: ChaosRun) -> list[str]:
        """Acknowledged adds with no task."""
        return [name for name in run.acked_adds if self.names[name] == 0]

    def duplicated_adds(self, run: ChaosRun) -> dict[str, int]:
        """Acknowledged adds stored more than once, with their counts."""
        return {name: self.names[name] for name in run.acked_adds if self.names[name] > 1}

    def failed_appends(self, run: ChaosRun) -> dict[int, str | None]:
        """Acknowledged appends whose job is absent or did not succeed, with its status."""
        return {j: self.jobs.get(j) for j in run.acked_appends if self.jobs.get(j) != "succeeded"}

    @property
    def succeeded(self) -> int:
        """Jobs that succeeded."""
        return sum(1 for s in self.jobs.values() if s == "succeeded")


def check_store(cluster: ChaosCluster, timeout: float = 180.0) -> StoreCheck:
    """Wait up to ``timeout`` s for every job to end (workers keep running), then read tasks and jobs."""
    from atlas.models import Job, Task

    t0 = time.monotonic()
    unfinished = cluster.unfinished_jobs()
    while unfinished and time.monotonic() - t0 < timeout:
        time.sleep(0.2)
        unfinished = cluster.unfinished_jobs()
    with cluster.engine.connect() as conn:
        names = Counter(conn.execute(select(Task.name)).scalars())
        jobs = {int(i): str(s) for i, s in conn.execute(select(Job.id, Job.status)).all()}
    return StoreCheck(names=names, jobs=jobs, unfinished=unfinished, waited_s=time.monotonic() - t0)


def _retry(http: httpx.Client, path: str, body: dict[str, Any], *, idem: str,
           count: Callable[[int | httpx.TransportError], None]) -> httpx.Response | None:
    """POST with an Idempotency-Key, retried (same key) on 503/429 and cut connections, as a client does.

    ``count(status or error)`` is called for every attempt.
    """
    for _ in range(5):
        try:
            r = http.post(path, json=body, headers={"Idempotency-Key": idem})
        except httpx.TransportError as exc:
            count(exc)
            time.sleep(0.3)
            continue
        count(r.status_code)
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
