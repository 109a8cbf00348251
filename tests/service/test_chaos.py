"""Scale-out chaos: the compose deployment as processes, with SIGKILLs under load.

PostgreSQL, Redis, two API processes and two worker processes, each started with the command and the
environment ``docker-compose.yml`` gives its service (only addresses, the model, the device and the data
directory are replaced for this machine). Clients add, append and route against both APIs while, in every
round, one API process and one worker are SIGKILLed at a random point and restarted. Afterwards:

* every acknowledged add (202) is a task present exactly once, every acknowledged append a job;
* every job ends (none stays queued or running);
* every request was answered or refused with 503/429 (or its connection was cut by the kill) — never 500.

The machinery (:mod:`tests.service.chaos_cluster`) is shared with ``bench/store/bench_chaos.py``, which runs
more rounds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REDIS_URL
from tests.service.chaos_cluster import ALLOWED_STATUSES, ChaosCluster, check_store, run_chaos

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

ROUNDS = int(os.environ.get("FISHER_ATLAS_CHAOS_ROUNDS") or 3)
ROUND_S = 6.0


@pytest.fixture
def cluster(pg_database: Any, tiny_model_dir: Path, tmp_path: Path) -> Iterator[ChaosCluster]:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        pytest.skip(f"Redis at {REDIS_URL} is unreachable: {exc}")
    c = ChaosCluster(pg_database(), tiny_model_dir, tmp_path)
    yield c
    c.close()


def test_kill_api_and_worker_under_load(cluster: ChaosCluster) -> None:
    run = run_chaos(cluster, rounds=ROUNDS, round_s=ROUND_S)
    statuses = run.statuses
    assert statuses[500] == 0, statuses
    assert set(statuses) <= ALLOWED_STATUSES, statuses
    assert statuses[200] > 0 and statuses[202] > 0, statuses
    # Every acknowledged job ends; every acknowledged add is there exactly once.
    check = check_store(cluster, timeout=180)
    assert check.unfinished == 0, f"timed out waiting for every job to end ({check.unfinished} unfinished)"
    assert not check.missing_adds(run), check.missing_adds(run)
    assert not check.duplicated_adds(run), check.duplicated_adds(run)
    assert not check.failed_appends(run), check.failed_appends(run)
    assert check.succeeded >= len(run.acked_adds)
