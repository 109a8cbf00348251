"""Prompts to model workers over Redis: API replicas hold no model.

Why Redis: it is already the broker of the job queue in the scale-out stack, workers only need
outbound connections (no service discovery, no inbound port on GPU machines), and a list gives a
shared work queue per model that any number of workers drain. The overhead is two round trips on the
API side (push, pop) and about 48 KiB of state bytes per prompt at m = 4096 (float32 sums of the
prompt's split, :func:`encode_reply`; ``bench/api``).

Keys (``<key>`` is :attr:`atlas.ports.SpaceKey.serving_key`, a hash of the model and spec fingerprints)

* ``fa:worker:<key>:<worker id>`` — a worker's announcement (JSON: model, space id, measured
  prompts/s), refreshed every ``HEARTBEAT_S`` with a ``WORKER_TTL_S`` expiry;
* ``fa:prompts:<key>`` — the request list of one (model, spec); requests are JSON
  ``{"id", "reply", "prompts", "deadline"}`` (``deadline``: when the caller stops waiting, on Redis's clock —
  :class:`workers.redis_clock.SharedClock` — so hosts whose clocks disagree still agree on it);
* ``fa:inflight:<key>:<worker id>`` — requests a worker has taken (``LMOVE``), removed after its
  reply; when the worker's announcement expires (SIGKILL), any live worker of the key moves them back
  to the head of the request list, so they are served again;
* ``fa:reply:<client id>`` — the replies of one API process: a JSON header line, then the states
  back to back (:func:`encode_reply`).

Time bound: an API caller gets its states or an error within ``timeout_s`` (default 10 s) — at once
(503) when no worker announces the space's model, and within ``WORKER_TTL_S + 1`` s when the last
worker of the model dies while the request waits. A worker that dies mid-batch while another one lives
costs the request about ``WORKER_TTL_S + HEARTBEAT_S`` seconds, not an error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from atlas.errors import AtlasError, ModelUnavailable, QueueFull
from atlas.ports import SpaceKey
from fishersketch import SketchSpec, SketchState
from workers.prompt_wire import decode_reply as decode_reply
from workers.prompt_wire import encode_reply as encode_reply
from workers.redis_clock import SharedClock
from workers.redis_options import OutageLog, redis_retry

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""Period of a worker's announcement refresh and dead-worker sweep."""
WORKER_TTL_S = 3.0
"""Expiry of a worker's announcement: a worker silent this long is dead."""
STOP_DRAIN_S = 20.0
"""At a worker's stop, the longest wait for the prompt batch being run to be answered (a batch of 64 prompts takes
about 10 s on a 2-core CPU; past this its requests are given back for another worker)."""
REPLY_TTL_S = 60
"""Expiry of an unread reply list."""
WORKERS_MAX_AGE_S = 0.5
"""How long an API process reuses the list of live workers it read."""


def _announcement(value: bytes | str | None) -> dict[str, Any] | None:
    """A worker's announcement read from the registry; ``None`` for an empty or unreadable one (logged)."""
    if not value:
        return None
    try:
        found = json.loads(value)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        log.warning("skipped an unreadable worker announcement in the registry (%d bytes)", len(value))
        return None
    return found


def _worker_key(serving_key: str, worker_id: str) -> str:
    return f"fa:worker:{serving_key}:{worker_id}"


def _queue_key(serving_key: str) -> str:
    return f"fa:prompts:{serving_key}"


def _inflight_key(serving_key: str, worker_id: str) -> str:
    return f"fa:inflight:{serving_key}:{worker_id}"


class RedisPromptSketcher:
    """:class:`atlas.ports.PromptSketcher` of an API process without a model (see the module docstring).

    Parameters
    ----------
    redis_url : str
    timeout_s : float
        Longest wait for a reply before 503.
    max_pending : int
        Requests waiting in a model's list beyond which calls answer 429.
    """

    def __init__(self, redis_url: str, *, timeout_s: float = 10.0, max_pending: int = 1024) -> None:
        import redis

        self.redis_url = redis_url
        # the registry read of the request path (a few keys): 2 s per try bounds a hung Redis's 503 to ~8 s
        self.sync = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2, **redis_retry())
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self.client_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.reply_key = f"fa:reply:{self.client_id}"
        self._waiting: dict[str, tuple[asyncio.Future[list[SketchState]], SpaceKey]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._aredis: Any = None
        self._served: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self.clock = SharedClock()
        self.sent = 0

    # -- workers -----------------------------------------------------------------------------------

    def workers(self, serving_key: str, *, max_age_s: float = WORKERS_MAX_AGE_S) -> list[dict[str, Any]]:
        """Live workers announcing ``serving_key`` (cached for ``max_age_s``)."""
        now = time.monotonic()
        hit = self._served.get(serving_key)
        if hit is not None and now - hit[0] < max_age_s:
            return hit[1]
        try:
            keys = list(self.sync.scan_iter(match=_worker_key(serving_key, "*"), count=100))
            values = self.sync.mget(keys) if keys else []
        except Exception as exc:
            raise ModelUnavailable(f"the worker registry (Redis) is unreachable: {type(exc).__name__}",
                                   retry_after_s=1.0) from exc
        found = [w for w in map(_announcement, values) if w is not None]
        self._served[serving_key] = (now, found)
        return found

    def check_served(self, space: SpaceKey, found: list[dict[str, Any]] | None = None) -> None:
        """Raise ``ModelUnavailable`` (503) at once unless a live worker serves the space's model (``found``: the
        workers just read, else :meth:`workers`)."""
        if not (self.workers(space.serving_key) if found is None else found):
            raise ModelUnavailable(
                f"no worker serves model {space.model_name!r} for space {space.space_id}; start one with "
                f"FISHER_ATLAS_MODEL={space.model_name} fisher-atlas worker",
                {"space_id": space.space_id, "model": space.model_name},
            )

    def _unreachable(self, space: SpaceKey, exc: Exception) -> ModelUnavailable:
        """The 503 for a Redis failure on the request path; forgets the cached worker list so the next request
        checks the registry again."""
        self._served.pop(space.serving_key, None)
        return ModelUnavailable(f"the prompt queue (Redis) is unreachable: {type(exc).__name__}",
                                {"space_id": space.space_id, "model": space.model_name}, retry_after_s=1.0)

    # -- requests ----------------------------------------------------------------------------------

    async def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            import redis.asyncio as aredis

            self._aredis = aredis.Redis.from_url(self.redis_url, socket_connect_timeout=2, **redis_retry(aio=True))
            self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        """Pop this process's replies and resolve the waiting futures; fail waiters of dead models.

        Ends once cancelled, also when the Redis client absorbed the cancellation mid-command (it was then
        re-entered for good, and an event loop closing waited on it forever).
        """
        last_check = time.monotonic()
        outage = OutageLog(log, "reading prompt replies")
        me = asyncio.current_task()
        while me is None or not me.cancelling():
            try:
                item = await self._aredis.blpop([self.reply_key], timeout=1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                outage.failed(exc)
                await asyncio.sleep(0.5)
                continue
            outage.ok()
            try:  # nothing a reply or the registry holds may end the listener: every later reply waits on it
                if item is not None:
                    self._resolve(item[1])
                if time.monotonic() - last_check >= 1.0:
                    last_check = time.monotonic()
                    await asyncio.to_thread(self._fail_orphans)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("prompt replies: an unexpected error (the listener goes on)")

    def _resolve(self, data: bytes) -> None:
        """Resolve the future a reply answers; a reply that names no waiting request is dropped (logged when it is
        unreadable), and one that cannot be decoded fails its own request only (503)."""
        try:
            head = json.loads(data.partition(b"\n")[0])
        except ValueError:
            head = None
        rid = head.get("id") if isinstance(head, dict) else None
        if not isinstance(rid, str):
            log.warning("dropped a prompt reply without a readable header (%d bytes)", len(data))
            return
        entry = self._waiting.pop(rid, None)
        if entry is None or entry[0].done():
            return
        fut, space = entry
        try:
            _, result = decode_reply(data, SketchSpec.from_dict(space.spec))
        except Exception as exc:  # a worker of another version, or a corrupt message
            log.warning("a malformed prompt reply for model %r: %s: %s", space.model_name, type(exc).__name__, exc)
            result = ModelUnavailable(f"a worker of model {space.model_name!r} sent a malformed reply "
                                      f"({type(exc).__name__}); retry", {"space_id": space.space_id,
                                                                         "model": space.model_name},
                                      retry_after_s=1.0)
        if isinstance(result, AtlasError):
            fut.set_exception(result)
        else:
            fut.set_result(result)

    def _fail_orphans(self) -> None:
        """Fail waiting requests whose model lost its last worker (503 instead of the full timeout); the registry is
        read once per model and pass, not once per waiting request."""
        alive_by_key: dict[str, bool] = {}
        for rid, (fut, space) in list(self._waiting.items()):
            key = space.serving_key
            if key not in alive_by_key:
                try:
                    alive_by_key[key] = bool(self.workers(key, max_age_s=0.0))
                except ModelUnavailable:
                    alive_by_key[key] = False
            if not alive_by_key[key] and not fut.done():
                self._waiting.pop(rid, None)
                fut.get_loop().call_soon_threadsafe(_set_exception, fut, ModelUnavailable(
                    f"the last worker of model {space.model_name!r} stopped while the request waited",
                    {"space_id": space.space_id, "model": space.model_name}))

    async def sketch(self, space: SpaceKey, prompts: Sequence[str]) -> list[SketchState]:
        """Send the prompts to the model's workers and await their states (see the module docstring).

        Every step (the worker registry, the queue, the reply) counts against one ``timeout_s``; Redis is read
        off the event loop or with asyncio calls, so a silent Redis stalls neither this caller past
        ``timeout_s`` nor the other requests of the process.

        Raises
        ------
        ModelUnavailable
            No live worker serves the space's model, Redis fails, or no answer came within ``timeout_s``.
        QueueFull
            ``max_pending`` requests already wait for the model.
        """
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._sketch(space, prompts, time.monotonic() + self.timeout_s)
        except TimeoutError:
            raise ModelUnavailable(
                f"no answer from the workers of model {space.model_name!r} within {self.timeout_s:.0f} s",
                {"space_id": space.space_id, "model": space.model_name}, retry_after_s=1.0,
            ) from None

    async def _live_workers(self, space: SpaceKey) -> list[dict[str, Any]]:
        """The space's live workers: the cached list, else read in a thread (the sync client blocks)."""
        hit = self._served.get(space.serving_key)
        if hit is not None and time.monotonic() - hit[0] < WORKERS_MAX_AGE_S:
            return hit[1]
        return await asyncio.to_thread(self.workers, space.serving_key)

    async def _sketch(self, space: SpaceKey, prompts: Sequence[str], ends_at: float) -> list[SketchState]:
        """:meth:`sketch` without its time bound (``ends_at``: its end on the monotonic clock)."""
        found = await self._live_workers(space)
        self.check_served(space, found)
        queue = _queue_key(space.serving_key)
        try:
            await self._ensure_listener()
            if self.clock.stale():
                sent_at = self.clock.local()
                self.clock.update(await self._aredis.time(), sent_at, self.clock.local())
            depth = int(await self._aredis.llen(queue))
        except Exception as exc:  # the workers were seen < 0.5 s ago, but Redis fails now: 503, re-checked next time
            raise self._unreachable(space, exc) from exc
        if depth >= self.max_pending:
            rate = sum(float(w.get("prompts_per_s", 0.0)) for w in found)
            wait = depth / rate if rate > 0 else 1.0
            raise QueueFull(f"{depth} requests wait for model {space.model_name!r}; retry in {wait:.1f} s",
                            {"pending": depth}, retry_after_s=wait)
        rid = uuid.uuid4().hex
        fut: asyncio.Future[list[SketchState]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (fut, space)
        deadline = self.clock.now() + max(0.0, ends_at - time.monotonic())  # the worker skips it past this
        msg = {"id": rid, "reply": self.reply_key, "prompts": list(prompts), "deadline": deadline}
        try:
            try:
                await self._aredis.rpush(queue, json.dumps(msg))
            except Exception as exc:
                raise self._unreachable(space, exc) from exc
            self.sent += 1
            return await fut
        finally:
            self._waiting.pop(rid, None)

    def stats(self) -> dict[str, Any]:
        """Requests sent and waiting."""
        return {"mode": "redis", "sent": self.sent, "waiting": len(self._waiting)}

    def close(self) -> None:
        """Stop the reply listener and close the connections."""
        if self._listener is not None:
            self._listener.cancel()
        self.sync.close()


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class PromptServer:
    """Worker side: announces (model, spec) and serves its request list through a ``PromptBatcher``.

    Parameters
    ----------
    redis_url : str
    batcher : workers.prompt_batcher.PromptBatcher
        The worker's model (the same one its jobs use).
    space : SpaceKey
        The space this worker computes in.
    worker_id : str, optional
    """

    def __init__(self, redis_url: str, batcher: Any, space: SpaceKey, worker_id: str | None = None) -> None:
        import redis

        self.redis = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=2, **redis_retry())
        self.batcher = batcher
        self.space = space
        self.key = space.serving_key
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.inflight = _inflight_key(self.key, self.worker_id)
        self.clock = SharedClock()
        self._stop = threading.Event()  # the heartbeat's: the announcement is withdrawn
        self._stop_taking = threading.Event()  # the serving thread's: no request is taken
        self._threads: list[threading.Thread] = []

    def start(self) -> PromptServer:
        """Announce now (or, Redis not up yet, at the first heartbeat that reaches it), then serve and heartbeat
        on two daemon threads."""
        try:
            self._announce()
        except Exception as exc:  # a worker started before Redis waits for it, as Celery waits for its broker
            log.warning("announcing the prompt worker failed (%s); retrying every %.0f s", type(exc).__name__,
                        HEARTBEAT_S)
        for target, name in ((self._serve, "prompt-server"), (self._heartbeat, "prompt-heartbeat")):
            t = threading.Thread(target=target, name=f"fisher-atlas-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, drain_s: float = STOP_DRAIN_S) -> None:
        """Stop taking requests; give back the ones waiting for a batch (another worker answers them); answer the
        batch being run while still announced (its callers wait for it); then withdraw the announcement and give back
        what is left. It withdrew at once and then computed every request taken, for up to 35 s, for callers the API
        had already answered 503 (a lifecycle review, 2026-12-07)."""
        self._stop_taking.set()
        for t in self._threads[:1]:  # the serving thread
            t.join(timeout=5)
        given_back = self.batcher.cancel_waiting()
        if not self.batcher.wait_idle(drain_s):
            log.warning("the prompt batch being run did not end in %.0f s; its requests are given back", drain_s)
        if given_back:
            log.info("gave back %d prompt requests for another worker", given_back)
        self._stop.set()
        for t in self._threads[1:]:
            t.join(timeout=5)
        try:
            self.redis.delete(_worker_key(self.key, self.worker_id))
            while self.redis.lmove(self.inflight, _queue_key(self.key), "RIGHT", "LEFT"):
                pass
        except Exception:
            log.warning("withdrawing the prompt worker failed", exc_info=True)

    def _announce(self) -> None:
        if self.clock.stale():
            sent_at = self.clock.local()
            self.clock.update(self.redis.time(), sent_at, self.clock.local())  # type: ignore[arg-type]
        stats = self.batcher.stats()
        body = {"worker_id": self.worker_id, "model": self.space.model_name, "space_id": self.space.space_id,
                "prompts_per_s": stats.get("prompts_per_s", 0.0), "pending": stats.get("pending", 0)}
        self.redis.set(_worker_key(self.key, self.worker_id), json.dumps(body), px=int(WORKER_TTL_S * 1000))

    def _heartbeat(self) -> None:
        outage = OutageLog(log, "the prompt worker's heartbeat")
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._announce()
                self.requeue_dead()
                outage.ok()
            except Exception as exc:
                outage.failed(exc)

    def requeue_dead(self) -> int:
        """Move the in-flight requests of dead workers of this key back to the head of the list."""
        moved = 0
        prefix = f"fa:inflight:{self.key}:"
        for raw in self.redis.scan_iter(match=prefix + "*", count=100):
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            wid = name[len(prefix):]
            if wid == self.worker_id or self.redis.exists(_worker_key(self.key, wid)):
                continue
            while self.redis.lmove(name, _queue_key(self.key), "RIGHT", "LEFT"):
                moved += 1
        if moved:
            log.info("re-queued %d prompt requests of dead workers", moved)
        return moved

    def _serve(self) -> None:
        queue = _queue_key(self.key)
        outage = OutageLog(log, "taking prompt requests")
        while not self._stop_taking.is_set():
            try:
                raw = self.redis.blmove(queue, self.inflight, 1, "LEFT", "RIGHT")
            except Exception as exc:
                outage.failed(exc)
                time.sleep(0.5)
                continue
            outage.ok()
            if raw is None:
                continue
            data = raw if isinstance(raw, bytes) else str(raw).encode()
            try:
                self._handle(data)
            except Exception:  # this thread outlives any one request: the worker announces itself as serving
                log.exception("handling a prompt request failed; it stays in flight (re-queued if this worker dies)")
                time.sleep(0.1)

    def _drop(self, raw: bytes) -> None:
        """Remove a request from this worker's in-flight list without a reply."""
        self.redis.lrem(self.inflight, 1, raw)  # type: ignore[arg-type]  # redis accepts bytes

    def _handle(self, raw: bytes) -> None:
        """Serve one request taken from the list: reply with its states or its error, or leave it for later
        (the model's queue is full); a request that is not a readable request object is dropped."""
        try:
            msg = json.loads(raw)
            prompts, deadline = msg["prompts"], float(msg.get("deadline", 0))
            if not isinstance(msg["id"], str) or not isinstance(msg["reply"], str):
                raise TypeError("a request's id and reply list are strings")
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("dropped a malformed prompt request (%d bytes)", len(raw))
            self._drop(raw)
            return
        if deadline < self.clock.now():
            self._drop(raw)  # the caller gave up already
            log.info("dropped a prompt request its caller stopped waiting for %.1f s ago", self.clock.now() - deadline)
            return
        try:
            prepared = self.batcher.prepare(prompts)
            fut: Future[list[SketchState]] = self.batcher.submit(prepared)
        except QueueFull:  # a request that can never fit is PayloadTooLarge (413), answered below
            self.redis.lmove(self.inflight, _queue_key(self.key), "RIGHT", "LEFT")  # leave it for later
            time.sleep(0.01)
            return
        except AtlasError as exc:
            self._reply(raw, msg, encode_reply(msg["id"], error=exc))
            return
        except Exception as exc:  # the caller gets an error now, not a timeout
            log.exception("preparing prompts failed")
            self._reply(raw, msg, encode_reply(msg["id"], error=AtlasError(f"the worker failed: {type(exc).__name__}")))
            return
        fut.add_done_callback(lambda f: self._reply_done(raw, msg, f))

    def _reply_done(self, raw: bytes, msg: dict[str, Any], fut: Future[list[SketchState]]) -> None:
        if fut.cancelled():  # given back at stop: it stays in flight, and goes back to the queue
            return
        exc = fut.exception()
        if exc is None:
            data = encode_reply(msg["id"], fut.result())
        elif isinstance(exc, AtlasError):
            data = encode_reply(msg["id"], error=exc)
        else:
            data = encode_reply(msg["id"], error=AtlasError(f"the worker failed: {type(exc).__name__}"))
        self._reply(raw, msg, data)

    def _reply(self, raw: bytes, msg: dict[str, Any], data: bytes) -> None:
        try:
            pipe = self.redis.pipeline()
            pipe.rpush(msg["reply"], data)
            pipe.expire(msg["reply"], REPLY_TTL_S)
            pipe.lrem(self.inflight, 1, raw)  # type: ignore[arg-type]  # redis accepts bytes
            pipe.execute()
        except Exception:
            log.warning("sending a prompt reply failed", exc_info=True)
