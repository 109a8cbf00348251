"""A model-free API process (prompts over Redis) when Redis goes silent: ``POST /v1/route`` answers 503 within
``prompt_timeout_s`` and the process keeps answering other requests meanwhile.

Real parts: a uvicorn server in remote prompt mode over SQLite, a real ``PromptServer`` worker of the tiny
GPT-2 on the Redis of 127.0.0.1:6379, and a TCP proxy between the API and Redis that stops relaying (a silent
network partition: connections stay open, no bytes come back).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atlas import space_repository
from atlas.ports import SpaceKey
from tests.workers.test_prompt_remote_faults import REDIS_URL, FreezableProxy, redis_client  # noqa: F401
from workers.extraction import Extractor
from workers.prompt_batcher import PromptBatcher
from workers.prompt_remote import PromptServer

pytestmark = [pytest.mark.redis]
TIMEOUT_S = 1.5


@pytest.fixture
def proxy(redis_client: Any) -> Iterator[FreezableProxy]:  # noqa: F811
    p = FreezableProxy()
    yield p
    p.stop()


def test_route_answers_503_in_time_and_the_api_stays_responsive_when_redis_is_silent(
        serve: Any, tiny_lm: Any, proxy: FreezableProxy, redis_client: Any, tmp_path: Path) -> None:  # noqa: F811
    """The route read the worker registry with a blocking Redis call on the event loop: with Redis silent, the
    whole process (``/healthz`` included) stalled for the 5 s socket timeout, and the route took as long
    whatever ``prompt_timeout_s`` said."""
    svc = serve(lm=None, queue="celery", prompt_service="redis", redis_url=proxy.url, prompt_timeout_s=TIMEOUT_S,
                celery_queue=f"fa_test_{uuid.uuid4().hex[:8]}")
    spec = tiny_lm.make_spec(m=256, seed=random.randrange(1, 2**31))  # a serving key of this test's own
    with svc.container.store.session() as s:
        row = space_repository.get_or_create_space(
            s, model_fingerprint=tiny_lm.fingerprint.key(), spec_fingerprint=spec.fingerprint(), model_name="tiny",
            d=spec.d, K=spec.K, m=spec.m, seed=spec.seed, spec=spec.to_dict())
        key = SpaceKey.of(row)
    batcher = PromptBatcher(Extractor(tiny_lm, tiny_lm.make_sketcher(spec)))
    worker = PromptServer(REDIS_URL, batcher, key).start()
    body = {"prompt": "the quick brown fox jumps over the dog", "threshold": -1}

    async def scenario() -> tuple[int, float, float]:
        async with httpx.AsyncClient(base_url=svc.url, timeout=30) as http:
            first = await http.post("/v1/route", json=body)
            assert first.status_code == 200, first.text
            proxy.freeze()
            await asyncio.sleep(0.6)  # the API's cached list of live workers expires: read from Redis again

            async def health_latency() -> float:
                await asyncio.sleep(0.3)
                t0 = time.monotonic()
                assert (await http.get("/healthz")).status_code == 200
                return time.monotonic() - t0

            t0 = time.monotonic()
            route, health = await asyncio.gather(http.post("/v1/route", json=body), health_latency())
            return route.status_code, time.monotonic() - t0, health

    try:
        status, route_s, health_s = asyncio.run(scenario())
    finally:
        worker.stop()
        batcher.close()
        for k in redis_client.scan_iter(match=f"fa:*{key.serving_key}*"):
            redis_client.delete(k)
    assert status == 503
    assert route_s < TIMEOUT_S + 1.0, route_s
    assert health_s < 1.0, health_s
