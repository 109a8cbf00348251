"""The client's retry policy (tenacity): which failures a call is sent again on, and how long it waits between."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from service.client.calls import Call
from service.client.errors import RateLimited, Unavailable, Unreachable


def retryable(exc: BaseException) -> bool:
    """A failed connection, a 429, or a 503 / 502 / 504 (``Unavailable`` and its ``BadGateway``)."""
    return isinstance(exc, Unreachable | RateLimited | Unavailable)


def wait_for(retry_state: Any) -> float:
    """The answer's ``Retry-After`` (at most 30 s), else an exponential backoff from 0.2 s up to 5 s."""
    exc = retry_state.outcome.exception() if retry_state.outcome else None
    backoff = wait_exponential(multiplier=0.2, max=5.0)(retry_state)
    retry_after = getattr(exc, "retry_after", None)
    return min(float(retry_after), 30.0) if retry_after else backoff


async def send_with_retries(once: Callable[[Call[Any]], Awaitable[Any]], call: Call[Any], retries: int) -> Any:
    """``once(call)``, sent again up to ``retries`` attempts in all when the call is safe to repeat
    (:attr:`Call.idempotent`) and it failed in a :func:`retryable` way."""
    if not call.idempotent or retries == 1:
        return await once(call)
    async for attempt in AsyncRetrying(stop=stop_after_attempt(retries), wait=wait_for,
                                       retry=retry_if_exception(retryable), reraise=True):
        with attempt:
            return await once(call)
    raise AssertionError("unreachable")  # pragma: no cover
