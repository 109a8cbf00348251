"""A Redis that hangs (accepts connections, answers nothing) under a scaled-out API: uploads are answered, not held.

Found by an outage review (2026-11-29): with Redis stopped (SIGSTOP), every upload hung until Redis came back — the
job's wake-up (Celery's publish) had no socket timeout — holding an upload slot each, so that a fifth upload was
refused "busy" after 30 s; and a registry read of the worker list ran inside the upload's write transaction. Real
HTTP, a real redis-server of the test's own, a real prompt worker (PromptServer) announcing in it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx

from tests.service.test_prompt_service import private_redis  # noqa: F401  (the fixture)
from workers.prompt_batcher import PromptBatcher

HUNG_ANSWER_S = 40.0
"""The longest an upload may wait for a hung Redis here: about two broker socket timeouts (5 s) and one registry
read (2 s × 3 tries), with room for a loaded CI box. Before the fix it waited for as long as Redis hung."""


def test_an_upload_is_answered_503_with_nothing_stored_while_redis_hangs(serve: Any, tiny_lm: Any,
                                                                         private_redis: Any,  # noqa: F811
                                                                         tmp_path: Path) -> None:
    from workers.prompt_remote import PromptServer

    url, proc = private_redis
    data = tmp_path / "shared-store"
    with_model = serve(lm=tiny_lm, data_dir=data, overrides={"start_runner": False})  # the model's space
    queries = with_model.container.queries
    batcher = PromptBatcher(queries.prompts.batcher.extractor)
    worker = PromptServer(url, batcher, queries.space_key(None)).start()  # a live worker serves the space
    api = serve(lm=None, data_dir=data, queue="celery", prompt_service="redis", redis_url=url,
                overrides={"start_runner": False})
    upload = {"name": "first", "samples": [{"text": "The fox jumps over the lazy dog."},
                                           {"text": "A cat sleeps on the warm mat."}]}
    try:
        with httpx.Client(base_url=api.url, timeout=HUNG_ANSWER_S + 30) as http:
            deadline = time.monotonic() + 20
            while (r := http.post("/v1/tasks", json=upload)).status_code != 202:  # the worker announced itself
                assert r.status_code == 503 and time.monotonic() < deadline, r.text
                time.sleep(0.2)
            proc.send_signal(signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                r = http.post("/v1/tasks", json={**upload, "name": "during"})
                waited = time.monotonic() - t0
                assert r.status_code == 503, r.text
                assert r.json()["code"] in ("queue_unavailable", "model_unavailable"), r.text
                assert waited < HUNG_ANSWER_S, waited
                assert "Retry-After" in r.headers
                names = [t["name"] for t in http.get("/v1/tasks").json()["items"]]
                assert names == ["first"]  # nothing of the refused upload was kept
            finally:
                proc.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + 30  # Redis answers again: so does the service, with no restart
            while (r := http.post("/v1/tasks", json={**upload, "name": "after"})).status_code != 202:
                assert r.status_code == 503 and time.monotonic() < deadline, r.text
                time.sleep(0.5)
            assert sorted(t["name"] for t in http.get("/v1/tasks").json()["items"]) == ["after", "first"]
    finally:
        worker.stop()
        batcher.close()
