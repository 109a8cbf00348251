"""The remote prompt path under faults: a worker's serving thread survives a bad request, and an API caller's
wait stays bounded by ``timeout_s`` (with its event loop free) when Redis stops answering.

Real parts: a tiny GPT-2 (saved and loaded with transformers), a real ``PromptBatcher``, a real
``PromptServer`` and ``RedisPromptSketcher`` on the Redis of 127.0.0.1:6379; a TCP proxy in front of Redis
stands in for a network partition (it stops relaying bytes, the connections stay open).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from atlas.errors import ModelUnavailable
from atlas.ports import SpaceKey
from tests.conftest import REDIS_URL
from workers.extraction import Extractor
from workers.prompt_batcher import PromptBatcher
from workers.prompt_remote import PromptServer, RedisPromptSketcher, _inflight_key, _queue_key

pytestmark = [pytest.mark.redis]



@pytest.fixture(scope="module")
def redis_client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, socket_connect_timeout=2)


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


class FreezableProxy:
    """A TCP proxy to Redis on a loopback port; :meth:`freeze` stops relaying (a silent network partition)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 6379) -> None:
        self.target = (host, port)
        self.relaying = threading.Event()
        self.relaying.set()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()

        async def start() -> None:
            self.server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
            self.port = int(self.server.sockets[0].getsockname()[1])
            ready.set()

        def run() -> None:
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="redis-proxy", daemon=True)
        self.thread.start()
        assert ready.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def freeze(self) -> None:
        self.relaying.clear()

    def stop(self) -> None:
        self.relaying.set()

        async def close() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while not self.relaying.is_set():
                    await asyncio.sleep(0.05)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.loop.create_task(self._pipe(reader, up_writer))
        self.loop.create_task(self._pipe(up_reader, writer))


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


def test_the_wait_is_bounded_by_timeout_s_when_redis_stops_answering(worker: tuple[PromptServer, SpaceKey]) -> None:
    """Redis silent (a partition: connections open, no bytes back): a route's prompts fail with 503 within the
    caller's ``timeout_s``, and the API's event loop keeps running meanwhile (the worker registry was read
    with a blocking call on the loop: every request of the process stalled for the socket timeout, 5 s, and
    the caller waited that long whatever ``timeout_s`` said)."""
    _, space = worker
    proxy = FreezableProxy()
    api = RedisPromptSketcher(proxy.url, timeout_s=1.5)

    async def scenario() -> tuple[float, float, float]:
        assert len(await api.sketch(space, ["a prompt while Redis answers"])) == 1
        proxy.freeze()
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.02)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        results = []
        tick = asyncio.ensure_future(ticker())
        for pause in (0.0, 0.6):  # the worker list still cached, then expired (read from Redis again)
            await asyncio.sleep(pause)
            t0 = time.monotonic()
            with pytest.raises(ModelUnavailable):
                await asyncio.wait_for(api.sketch(space, ["a prompt while Redis is silent"]), 30)
            results.append(time.monotonic() - t0)
        await asyncio.sleep(0.1)
        tick.cancel()
        return results[0], results[1], max(gaps)

    try:
        cached, expired, gap = asyncio.run(scenario())
    finally:
        api.close()
        proxy.stop()
    assert cached < 1.5 + 0.5 and expired < 1.5 + 0.5, (cached, expired)
    assert gap < 1.0, gap


def test_orphaned_requests_are_failed_with_one_registry_read_per_model(worker: tuple[PromptServer, SpaceKey],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-a-second orphan check read the worker registry from Redis once per *waiting request*; with a full
    queue (say 64 waiting prompts of one model) that was 64 reads a second where one answers for all."""
    _, space = worker
    api = RedisPromptSketcher(REDIS_URL, timeout_s=5.0)
    reads: list[str] = []

    def no_workers(serving_key: str, *, max_age_s: float = 0.0) -> list[dict[str, Any]]:
        reads.append(serving_key)
        return []  # the model's last worker stopped

    monkeypatch.setattr(api, "workers", no_workers)

    async def scenario() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(16)]
        for i, fut in enumerate(futures):
            api._waiting[f"r{i}"] = (fut, space)
        await asyncio.to_thread(api._fail_orphans)
        await asyncio.sleep(0)  # the failures are set on the loop's thread
        return [f.exception() if f.done() else None for f in futures]

    try:
        errors = asyncio.run(scenario())
    finally:
        api.close()
    assert reads == [space.serving_key]
    assert all(isinstance(e, ModelUnavailable) for e in errors), errors


def test_a_stopping_worker_answers_its_running_batch_and_gives_back_the_waiting_ones(
        worker: tuple[PromptServer, SpaceKey], redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """At stop a worker withdrew its announcement at once — the API answered every waiting caller 503 — and then
    computed every request it had taken, for up to 35 s, ending in SIGABRT as its interpreter exited under a running
    batch (a lifecycle review, 2026-12-07). Now the batch being run is answered while the worker is still announced,
    and the requests waiting for a batch are given back, uncomputed, for another worker."""
    server, space = worker
    real = server.batcher.sketch_prepared
    running = threading.Event()
    batches: list[int] = []

    def slow_model(prepared: Any, *args: Any, **kwargs: Any) -> Any:
        batches.append(len(prepared))
        running.set()
        time.sleep(1.5)  # a large model's batch
        return real(prepared, *args, **kwargs)

    monkeypatch.setattr(server.batcher, "sketch_prepared", slow_model)
    api = RedisPromptSketcher(REDIS_URL, timeout_s=15.0)
    prompts = [f"prompt number {i} of a batch" for i in range(40)]  # 40 + 40 > 64: one request a batch

    async def ask(delay: float) -> Any:
        await asyncio.sleep(delay)
        try:
            return len(await api.sketch(space, prompts))
        except ModelUnavailable as exc:
            return exc

    async def scenario() -> list[Any]:
        return await asyncio.gather(ask(0.0), ask(0.3), ask(0.3))

    answers: list[Any] = []
    asker = threading.Thread(target=lambda: answers.extend(asyncio.run(scenario())))
    asker.start()
    try:
        assert running.wait(20)
        time.sleep(0.8)  # the other two requests are taken and wait for a batch
        t0 = time.monotonic()
        server.stop()
        stopped_in = time.monotonic() - t0
        asker.join(timeout=30)
    finally:
        api.close()
    assert answers[0] == 40, answers  # the running batch's caller is answered
    assert all(isinstance(a, ModelUnavailable) for a in answers[1:]), answers  # no worker left for the others
    assert batches == [40] and stopped_in < 8, (batches, stopped_in)  # given back uncomputed
    assert redis_client.llen(_inflight_key(space.serving_key, server.worker_id)) == 0
    assert redis_client.llen(_queue_key(space.serving_key)) <= 2  # back in the queue (or failed by the API)


def test_the_embedded_prompt_service_closes_without_computing_waiting_prompts(gpt2_lm: Any,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve``'s stop closes its prompt service once the open requests are answered or cut at the grace period's
    end: the prompts still queued had no caller left, and computing them held the stop for up to 30 s more."""
    from concurrent.futures import CancelledError

    from workers.prompt_batcher import InProcessPromptSketcher

    spec = gpt2_lm.make_spec(m=256)
    service = InProcessPromptSketcher(Extractor(gpt2_lm, gpt2_lm.make_sketcher(spec)), model_name="tiny")
    batcher = service.batcher
    assert batcher is not None
    real, running, batches = batcher.sketch_prepared, threading.Event(), []

    def slow_model(prepared: Any, *args: Any, **kwargs: Any) -> Any:
        batches.append(len(prepared))
        running.set()
        time.sleep(1.0)
        return real(prepared, *args, **kwargs)

    monkeypatch.setattr(batcher, "sketch_prepared", slow_model)
    prepared = batcher.prepare([f"prompt number {i} of a batch" for i in range(40)])
    first = batcher.submit(prepared)
    assert running.wait(20)
    waiting = [batcher.submit(prepared), batcher.submit(prepared)]
    service.close()
    assert len(first.result(timeout=10)) == 40 and batches == [40]
    for fut in waiting:
        with pytest.raises(CancelledError):
            fut.result(timeout=1)
