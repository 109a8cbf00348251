"""Prompt deadlines are compared on one clock, Redis's, so API and worker hosts whose clocks disagree still serve.

Before: the API wrote ``time.time() + remaining`` and the worker compared it with its own ``time.time()``; a worker
whose clock ran ahead by more than the prompt timeout dropped every request unserved and without a log line (the
API answered 503 after ``timeout_s``).

Real parts: a tiny GPT-2 (saved and loaded with transformers), a real ``PromptBatcher``, ``PromptServer`` and
``RedisPromptSketcher`` on the Redis of 127.0.0.1:6379; each side's wall clock is shifted by an hour.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas.ports import SpaceKey
from tests.conftest import REDIS_URL
from workers.extraction import Extractor
from workers.prompt_batcher import PromptBatcher
from workers.prompt_remote import PromptServer, RedisPromptSketcher, _inflight_key, _queue_key
from workers.redis_clock import SharedClock

pytestmark = [pytest.mark.redis]
HOUR = 3600.0


def _shifted(by: float) -> SharedClock:
    return SharedClock(local=lambda: time.time() + by)


@pytest.fixture
def space_and_batcher(gpt2_lm: Any) -> Iterator[tuple[SpaceKey, PromptBatcher]]:
    spec = gpt2_lm.make_spec(m=256)
    space = SpaceKey(1, "tiny-gpt2", f"{gpt2_lm.fingerprint.key()}-{uuid.uuid4().hex}", spec.fingerprint(),
                     spec.to_dict())
    batcher = PromptBatcher(Extractor(gpt2_lm, gpt2_lm.make_sketcher(spec)))
    yield space, batcher
    batcher.close()
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"fa:*{space.serving_key}*"):
        client.delete(key)
    client.close()


@pytest.mark.parametrize(("worker_shift", "api_shift"), [(HOUR, 0.0), (0.0, -HOUR), (-HOUR, HOUR)])
def test_prompts_are_served_whatever_each_hosts_clock_says(space_and_batcher: tuple[SpaceKey, PromptBatcher],
                                                           worker_shift: float, api_shift: float) -> None:
    space, batcher = space_and_batcher
    server = PromptServer(REDIS_URL, batcher, space)
    server.clock = _shifted(worker_shift)
    server.start()
    api = RedisPromptSketcher(REDIS_URL, timeout_s=5.0)
    api.clock = _shifted(api_shift)
    try:
        states = asyncio.run(api.sketch(space, ["a prompt sent across two clocks", "and another"]))
        assert len(states) == 2 and all(s.n_tokens > 0 for s in states)
        assert abs(server.clock.offset + worker_shift) < 1.0 and abs(api.clock.offset + api_shift) < 1.0
    finally:
        api.close()
        server.stop()


def test_a_request_past_its_deadline_is_dropped_with_a_log_line(space_and_batcher: tuple[SpaceKey, PromptBatcher],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A worker whose clock runs an hour ahead still drops a request its caller gave up on, on Redis's clock."""
    space, batcher = space_and_batcher
    server = PromptServer(REDIS_URL, batcher, space)
    server.clock = _shifted(HOUR)
    client = redis.Redis.from_url(REDIS_URL)
    redis_now = float(client.time()[0])
    reply = f"fa:reply:test-{uuid.uuid4().hex}"
    client.rpush(_queue_key(space.serving_key), json.dumps({"id": "late", "reply": reply, "prompts": ["x"],
                                                            "deadline": redis_now - 5}))
    with caplog.at_level(logging.INFO, logger="workers.prompt_remote"):
        server.start()
        try:
            deadline = time.monotonic() + 10
            while client.llen(_queue_key(space.serving_key)) or client.llen(
                    _inflight_key(space.serving_key, server.worker_id)):
                assert time.monotonic() < deadline, "the late request was not taken"
                time.sleep(0.05)
        finally:
            server.stop()
    assert client.llen(reply) == 0  # not served
    assert any("stopped waiting" in r.getMessage() for r in caplog.records), caplog.text
    client.close()


@settings(max_examples=200, deadline=None)
@given(skew=st.floats(-1e6, 1e6), sent=st.floats(1.6e9, 2e9), rtt=st.floats(0, 2), server_at=st.floats(0, 1))
def test_the_measured_offset_is_within_half_a_round_trip(skew: float, sent: float, rtt: float,
                                                         server_at: float) -> None:
    """Redis reads its clock somewhere within the round trip: the offset is off by at most half of it, whatever the
    skew, and ``now()`` is the host's clock plus the offset."""
    local = sent + 0.25
    clock = SharedClock(local=lambda: local)
    server = sent + server_at * rtt + skew  # the server's clock when it answered
    clock.update((int(server // 1), round(server % 1 * 1e6)), sent, sent + rtt)
    assert abs(clock.offset - skew) <= rtt / 2 + 1e-5
    assert clock.now() == pytest.approx(local + clock.offset)
    assert not clock.stale()
