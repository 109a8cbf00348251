"""The synchronous client: :class:`AsyncAtlasClient`'s coroutines run on a private event loop.

Every public coroutine method of the async client becomes a blocking method here with the same name,
signature and docstring (generated below, so the two cannot drift); ``job_events`` becomes a plain
iterator. The loop runs in a daemon thread, started with the client and stopped by :meth:`AtlasClient.close` (or
when the client is garbage-collected): a script that never closes its client still exits — an anyio blocking
portal's worker thread kept such a process alive for good.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from service.client.aio import AsyncAtlasClient
from service.client.errors import ClientClosed
from service.schemas import JobOut

_DONE = object()


class AtlasClient:
    """Typed client of the FisherAtlas REST API (blocking); the same methods and parameters as
    :class:`~service.client.AsyncAtlasClient` (``base_url``, ``api_key``, ``timeout``, ``retries``, ...).

    A progress callback (``on_progress`` of ``wait_job``, ``add_task`` and ``append``) runs on the client's event-loop
    thread: keep it short, and hand work for a GUI's thread over a queue.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 retries: int = 3, **kwargs: Any) -> None:
        self._loop: asyncio.AbstractEventLoop | None = asyncio.new_event_loop()
        thread = threading.Thread(target=self._loop.run_forever, name="fisher-atlas-client", daemon=True)
        thread.start()
        self._thread = thread
        self._stop = weakref.finalize(self, _stop_loop, self._loop, thread)  # at close, collection or exit
        try:
            self._async: AsyncAtlasClient = self._call(_make(base_url, api_key, timeout, retries, kwargs))
        except BaseException:
            self._stop()
            raise
        self.base_url = self._async.base_url
        self.api_key = self._async.api_key

    def __enter__(self) -> AtlasClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the client's loop and wait for it (:class:`ClientClosed` once closed)."""
        loop = self._loop
        if loop is None or not self._stop.alive:
            coro.close()
            raise _closed()
        if threading.current_thread() is self._thread:  # it would wait on itself for good
            coro.close()
            raise _on_loop_thread()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:  # close() from another thread cancelled it
            raise _closed() from None
        except KeyboardInterrupt:  # Ctrl-C in a notebook: the call stops too (it went on, calling back)
            future.cancel()
            raise

    def close(self) -> None:
        """Close the connection pool and stop the event-loop thread (again: nothing)."""
        if self._loop is None:
            return
        if threading.current_thread() is self._thread:  # stopping the loop from a callback hung its caller
            raise _on_loop_thread()
        try:
            self._call(self._async.aclose())
        finally:
            self._stop()
            self._loop = None

    def job_events(self, job_id: int) -> Iterator[JobOut]:
        """The job's server-sent ``progress`` events until it ends (see the async client); leaving the loop early
        (``break``, an exception, the iterator collected) closes the stream — it stayed open, holding one of the
        service's progress-stream slots, until the job ended."""
        if self._loop is None:
            raise _closed()
        if threading.current_thread() is self._thread:  # the pump would wait on the thread that runs it
            raise _on_loop_thread()
        items: queue.Queue[Any] = queue.Queue()

        async def pump() -> None:
            try:
                async for job in self._async.job_events(job_id):
                    items.put(job)
            except BaseException as exc:  # delivered to the caller's thread
                items.put(exc)
            finally:
                items.put(_DONE)

        pumping = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while (item := items.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            pumping.cancel()

    def __getattr__(self, name: str) -> Any:  # typing aid only: real methods are generated below
        raise AttributeError(name)


def _closed() -> ClientClosed:
    return ClientClosed(0, "client_closed", "the client is closed (close() or its with block); make a new one")


def _on_loop_thread() -> RuntimeError:
    return RuntimeError("a progress callback runs on the client's event-loop thread and cannot call the client; use "
                        "the job it is given, or hand the work to another thread")


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel the calls still running on the client's loop (their callers get :class:`ClientClosed`: a ``wait_job``
    in another thread waited forever once the loop stopped), then stop the loop and its thread (a finalizer: it must
    not hold the client)."""
    if loop.is_closed():
        return
    if thread is not threading.current_thread() and loop.is_running():
        with contextlib.suppress(concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError):
            asyncio.run_coroutine_threadsafe(_cancel_running(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():
        thread.join(timeout=5)
    if not loop.is_running():
        loop.close()


async def _cancel_running() -> None:
    """Cancel every other task of the running loop and let them finish."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


async def _make(base_url: str | None, api_key: str | None, timeout: float, retries: int,
                kwargs: dict[str, Any]) -> AsyncAtlasClient:
    return AsyncAtlasClient(base_url, api_key, timeout, retries, **kwargs)


def _blocking(name: str, coro_fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(coro_fn)
    def method(self: AtlasClient, *args: Any, **kwargs: Any) -> Any:
        return self._call(getattr(self._async, name)(*args, **kwargs))

    return method


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """Public methods of a client class (what both clients must share)."""
    return {n: f for n, f in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


for _name, _fn in public_methods(AsyncAtlasClient).items():
    if _name in ("aclose", "job_events"):
        continue
    if inspect.iscoroutinefunction(_fn):
        setattr(AtlasClient, _name, _blocking(_name, _fn))
