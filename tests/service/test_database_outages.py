"""PostgreSQL restarting under a running API: answers say "unavailable", and a job's event stream survives it.

Found by an outage review (2026-11-29): while the database was down, errors said 503 ``database_busy`` ("the
database is busy") — an operator looks for a lock, not a dead server — and ``GET /v1/jobs/{id}/events`` was cut
without an ``end`` event (a browser's EventSource then got a 503 on reconnect and gave up). Real HTTP, real
PostgreSQL: the API's database refuses connections and loses its sessions (:func:`tests.store_helpers.pg_outage`).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from atlas import apikeys
from tests.store_helpers import pg_outage

OUTAGE_S = 3.0


def test_a_database_outage_is_named_and_a_job_event_stream_outlives_it(serve: Any, tiny_lm: Any,
                                                                       pg_database: Any, redis_url: str) -> None:
    db_url = pg_database()
    svc = serve(lm=tiny_lm, database_url=db_url, overrides={"start_runner": False})  # the job stays queued
    # a replica without a model (prompts over Redis): its /readyz blamed "the worker registry (Redis)"
    replica = serve(lm=None, database_url=db_url, queue="celery", prompt_service="redis", redis_url=redis_url,
                    overrides={"start_runner": False})
    # a replica that requires keys: its key gate reads the database before any route (it answered "busy" too)
    keyed = serve(lm=tiny_lm, database_url=db_url, require_keys=True, overrides={"start_runner": False})
    with keyed.container.store.session() as s:  # keys now exist: every replica of the store asks for one
        _, admin = apikeys.create_api_key(s, "admin", ["admin"])
        _, key = apikeys.create_api_key(s, "outage", ["read"])  # never used before the outage: not cached
    auth = {"X-API-Key": admin}
    events: list[tuple[str, Any]] = []
    with httpx.Client(base_url=svc.url, timeout=60, headers=auth) as http:
        r = http.post("/v1/tasks", json={"name": "prose", "samples": [{"text": "The fox jumps over the dog."}]})
        assert r.status_code == 202, r.text
        job_id = r.json()["job"]["id"]

        def stream() -> None:
            with httpx.stream("GET", f"{svc.url}/v1/jobs/{job_id}/events", timeout=60, headers=auth) as resp:
                kind = ""
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        events.append((kind, json.loads(line[5:])))

        reader = threading.Thread(target=stream)
        reader.start()
        deadline = time.monotonic() + 10
        while not events:
            assert time.monotonic() < deadline, "no first event"
            time.sleep(0.05)
        answers: list[httpx.Response] = []
        outage = threading.Thread(target=pg_outage, args=(db_url, OUTAGE_S))
        outage.start()
        time.sleep(OUTAGE_S / 3)
        answers.append(http.get("/v1/tasks"))
        replica.container.queries._space_keys.clear()  # as after its 5 s: the default space is read again
        answers.append(httpx.get(f"{replica.url}/readyz", timeout=30))
        answers.append(httpx.get(f"{keyed.url}/v1/tasks", headers={"X-API-Key": key}, timeout=30))
        outage.join()
        deadline = time.monotonic() + 20  # back: the API recovers by itself, and the job can be cancelled
        while (r := http.post(f"/v1/jobs/{job_id}/cancel")).status_code != 200:
            assert r.status_code == 503 and time.monotonic() < deadline, r.text
            time.sleep(0.2)
        reader.join(30)
    assert not reader.is_alive()
    for down in (answers[0], answers[2]):
        assert down.status_code == 503 and down.json()["code"] == "database_unavailable", down.text
        assert "cannot be reached" in down.json()["message"] and int(down.headers["Retry-After"]) >= 1
    ready = answers[1].json()
    assert answers[1].status_code == 503 and ready["checks"]["database"] is False, ready
    assert "Redis" not in ready["detail"]["model"] and "default space cannot be read" in ready["detail"]["model"]
    assert events[-1] == ("end", {"id": job_id, "status": "cancelled"}), events  # the stream saw it to the end
