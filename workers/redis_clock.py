"""Wall-clock time read on Redis's clock: the one clock every API process and worker of a deployment share.

A prompt request carries the time past which its caller no longer waits; the worker drops it unserved after that.
Written and read on each host's own clock, a worker whose clock ran ahead of the API's by more than the prompt
timeout dropped every request — silently, the API answering 503 after ``prompt_timeout_s`` — and one behind it
sketched prompts nobody waited for. :class:`SharedClock` keeps the offset of this host's clock from the Redis
server's (``TIME``), measured at most every :data:`REFRESH_S`, so both sides compare deadlines on one clock.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

REFRESH_S = 30.0
"""How often the offset is measured again (one ``TIME`` round trip)."""
SKEW_WARN_S = 1.0
"""An offset larger than this is logged once: deadlines are still right, but the host's clock is off."""


class SharedClock:
    """This host's wall clock corrected to the Redis server's.

    Parameters
    ----------
    local : callable, optional
        The host's wall clock in seconds since the epoch (default :func:`time.time`).
    """

    def __init__(self, local: Callable[[], float] = time.time) -> None:
        self.local = local
        self.offset = 0.0
        """Redis's clock minus this host's, in seconds (0 until measured)."""
        self._measured_at = -math.inf
        self._warned = False

    def stale(self) -> bool:
        """Whether the offset is due to be measured (never measured, or :data:`REFRESH_S` ago)."""
        return time.monotonic() - self._measured_at >= REFRESH_S

    def update(self, redis_time: Sequence[int | float], sent_at: float, received_at: float) -> None:
        """Set the offset from a ``TIME`` answer.

        Parameters
        ----------
        redis_time : (seconds, microseconds)
            The answer of Redis's ``TIME``.
        sent_at, received_at : float
            This host's clock (:attr:`local`) when the command was sent and its answer came: the server read its
            clock about halfway between.
        """
        server = float(redis_time[0]) + float(redis_time[1]) / 1e6
        self.offset = server - (sent_at + received_at) / 2
        self._measured_at = time.monotonic()
        if abs(self.offset) > SKEW_WARN_S and not self._warned:
            self._warned = True
            log.warning("this host's clock is %.1f s %s Redis's; prompt deadlines use Redis's clock", abs(self.offset),
                        "behind" if self.offset > 0 else "ahead of")

    def now(self) -> float:
        """The time on Redis's clock, in seconds since the epoch."""
        return self.local() + self.offset
