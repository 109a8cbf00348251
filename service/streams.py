"""Caps on long-lived responses: how many progress streams (``GET /v1/jobs/{id}/events``) may be open at once.

Each open stream reads its job row every half second on the thread pool; without a cap a client (or many) could
hold enough streams open to starve every other request. :class:`StreamSlots` counts the open streams per
client (an API key, or the client address when anonymous) and in total; :class:`SlotReleasingResponse` gives a
slot back when its response ends — the stream finished, failed, or the client went away.
"""

from __future__ import annotations

import threading
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from atlas.errors import QueueFull

RETRY_AFTER_S = 5.0
"""``Retry-After`` of a refused stream: about how long a client should wait for another stream to end."""


class StreamSlots:
    """Counters of open streams, per client and in total (thread-safe).

    Parameters
    ----------
    per_client : int
        Most streams one client holds open at once.
    total : int
        Most streams open at once, all clients together.
    """

    def __init__(self, per_client: int, total: int) -> None:
        self.per_client = int(per_client)
        self.total = int(total)
        self._open: dict[str, int] = {}
        self._count = 0
        self._lock = threading.Lock()

    @property
    def open(self) -> int:
        """How many streams are open now."""
        with self._lock:
            return self._count

    def acquire(self, client: str) -> None:
        """Take a slot for ``client``.

        Raises
        ------
        QueueFull
            ``client`` holds ``per_client`` streams already, or ``total`` are open (429 with ``Retry-After``).
        """
        with self._lock:
            mine = self._open.get(client, 0)
            if mine >= self.per_client:
                raise QueueFull(
                    f"too many open progress streams for this client ({mine} of {self.per_client}, setting "
                    "max_event_streams_per_client); close one or retry later",
                    {"open_streams": mine, "max_event_streams_per_client": self.per_client},
                    retry_after_s=RETRY_AFTER_S)
            if self._count >= self.total:
                raise QueueFull(
                    f"too many open progress streams on this service ({self._count} of {self.total}, setting "
                    "max_event_streams); retry later",
                    {"open_streams": self._count, "max_event_streams": self.total}, retry_after_s=RETRY_AFTER_S)
            self._open[client] = mine + 1
            self._count += 1

    def release(self, client: str) -> None:
        """Give back a slot of ``client`` (taken by :meth:`acquire`)."""
        with self._lock:
            left = self._open.get(client, 0) - 1
            if left > 0:
                self._open[client] = left
            else:
                self._open.pop(client, None)
            self._count = max(0, self._count - 1)


def stream_client(principal: Any, scope: Scope) -> str:
    """Whom a stream is counted against: the principal's key, else the client address."""
    key_id = getattr(principal, "key_id", None)
    if key_id is not None:
        return f"key:{key_id}"
    client = scope.get("client") or ("?",)
    return f"addr:{client[0]}"


class SlotReleasingResponse(EventSourceResponse):
    """An :class:`~sse_starlette.EventSourceResponse` holding a slot of :class:`StreamSlots`, given back once
    the response ends however it ends (its events ran out, an error, the client disconnected, shutdown).

    Parameters
    ----------
    slots : StreamSlots
    client : str
        The client the slot was acquired for (:meth:`StreamSlots.acquire` was called already).
    *args, **kwargs
        Passed to :class:`~sse_starlette.EventSourceResponse`.
    """

    def __init__(self, slots: StreamSlots, client: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = slots
        self._client = client
        self._released = False

    def release(self) -> None:
        """Give the slot back (once)."""
        if not self._released:
            self._released = True
            self._slots.release(self._client)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()
