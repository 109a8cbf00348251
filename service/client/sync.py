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
from typing import TYPE_CHECKING, Any

from service.client.aio import AsyncAtlasClient
from service.client.errors import ClientClosed
from service.schemas import JobOut

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable, Mapping, Sequence
    from typing import BinaryIO

    from service.client.calls import FileArg, ProgressCallback, SampleArg
    from service.schemas import (
        AlignMatrixResponse,
        AlignResponse,
        AtlasResponse,
        Health,
        ImportResult,
        JobList,
        Readiness,
        SourcesResponse,
        SpaceList,
        SpaceOut,
        TaskCreated,
        TaskList,
        TaskOut,
    )
    from service.schemas_keys import CurrentKey, KeyCreated, KeyList
    from service.schemas_routing import FitResponse, RouteResponse, RoutingInfo

_DONE = object()


class AtlasClient:
    """Typed client of the FisherAtlas REST API (blocking); the same methods and parameters as
    :class:`~service.client.AsyncAtlasClient` (``base_url``, ``api_key``, ``timeout``, ``retries``, ...).

    A progress callback (``on_progress`` of ``wait_job``, ``add_task`` and ``append``) runs on the client's event-loop
    thread: keep it short, and hand work for a GUI's thread over a queue.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float | None = None,
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

    if TYPE_CHECKING:  # the generated methods' types, for a type checker (tests/service/test_sync_client_types.py
        # holds them to the async client's signatures; at run time the loop at the end of this module makes them)
        def health(self) -> Health: ...
        def ready(self) -> Readiness: ...
        def add_task(self, name: str, file: FileArg = None, *, samples: Iterable[SampleArg] | None = None,
                     mode: str = "text", metadata: dict[str, Any] | None = None, space: str | int | None = None,
                     filename: str | None = None, wait: bool = False, on_progress: ProgressCallback | None = None,
                     wait_timeout: float | None = None, idempotency_key: str | None = None) -> TaskCreated: ...
        def append(self, task_id: int, file: FileArg = None, *, samples: Iterable[SampleArg] | None = None,
                   filename: str | None = None, wait: bool = False, on_progress: ProgressCallback | None = None,
                   wait_timeout: float | None = None, idempotency_key: str | None = None) -> JobOut: ...
        def get_task(self, task_id: int) -> TaskOut: ...
        def list_tasks(self, *, space: str | int | None = None, name: str | None = None, name_prefix: str | None = None,
                       status: str | None = None, offset: int = 0, limit: int = 50,
                       ids: Sequence[int] | None = None) -> TaskList: ...
        def find_task(self, name_or_id: str | int, *, space: str | int | None = None) -> TaskOut: ...
        def patch_task(self, task_id: int, metadata: dict[str, Any] | None = None, *, name: str | None = None
                       ) -> TaskOut: ...
        def delete_task(self, task_id: int) -> None: ...
        def get_job(self, job_id: int) -> JobOut: ...
        def list_jobs(self, *, task_id: int | None = None, status: str | None = None, space: str | int | None = None,
                      offset: int = 0, limit: int = 50) -> JobList: ...
        def cancel_job(self, job_id: int) -> JobOut: ...
        def wait_job(self, job_id: int, *, on_progress: ProgressCallback | None = None, timeout: float | None = None,
                     poll_interval: float = 0.5) -> JobOut: ...
        def route(self, prompt: str | Sequence[str], *, k: int = 5, threshold: float | None = None,
                  candidates: int | None = None, space: str | int | None = None) -> RouteResponse: ...
        def fit(self, examples: Sequence[tuple[str, str | int] | Mapping[str, Any]], *, space: str | int | None = None,
                dry_run: bool = False) -> FitResponse: ...
        def routing(self, task_id: int) -> RoutingInfo: ...
        def set_threshold(self, task_id: int, threshold: float | None) -> RoutingInfo: ...
        def patch_routing(self, task_id: int, **fields: Any) -> RoutingInfo: ...
        def set_false_reject_rate(self, task_id: int, rate: float) -> RoutingInfo: ...
        def set_template_test(self, task_id: int, enabled: bool) -> RoutingInfo: ...
        def set_novelty_test(self, task_id: int, enabled: bool) -> RoutingInfo: ...
        def sources(self, task_id: int, *, k: int = 5, candidates: int | None = None) -> SourcesResponse: ...
        def align(self, a: int, b: int) -> AlignResponse: ...
        def align_matrix(self, task_ids: Sequence[int]) -> AlignMatrixResponse: ...
        def atlas(self, *, space: str | int | None = None) -> AtlasResponse: ...
        def spaces(self) -> SpaceList: ...
        def get_space(self, space: str | int = "default") -> SpaceOut: ...
        def export_space(self, space: str | int | None = None, out: str | os.PathLike[str] | None = None) -> bytes: ...
        def download_export(self, out: str | os.PathLike[str] | BinaryIO, space: str | int | None = None) -> int: ...
        def import_space(self, file: str | os.PathLike[str] | bytes | BinaryIO, *,
                         on_conflict: str = "fail") -> ImportResult: ...
        def current_key(self) -> CurrentKey: ...
        def create_key(self, name: str, scopes: Sequence[str] | str = ("read",)) -> KeyCreated: ...
        def list_keys(self, *, include_revoked: bool = False) -> KeyList: ...
        def revoke_key(self, key_id: int) -> None: ...


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


async def _make(base_url: str | None, api_key: str | None, timeout: float | None, retries: int,
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
