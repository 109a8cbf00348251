"""Chaos rounds run and survived: SIGKILLs of API and worker processes under load (issue 14).

Usage::

    python -m bench.store.bench_chaos --rounds 10 --out bench/results/chaos.md

The scale-out deployment of ``docker-compose.yml`` as processes (PostgreSQL and Redis on this machine,
two API processes, two worker processes, each with its compose command and environment), driven by the
machinery of ``tests/service/test_chaos.py`` (:mod:`tests.service.chaos_cluster`) for more rounds than the
test runs: six client threads add, append and route against both APIs while in every round one API
process and one worker are SIGKILLed at a random point and restarted. Afterwards the store is read:
every acknowledged add must be a task exactly once, every acknowledged append a succeeded job, no job may
stay queued or running, and no request may have been answered 500.

Raw JSON: ``bench/out/store/chaos.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.store.common import add_run_options, finish_run, nonzero_counts

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "2-core CPU (python-svc dev box)"
PG_ADMIN = os.environ.get("FISHER_ATLAS_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the rounds and read the store; the figures of one run."""
    from tests.service.chaos_cluster import ChaosCluster, check_store, run_chaos
    from tests.store_helpers import create_pg_database, drop_pg_database
    from tests.tiny_models import save_tiny_gpt2

    tmp = Path(tempfile.mkdtemp(prefix="fa-bench-chaos-"))
    model: Path | str = args.model if args.model != "tiny" else save_tiny_gpt2(tmp / "tiny-gpt2")
    db_url = create_pg_database(args.pg, prefix="fa_bench")
    cluster = ChaosCluster(db_url, model, tmp, redis_url=args.redis_url)
    try:
        chaos = run_chaos(cluster, rounds=args.rounds, round_s=args.round_s, clients=args.clients, seed=args.seed)
        store = check_store(cluster, timeout=args.drain_timeout)
    finally:
        cluster.close()
        drop_pg_database(args.pg, db_url)
        shutil.rmtree(tmp, ignore_errors=True)
    st = chaos.statuses
    refused = st[429] + st[503]
    server_errors = sum(c for s, c in st.items() if s >= 500 and s != 503)
    failed_appends = store.failed_appends(chaos)
    return {
        "rounds": chaos.rounds, "seconds": chaos.seconds, "clients": args.clients,
        "kills": dict(chaos.kills), "api_down_s": chaos.restart_s,
        "statuses": {str(k): v for k, v in sorted(st.items())},
        "sent": sum(st.values()), "answered": sum(c for s, c in st.items() if s > 0 and s not in (429, 503)),
        "refused": refused, "no_answer": st[-1], "connect_refused": chaos.no_answer["refused"],
        "cut": chaos.no_answer["cut"], "server_errors": server_errors, "status_500": st[500],
        "acked_adds": len(chaos.acked_adds), "acked_appends": len(chaos.acked_appends),
        "duplicated": store.duplicated_adds(chaos), "lost_adds": store.missing_adds(chaos),
        "lost_appends": {str(j): s for j, s in failed_appends.items()},
        "stuck_jobs": store.unfinished, "drain_s": store.waited_s, "jobs": len(store.jobs),
        "jobs_succeeded": store.succeeded, "tasks": sum(store.names.values()),
    }


def failures(r: dict[str, Any]) -> list[str]:
    """The checks that failed (empty: every round survived)."""
    bad = []
    if r["server_errors"]:
        bad.append(f"{r['server_errors']} answers 5xx other than 503")
    return bad + nonzero_counts(r, ("duplicated", "lost_adds", "lost_appends", "stuck_jobs"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--round-s", type=float, default=6.0, help="longest wait before a round's kills")
    p.add_argument("--clients", type=int, default=6, help="client threads")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--model", default="tiny", help="'tiny' (the test's tiny GPT-2), 'bundled' or a directory")
    p.add_argument("--drain-timeout", type=float, default=180.0, help="longest wait for every job to end")
    p.add_argument("--pg", default=PG_ADMIN, help="PostgreSQL server (a throw-away database is made there)")
    p.add_argument("--redis-url", default=os.environ.get("FISHER_ATLAS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    add_run_options(p, "chaos")
    args = p.parse_args()

    started = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    result = run(args)
    result.update({"date": started.isoformat(timespec="seconds"), "machine": MACHINE, "cpus": os.cpu_count(),
                   "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "model": args.model,
                   "round_s": args.round_s, "seed": args.seed, "total_s": time.perf_counter() - t0,
                   "python": sys.version.split()[0]})
    finish_run(result, args, failures(result), table(result), write, "chaos not survived")


def table(r: dict[str, Any]) -> str:
    """The markdown table of one run."""
    rows = [
        ("rounds run", f"{r['rounds']}"),
        ("SIGKILLs: API processes / worker processes", f"{r['kills'].get('api', 0)} / {r['kills'].get('worker', 0)}"),
        ("requests sent (every attempt, retries included)", f"{r['sent']:,}"),
        ("answered (any status but 429/503)", f"{r['answered']:,}"),
        ("refused 429 / 503", f"{r['statuses'].get('429', 0):,} / {r['statuses'].get('503', 0):,}"),
        ("no answer: connection refused (API down) / cut by a kill", f"{r['connect_refused']:,} / {r['cut']:,}"),
        ("acknowledged adds / appends", f"{r['acked_adds']:,} / {r['acked_appends']:,}"),
        ("**duplicated adds** (must be 0)", f"**{len(r['duplicated'])}**"),
        ("**lost adds + appends** (must be 0)", f"**{len(r['lost_adds']) + len(r['lost_appends'])}**"),
        ("**stuck jobs** (queued or running at the end; must be 0)", f"**{r['stuck_jobs']}**"),
        ("**500 answers** (must be 0)", f"**{r['status_500']}**"),
    ]
    return "\n".join(["| what | count |", "|---|---:|", *(f"| {a} | {b} |" for a, b in rows)])


def write(path: Path, args: argparse.Namespace, r: dict[str, Any]) -> None:
    """The markdown of ``bench/results/chaos.md``."""
    cmd = f"python -m bench.store.bench_chaos --rounds {args.rounds} --out {args.out}"
    model = ("the tests' tiny random GPT-2 (`tests/tiny_models.py`, 2 layers × 32)" if r["model"] == "tiny"
             else f"`{r['model']}`")
    verdict = "All rounds survived" if not r["failures"] else "NOT survived: " + "; ".join(r["failures"])
    down = r["api_down_s"]
    text = f"""## Chaos rounds: SIGKILLs of API and worker processes under load (issue 14)

- Command: `{cmd}`
  (raw JSON: `bench/out/store/chaos.json`)
- Machine: {r['machine']}; date {r['date']} (UTC); 1-min load average {r['loadavg_start'][0]:.2f} at
  start, {r['loadavg_end'][0]:.2f} at the end (the box was shared with other jobs); every process and the
  clients on the same two cores.
- Deployment: `docker-compose.yml` as processes: PostgreSQL 127.0.0.1 (a throw-away database, migrated),
  Redis 127.0.0.1, **2 API processes and 2 worker processes**, each with its compose command and
  environment (API keys required, prompts over Redis; addresses, device = cpu, m = 256 and the data
  directories replaced). Model: {model}.
  The machinery is the chaos test's (`tests/service/chaos_cluster.py`; `tests/service/test_chaos.py`
  runs it for 3 rounds).
- {r['clients']} client threads, each picking an API at random: adds of 12 samples (30 %), appends of 4
  samples to an acknowledged task (15 %), routes (the rest); adds and appends carry an Idempotency-Key and
  are retried with it (up to 5 attempts) on 429/503 and on a failed connection. Each round waits
  0.5-{r['round_s']:g} s, SIGKILLs one API and one worker (each process group), waits 0.2-1.5 s, restarts
  both and waits for the API to answer again (killed API down {min(down):.1f}-{max(down):.1f} s per round,
  median {statistics.median(down):.1f} s). {r['seconds']:.0f} s of load; every job had ended
  {r['drain_s']:.1f} s after it.

{table(r)}

Statuses of every attempt: {', '.join(f'{s}: {c:,}' for s, c in r['statuses'].items())} (-1: no answer).
Clients keep sending while an API is down, so most attempts without an answer are refused connections
to the killed API before it listens again (a client retries writes; routes are not retried).
Store at the end: {r['tasks']} tasks, {r['jobs']} jobs ({r['jobs_succeeded']} succeeded). **{verdict}.**
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
