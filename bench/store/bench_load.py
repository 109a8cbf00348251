"""Load held: a mixed read/write workload over real HTTP against a running service (issue 14).

Usage::

    python -m bench.store.bench_load --concurrency 16 --duration 60 --out bench/results/load.md

Setup: ``--tasks`` tasks (one per text group of ``shared/data``, 24 texts each, as in
:mod:`bench.api.bench_route`) are added through library mode (``fisher_atlas.Atlas``, the bundled model,
m = 4096) into a temporary data directory; then ``fisher-atlas serve`` runs on its embedded defaults there
(SQLite, FAISS, in-process job worker and prompt service) with the per-client rate limit off (one load
generator is one client address).

Load: ``--concurrency`` httpx async clients, each sending its next request when the last is answered, for
``--duration`` seconds. Each request is drawn from a fixed mix (:data:`MIX`): 70 % reads (list, get, align,
sources), 20 % routes, 10 % writes (adds of 8 samples, appends of 4 samples, metadata patches).

Checks (the script exits non-zero when one fails, after writing its outputs):

* no 5xx and no cut connection (429/503 refusals are counted separately);
* after the queue drains and the service stops, the SQLite store holds every acknowledged add (202) exactly
  once as a ready task, every acknowledged append (202) as a succeeded job, every acknowledged patch (200)
  (each client writes its own metadata key; the stored value is that client's last acknowledged one), no
  task that was not acknowledged, and no queued or running job.

Raw JSON: ``bench/out/store/load.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.api.bench_route import _serve_cmd, _wait_ready, free_port, load_texts
from bench.store.common import add_run_options, finish_run, nonzero_counts

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "2-core CPU (python-svc dev box)"
MIX: dict[str, float] = {
    "list": 0.175, "get": 0.175, "align": 0.175, "sources": 0.175,  # reads: 70 %
    "route": 0.20,  # routes: 20 %
    "add": 0.04, "append": 0.03, "patch": 0.03,  # writes: 10 %
}
"""Share of each request kind."""
READS = ("list", "get", "align", "sources")
WRITES = ("add", "append", "patch")


@dataclass
class Workload:
    """Inputs of the clients and what they were acknowledged."""

    ready_ids: list[int]
    texts: list[str]
    prompts: list[str]
    task_ids: list[int] = field(default_factory=list)
    acked_adds: dict[str, int] = field(default_factory=dict)
    acked_appends: list[int] = field(default_factory=list)
    acked_patches: dict[tuple[int, str], int] = field(default_factory=dict)
    samples: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    route_stages: dict[str, list[float]] = field(default_factory=lambda: {"forward": [], "search": []})


async def _one(client: httpx.AsyncClient, kind: str, w: Workload, rng: random.Random, me: str,
               n: int) -> httpx.Response:
    """Send one request of ``kind``; record an acknowledged write in ``w``."""
    if kind == "list":
        return await client.get("/v1/tasks", params={"limit": 20, "offset": rng.randrange(max(len(w.task_ids), 1))})
    if kind == "get":
        return await client.get(f"/v1/tasks/{rng.choice(w.task_ids)}")
    if kind == "align":
        a, b = rng.sample(w.ready_ids, 2)
        return await client.get("/v1/align", params={"a": a, "b": b})
    if kind == "sources":
        return await client.get(f"/v1/tasks/{rng.choice(w.ready_ids)}/sources", params={"k": 5})
    if kind == "route":
        r = await client.post("/v1/route", json={"prompt": rng.choice(w.prompts), "k": 5})
        for part in r.headers.get("server-timing", "").split(","):  # the server's split: forward, search
            stage, _, dur = part.strip().partition(";dur=")
            if stage in w.route_stages and dur:
                w.route_stages[stage].append(float(dur.split(";")[0]))
        return r
    if kind == "add":
        name = f"load-{me}-{n}"
        body = {"name": name, "samples": [{"text": t} for t in rng.sample(w.texts, 8)]}
        r = await client.post("/v1/tasks", json=body)
        if r.status_code == 202:
            w.acked_adds[name] = int(r.json()["task"]["id"])
            w.task_ids.append(w.acked_adds[name])
        return r
    if kind == "append":
        tid = rng.choice(w.ready_ids)
        body = {"samples": [{"text": t} for t in rng.sample(w.texts, 4)]}
        r = await client.post(f"/v1/tasks/{tid}/samples", json=body)
        if r.status_code == 202:
            w.acked_appends.append(int(r.json()["job"]["id"]))
        return r
    assert kind == "patch"
    tid = rng.choice(w.ready_ids)
    r = await client.patch(f"/v1/tasks/{tid}", json={"metadata": {f"load_{me}": n}})
    if r.status_code == 200:
        w.acked_patches[(tid, me)] = n  # this client's requests are sequential: the last acknowledged wins
    return r


async def drive(url: str, w: Workload, concurrency: int, duration: float, seed: int,
                mix: dict[str, float] = MIX) -> float:
    """Run ``concurrency`` clients for ``duration`` s drawing request kinds from ``mix``; the wall seconds.

    Latencies go to ``w.samples[kind]`` as ``(status, seconds)``; a cut connection is status -1.
    """
    kinds, weights = list(mix), list(mix.values())
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        t0 = time.perf_counter()
        deadline = t0 + duration

        async def worker(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            n = 0
            while time.perf_counter() < deadline:
                kind = rng.choices(kinds, weights)[0]
                n += 1
                start = time.perf_counter()
                try:
                    status = (await _one(client, kind, w, rng, f"c{i}", n)).status_code
                except httpx.TransportError:
                    status = -1
                w.samples.setdefault(kind, []).append((status, time.perf_counter() - start))

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return time.perf_counter() - t0


def summarize(samples: dict[str, list[tuple[int, float]]], wall: float) -> dict[str, dict[str, Any]]:
    """Per kind and in total: requests, answered 2xx, their rate and p50/p99 latency, status histogram."""
    groups = {**{k: samples.get(k, []) for k in MIX}, "reads": [s for k in READS for s in samples.get(k, [])],
              "writes": [s for k in WRITES for s in samples.get(k, [])],
              "total": [s for v in samples.values() for s in v]}
    out: dict[str, dict[str, Any]] = {}
    for kind, rows in groups.items():
        ok = np.array([t for st, t in rows if 200 <= st < 300]) * 1e3
        everything = np.array([t for _, t in rows]) * 1e3
        out[kind] = {
            "requests": len(rows), "ok": int(ok.size), "req_per_s": len(rows) / wall, "ok_per_s": ok.size / wall,
            "p50_ms": float(np.percentile(ok, 50)) if ok.size else float("nan"),
            "p99_ms": float(np.percentile(ok, 99)) if ok.size else float("nan"),
            "p99_all_ms": float(np.percentile(everything, 99)) if everything.size else float("nan"),
            "statuses": dict(sorted(Counter(str(st) for st, _ in rows).items())),
        }
    return out


def drain(url: str, timeout: float) -> tuple[int, float]:
    """Wait until no job is queued or running; ``(jobs left unfinished, seconds waited)``."""
    t0 = time.perf_counter()
    left = -1
    while time.perf_counter() - t0 < timeout:
        left = sum(httpx.get(f"{url}/v1/jobs", params={"status": s, "limit": 1}, timeout=30).json()["total"]
                   for s in ("queued", "running"))
        if left == 0:
            break
        time.sleep(0.5)
    return left, time.perf_counter() - t0


def verify(db_file: Path, w: Workload, preloaded: int) -> dict[str, Any]:
    """What the SQLite store holds of the acknowledged writes (read after the service stopped)."""
    from sqlalchemy import create_engine, select

    from atlas.models import Job, Task

    engine = create_engine(f"sqlite:///{db_file}")
    with engine.connect() as conn:
        tasks = conn.execute(select(Task.id, Task.name, Task.status, Task.meta.label("meta"))).all()
        jobs = {int(i): str(s) for i, s in conn.execute(select(Job.id, Job.status)).all()}
    engine.dispose()
    names = Counter(t.name for t in tasks)
    by_id = {int(t.id): t for t in tasks}
    lost_adds = [n for n, tid in w.acked_adds.items() if names[n] == 0 or by_id.get(tid) is None]
    duplicated = {n: names[n] for n in w.acked_adds if names[n] > 1}
    not_ready = [n for n, tid in w.acked_adds.items() if tid in by_id and by_id[tid].status != "ready"]
    failed_appends = {j: jobs.get(j) for j in w.acked_appends if jobs.get(j) != "succeeded"}
    lost_patches = [f"{tid}/{me}" for (tid, me), n in w.acked_patches.items()
                    if (by_id[tid].meta or {}).get(f"load_{me}") != n]
    unacked = len(tasks) - preloaded - len(w.acked_adds)
    return {"tasks": len(tasks), "jobs": len(jobs), "jobs_by_status": dict(Counter(jobs.values())),
            "acked_adds": len(w.acked_adds), "acked_appends": len(w.acked_appends),
            "acked_patches": len(w.acked_patches), "lost_adds": lost_adds, "duplicated_adds": duplicated,
            "adds_not_ready": not_ready, "failed_appends": failed_appends, "lost_patches": lost_patches,
            "unacknowledged_tasks": unacked,
            "unfinished_jobs": sum(1 for s in jobs.values() if s in ("queued", "running"))}


def failures(result: dict[str, Any]) -> list[str]:
    """The checks that failed (empty: the load was held)."""
    total, v = result["summary"]["total"]["statuses"], result["store"]
    bad = []
    if errors := {s: c for s, c in total.items() if s.startswith("5") and s != "503"}:
        bad.append(f"5xx answers: {errors}")
    if total.get("-1"):
        bad.append(f"{total['-1']} connections cut")
    bad += nonzero_counts(v, ("lost_adds", "duplicated_adds", "adds_not_ready", "failed_appends", "lost_patches"))
    if v["unacknowledged_tasks"]:
        bad.append(f"{v['unacknowledged_tasks']} tasks stored that were not acknowledged")
    if v["unfinished_jobs"]:
        bad.append(f"{v['unfinished_jobs']} jobs still queued or running")
    return bad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--tasks", type=int, default=8, help="tasks added before the load")
    p.add_argument("--threads", type=int, default=2, help="intra-op torch threads of the service")
    p.add_argument("--model", default="bundled")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drain-timeout", type=float, default=240.0, help="longest wait for the queue to drain")
    add_run_options(p, "load")
    args = p.parse_args()

    started = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()
    groups, pairs = load_texts()
    names = sorted(groups)[: args.tasks]
    texts = [t for g in sorted(groups) for t in groups[g]]
    tmp = Path(tempfile.mkdtemp(prefix="fa-bench-load-"))
    from fisher_atlas import Atlas

    t0 = time.perf_counter()
    with Atlas(tmp, model=args.model, device="cpu") as atlas:
        for name in names:
            atlas.add(name, groups[name], progress=False)
    setup_s = time.perf_counter() - t0
    env = dict(os.environ, FISHER_ATLAS_MODEL=args.model, FISHER_ATLAS_DEVICE="cpu", HF_HUB_OFFLINE="1",
               FISHER_ATLAS_RATE_LIMIT_PER_S="0", FISHER_ATLAS_TORCH_THREADS=str(args.threads),
               FISHER_ATLAS_DATA_DIR=str(tmp), PYTHONPATH=str(ROOT))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(_serve_cmd(port), env=env, cwd=ROOT)
    try:
        startup_s = _wait_ready(url, proc)
        ready = httpx.get(f"{url}/v1/tasks", params={"limit": 100}, timeout=30).json()["items"]
        ids = [int(t["id"]) for t in ready]
        w = Workload(ready_ids=ids, texts=texts, prompts=[t for _, t in pairs], task_ids=list(ids))
        warm = Workload(ready_ids=ids, texts=texts, prompts=w.prompts, task_ids=list(ids))
        reads_and_routes = {k: v for k, v in MIX.items() if k not in WRITES}
        asyncio.run(drive(url, warm, args.concurrency, 3.0, args.seed + 1, reads_and_routes))  # warm-up
        wall = asyncio.run(drive(url, w, args.concurrency, args.duration, args.seed))
        load_end = os.getloadavg()
        left, drain_s = drain(url, args.drain_timeout)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    store = verify(tmp / "atlas.sqlite", w, preloaded=len(ids))
    result: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"), "machine": MACHINE, "cpus": os.cpu_count(),
        "loadavg_start": load_start, "loadavg_end_of_load": load_end, "model": args.model,
        "m": int(os.environ.get("FISHER_ATLAS_SKETCH_DIM", 4096)),
        "concurrency": args.concurrency, "duration_s": args.duration, "wall_s": wall, "mix": MIX,
        "tasks_preloaded": len(ids), "setup_s": setup_s, "startup_s": startup_s, "drain_s": drain_s,
        "unfinished_after_drain": left, "summary": summarize(w.samples, wall), "store": store,
        "route_server_ms": {stage: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}
                            for stage, v in w.route_stages.items() if v},
        "python": sys.version.split()[0],
    }
    shutil.rmtree(tmp, ignore_errors=True)
    finish_run(result, args, failures(result), table(result), write, "load not held")


HEADER = ["| requests | count | answered 2xx | 2xx per s | p50 ms | p99 ms | statuses |",
          "|---|---:|---:|---:|---:|---:|---|"]


def table(r: dict[str, Any]) -> str:
    """The per-kind markdown table (header included)."""
    return "\n".join([*HEADER, *_rows(r)])


def _rows(r: dict[str, Any]) -> list[str]:
    rows = []
    for kind, s in r["summary"].items():
        label = f"**{kind}**" if kind in ("reads", "writes", "total") else kind
        hist = ", ".join(f"{st}: {c:,}" for st, c in s["statuses"].items())
        rows.append(f"| {label} | {s['requests']:,} | {s['ok']:,} | {s['ok_per_s']:.1f} | {s['p50_ms']:.1f} "
                    f"| {s['p99_ms']:.1f} | {hist} |")
    return rows


def write(path: Path, args: argparse.Namespace, r: dict[str, Any]) -> None:
    """The markdown of ``bench/results/load.md``."""
    t, v = r["summary"]["total"], r["store"]
    refused = sum(c for st, c in t["statuses"].items() if st in ("429", "503"))
    server_errors = sum(c for st, c in t["statuses"].items() if st.startswith("5") and st != "503")
    cmd = (f"python -m bench.store.bench_load --concurrency {args.concurrency} --duration {args.duration:g} "
           f"--tasks {args.tasks} --threads {args.threads} --out {args.out}")
    fwd, search = r["route_server_ms"]["forward"], r["route_server_ms"]["search"]
    verdict = "held" if not r["failures"] else "NOT held: " + "; ".join(r["failures"])
    mix = ", ".join(f"{k} {v * 100:g} %" for k, v in r["mix"].items())
    jobs = ", ".join(f"{k} {c}" for k, c in v["jobs_by_status"].items())
    checks = [
        ("acknowledged adds (202) / appends (202) / (task, client) patches (200)",
         f"{v['acked_adds']} / {v['acked_appends']} / {v['acked_patches']}"),
        ("adds lost / stored twice / not ready", f"{len(v['lost_adds'])} / {len(v['duplicated_adds'])} / "
         f"{len(v['adds_not_ready'])}"),
        ("appends whose job did not succeed", f"{len(v['failed_appends'])}"),
        ("patches whose value is not stored", f"{len(v['lost_patches'])}"),
        ("tasks stored without an acknowledgement", f"{v['unacknowledged_tasks']}"),
        ("jobs queued or running at the end", f"{v['unfinished_jobs']} (of {v['jobs']}: {jobs})"),
    ]
    text = f"""## Load held: mixed reads and writes over HTTP (issue 14)

- Command: `{cmd}`
  (raw JSON: `bench/out/store/load.json`)
- Machine: {r['machine']}; date {r['date']} (UTC); 1-min load average {r['loadavg_start'][0]:.2f} at start,
  {r['loadavg_end_of_load'][0]:.2f} at the end of the load (the service, its job
  worker and the load generator share the two cores).
- Service: `fisher-atlas serve` on its embedded defaults (SQLite, FAISS, in-process job worker and prompt
  service), the **{r['model']}** model, m = {r['m']}, `FISHER_ATLAS_TORCH_THREADS={args.threads}`, the
  per-client rate limit off (`FISHER_ATLAS_RATE_LIMIT_PER_S=0`: one load generator is one client address).
- {r['tasks_preloaded']} tasks added beforehand (one per text group of `shared/data`, 24 texts each, library
  mode). **Concurrency {r['concurrency']}**: httpx async clients, each sending its next request when the last
  is answered, for {r['duration_s']:g} s (wall {r['wall_s']:.1f} s). Mix: {mix}.
  Adds carry 8 samples, appends 4; each client patches its own metadata key.

{table(r)}

Latencies are of 2xx answers, client-side (queueing in the server included). **Total: {t['ok_per_s']:.1f}
requests/s answered 2xx, p99 {t['p99_ms']:.0f} ms** (p50 {t['p50_ms']:.0f} ms); refused 429/503: {refused};
5xx: **{server_errors}**; cut connections: {t['statuses'].get('-1', 0)}.

Routes, server side (`Server-Timing`): forward p50 {fwd['p50']:.0f} / p99 {fwd['p99']:.0f} ms (waiting for
the micro-batch included), search p50 {search['p50']:.0f} / p99 {search['p99']:.0f} ms: the route tail is
in the model forward, on two cores shared with the job worker (it sketches queued uploads throughout the
run), the load generator and the other jobs on the box. Adds and appends answered 429 met a full job
queue (`max_queued_jobs` = 64, one worker thread): the promised back-pressure, with nothing stored for them.

Integrity after the run (every job ended {r['drain_s']:.1f} s after the load; then the service stopped and
the SQLite store was read directly):

| check | count |
|---|---:|
{chr(10).join(f"| {a} | {b} |" for a, b in checks)}

**Load {verdict}.**
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
