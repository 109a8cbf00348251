"""The remote prompt path under faults: a worker's serving thread survives a bad request.

Real parts: a tiny GPT-2 (saved and loaded with transformers), a real ``PromptBatcher``, a real
``PromptServer`` and ``RedisPromptSketcher`` on the Redis of 127.0.0.1:6379.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from atlas.ports import SpaceKey
from workers.extraction import Extractor
from workers.prompt_batcher import PromptBatcher
from workers.prompt_remote import PromptServer, RedisPromptSketcher, _inflight_key, _queue_key

pytestmark = [pytest.mark.redis]

REDIS_URL = os.environ.get("FISHER_ATLAS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="module")
def redis_client() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except Exception as exc:
        pytest.skip(f"Redis at {REDIS_URL} is unreachable: {exc}")
    return client


@pytest.fixture
def worker(gpt2_lm: Any, redis_client: redis.Redis) -> Iterator[tuple[PromptServer, SpaceKey]]:
    """A prompt worker of the tiny GPT-2 under a serving key of its own (no other test's worker shares it)."""
    spec = gpt2_lm.make_spec(m=256)
    space = SpaceKey(1, "tiny-gpt2", f"{gpt2_lm.fingerprint.key()}-{uuid.uuid4().hex}", spec.fingerprint(),
                     spec.to_dict())
    batcher = PromptBatcher(Extractor(gpt2_lm, gpt2_lm.make_sketcher(spec)))
    server = PromptServer(REDIS_URL, batcher, space).start()
    yield server, space
    server.stop()
    batcher.close()
    for key in redis_client.scan_iter(match=f"fa:*{space.serving_key}*"):
        redis_client.delete(key)


def test_a_malformed_request_does_not_stop_the_worker_serving(worker: tuple[PromptServer, SpaceKey],
                                                              redis_client: redis.Redis) -> None:
    """A request the worker cannot read (not JSON, or JSON without its fields) is dropped with a log line; the
    worker goes on serving the model's prompts (its serving thread died: it still announced itself, so every
    later prompt waited ``timeout_s`` for a 503 and the bad request sat in its in-flight list for good)."""
    server, space = worker
    api = RedisPromptSketcher(REDIS_URL, timeout_s=5.0)

    async def scenario() -> list[int]:
        sizes = [len(await api.sketch(space, ["a first prompt to serve"]))]
        redis_client.rpush(_queue_key(space.serving_key), b"not json", b'{"id": "x"}', b"[1, 2]")
        sizes.append(len(await api.sketch(space, ["the fox jumps over the dog", "a second prompt"])))
        return sizes

    try:
        assert asyncio.run(scenario()) == [1, 2]
    finally:
        api.close()
    assert all(t.is_alive() for t in server._threads)
    assert redis_client.llen(_inflight_key(space.serving_key, server.worker_id)) == 0
