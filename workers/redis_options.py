"""Options of this package's Redis clients (the prompt service's requests, replies and worker registry)."""

from __future__ import annotations

import logging
import time
from typing import Any


def redis_retry(*, aio: bool = False) -> dict[str, Any]:
    """Client options that retry a command on a dropped connection (redis-py's ``Retry``: 3 tries, 50–500 ms
    backoff): after a Redis restart a pooled connection is stale, and its first command failed (a 503) although
    Redis was back."""
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if aio:
        from redis.asyncio.retry import Retry as AsyncRetry

        retry: Any = AsyncRetry(ExponentialBackoff(cap=0.5, base=0.05), 3)
    else:
        from redis.retry import Retry

        retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 3)
    return {"retry": retry, "retry_on_error": [RedisConnectionError, RedisTimeoutError]}


class OutageLog:
    """Logs a loop's outage (Redis, the database, a disk) once when it starts (with its traceback) and once when it
    ends, instead of a traceback per retry (every 0.5–1 s for as long as it lasts).

    Parameters
    ----------
    logger : logging.Logger
    what : str
        What fails, e.g. ``"reading prompt replies"``.
    """

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger, self.what = logger, what
        self.since: float | None = None

    def failed(self, exc: BaseException) -> None:
        """Call in the loop's ``except``."""
        if self.since is None:
            self.since = time.monotonic()
            self.logger.warning("%s failed; retrying until it works", self.what, exc_info=exc)
        else:
            self.logger.debug("%s still fails: %s", self.what, type(exc).__name__)

    def ok(self) -> None:
        """Call after a success."""
        if self.since is not None:
            self.logger.warning("%s works again after %.1f s", self.what, time.monotonic() - self.since)
            self.since = None
