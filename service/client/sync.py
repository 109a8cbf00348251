"""The synchronous client: :class:`AsyncAtlasClient`'s coroutines run on a private event loop.

Every public coroutine method of the async client becomes a blocking method here with the same name,
signature and docstring (generated below, so the two cannot drift); ``job_events`` becomes a plain
iterator. The loop lives in a thread of an anyio blocking portal, started with the client and stopped
by :meth:`AtlasClient.close`.
"""

from __future__ import annotations

import functools
import inspect
import queue
from collections.abc import Callable, Iterator
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from service.client.aio import AsyncAtlasClient
from service.schemas import JobOut

_DONE = object()


class AtlasClient:
    """Typed client of the FisherAtlas REST API (blocking); the same methods and parameters as
    :class:`~service.client.AsyncAtlasClient` (``base_url``, ``api_key``, ``timeout``, ``retries``, ...).
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 retries: int = 3, **kwargs: Any) -> None:
        self._portal_cm = start_blocking_portal()
        self._portal: BlockingPortal = self._portal_cm.__enter__()
        try:
            self._async: AsyncAtlasClient = self._portal.call(
                functools.partial(_make, base_url, api_key, timeout, retries, kwargs))
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        self.base_url = self._async.base_url
        self.api_key = self._async.api_key

    def __enter__(self) -> AtlasClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool and stop the event-loop thread."""
        if self._portal_cm is None:
            return
        try:
            self._portal.call(self._async.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)
            self._portal_cm = None  # type: ignore[assignment]

    def job_events(self, job_id: int) -> Iterator[JobOut]:
        """The job's server-sent ``progress`` events until it ends (see the async client)."""
        items: queue.Queue[Any] = queue.Queue()

        async def pump() -> None:
            try:
                async for job in self._async.job_events(job_id):
                    items.put(job)
            except BaseException as exc:  # delivered to the caller's thread
                items.put(exc)
            finally:
                items.put(_DONE)

        self._portal.start_task_soon(pump)
        while (item := items.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item

    def __getattr__(self, name: str) -> Any:  # typing aid only: real methods are generated below
        raise AttributeError(name)


async def _make(base_url: str | None, api_key: str | None, timeout: float, retries: int,
                kwargs: dict[str, Any]) -> AsyncAtlasClient:
    return AsyncAtlasClient(base_url, api_key, timeout, retries, **kwargs)


def _blocking(name: str, coro_fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(coro_fn)
    def method(self: AtlasClient, *args: Any, **kwargs: Any) -> Any:
        return self._portal.call(functools.partial(getattr(self._async, name), *args, **kwargs))

    return method


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """Public methods of a client class (what both clients must share)."""
    return {n: f for n, f in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


for _name, _fn in public_methods(AsyncAtlasClient).items():
    if _name in ("aclose", "job_events"):
        continue
    if inspect.iscoroutinefunction(_fn):
        setattr(AtlasClient, _name, _blocking(_name, _fn))
