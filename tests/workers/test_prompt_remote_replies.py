"""What an API process trusts from Redis: a malformed prompt reply or worker announcement fails at most its own
request, never the listener every other reply waits on, and is never a 500.

Before: one reply without a readable header or with a header missing its lengths ended the listener task, and every
request then waiting got a 503 after ``timeout_s`` although its worker had answered; an announcement that is not
JSON made ``POST /v1/route`` a 500.

Real parts: ``RedisPromptSketcher`` on the Redis of 127.0.0.1:6379; the worker is a thread speaking the wire format
(``workers.prompt_wire``) so that it can send what a broken or other-version worker would.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from atlas.errors import ModelUnavailable
from atlas.ports import SpaceKey
from fishersketch import SketchSpec, SketchState
from workers.prompt_remote import RedisPromptSketcher, _queue_key, _worker_key, encode_reply

pytestmark = [pytest.mark.redis]
SPEC = SketchSpec(d=8, K=16, m=64, seed=0)
TIMEOUT_S = 3.0


@pytest.fixture
def space(redis_url: str) -> Iterator[SpaceKey]:
    """A space whose serving key no other test uses, announced by one fake worker."""
    sp = SpaceKey(1, "fake-model", f"mfp-{uuid.uuid4().hex}", SPEC.fingerprint(), SPEC.to_dict())
    client = redis.Redis.from_url(redis_url)
    client.set(_worker_key(sp.serving_key, "fake"), json.dumps({"worker_id": "fake", "prompts_per_s": 1.0}), ex=60)
    yield sp
    for key in client.scan_iter(match=f"fa:*{sp.serving_key}*"):
        client.delete(key)
    client.close()


def _serve_two(redis_url: str, space: SpaceKey, first_reply: Any) -> threading.Thread:
    """A worker thread taking two requests, answering the first with ``first_reply(id)`` and then the second with
    one well-formed (empty) state."""
    client = redis.Redis.from_url(redis_url)

    def run() -> None:
        msgs = []
        while len(msgs) < 2:
            item = client.blpop([_queue_key(space.serving_key)], timeout=10)
            if item is None:
                return
            msgs.append(json.loads(item[1]))
        client.rpush(msgs[0]["reply"], first_reply(msgs[0]["id"]))
        time.sleep(0.2)
        client.rpush(msgs[1]["reply"], encode_reply(msgs[1]["id"], [SketchState.empty(SPEC)]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


MALFORMED = {
    "no header": lambda rid: b"not json at all\n",
    "no lengths": lambda rid: json.dumps({"id": rid}).encode() + b"\n",
    "error not an object": lambda rid: json.dumps({"id": rid, "error": "boom"}).encode() + b"\n",
    "lengths and splits disagree": lambda rid: json.dumps({"id": rid, "lengths": [1, 2], "splits": [[0]],
                                                           "fingerprint": SPEC.fingerprint()}).encode() + b"\n",
    "another sketch spec": lambda rid: json.dumps({"id": rid, "lengths": [1], "splits": [[0]],
                                                   "fingerprint": "other"}).encode() + b"\n",
    "a short body": lambda rid: json.dumps({"id": rid, "lengths": [10 ** 6], "splits": [[0]],
                                            "fingerprint": SPEC.fingerprint()}).encode() + b"\n",
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_reply_fails_its_own_request_only(redis_url: str, space: SpaceKey, kind: str) -> None:
    sketcher = RedisPromptSketcher(redis_url, timeout_s=TIMEOUT_S)
    worker = _serve_two(redis_url, space, MALFORMED[kind])

    async def both() -> tuple[Any, Any, float]:
        start = time.monotonic()
        first = asyncio.create_task(sketcher.sketch(space, ["hello"]))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(sketcher.sketch(space, ["world"]))
        got = await asyncio.gather(first, second, return_exceptions=True)
        return got[0], got[1], time.monotonic() - start

    try:
        first, second, took = asyncio.run(both())
        worker.join(5)
        assert isinstance(second, list) and len(second) == 1, second  # answered, in time
        assert took < TIMEOUT_S + 1.0
        assert isinstance(first, ModelUnavailable), first  # a 503, never an unhandled error
        if kind != "no header":  # a reply naming its request fails that request at once
            assert took < TIMEOUT_S and ("malformed" in first.message or "another sketch spec" in first.message)
    finally:
        sketcher.close()


def test_an_unreadable_announcement_is_skipped(redis_url: str, space: SpaceKey) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(_worker_key(space.serving_key, "corrupt"), b"not json", ex=60)
    client.set(_worker_key(space.serving_key, "list"), b"[1, 2]", ex=60)
    sketcher = RedisPromptSketcher(redis_url, timeout_s=TIMEOUT_S)
    try:
        assert [w["worker_id"] for w in sketcher.workers(space.serving_key, max_age_s=0.0)] == ["fake"]
        client.delete(_worker_key(space.serving_key, "fake"))
        with pytest.raises(ModelUnavailable):  # only corrupt announcements left: no worker serves it (503)
            sketcher.check_served(space, sketcher.workers(space.serving_key, max_age_s=0.0))
    finally:
        sketcher.close()
        client.close()
