"""A cap on uploads handled at once: task adds, appends and space imports, and the reading and parsing of any other
JSON body over 1 MiB or of undeclared length (a 64 MB route or ``fit`` body is parsed in memory as an upload is).

Reading and parsing an upload holds it in memory several times over — 2–4 bytes per byte of JSONL, CSV or
text, about 17 per decoded byte of Parquet (bench/results/upload_memory.md) —
and the body limit bounds one request, not how many arrive together: twenty 64 MB Parquet uploads at once
would need ~20 GB. :class:`UploadSlots` lets ``max_concurrent_uploads`` of them run in this process; the next
one waits for a slot (its body stays unread in the connection) up to ``upload_slot_wait_s``, then is refused
with 503 and ``Retry-After`` — nothing stored. A slot is held from before the body is read until the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from atlas.errors import AtlasError

RETRY_AFTER_S = 5.0
"""``Retry-After`` of a refused upload: about how long another upload takes to be parsed and stored."""


class UploadsBusy(AtlasError):
    """Every upload slot stayed taken for the whole wait; nothing was read or stored (503)."""

    status_code = 503
    code = "uploads_busy"
    retry_after_s = RETRY_AFTER_S


class UploadSlots:
    """How many uploads this process reads, parses and stores at once.

    Parameters
    ----------
    total : int
        Uploads handled at once (setting ``max_concurrent_uploads``).
    wait_s : float
        Longest wait for a slot before :class:`UploadsBusy` (setting ``upload_slot_wait_s``).

    Notes
    -----
    The semaphore is created on first use, inside the running event loop (an app's lifespan may run on a loop
    other than the one it was built on).
    """

    def __init__(self, total: int, wait_s: float) -> None:
        self.total = int(total)
        self.wait_s = float(wait_s)
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held = 0

    @property
    def held(self) -> int:
        """Slots taken now."""
        return self._held

    def _semaphore_here(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._loop is not loop:
            self._semaphore, self._loop, self._held = asyncio.Semaphore(self.total), loop, 0
        return self._semaphore

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold a slot for the body of the ``async with``.

        Raises
        ------
        UploadsBusy
            No slot was free within :attr:`wait_s` (503 with ``Retry-After``).
        """
        semaphore = self._semaphore_here()
        try:
            if semaphore.locked():  # taken, or others wait before this one: wait in line, at most wait_s
                await asyncio.wait_for(semaphore.acquire(), timeout=self.wait_s)
            else:  # a free slot is taken at once (wait_for with a timeout of 0 would give up before trying)
                await semaphore.acquire()
        except TimeoutError:
            raise UploadsBusy(
                f"{self.total} uploads or other large request bodies are being read already (setting "
                f"max_concurrent_uploads) and none "
                f"ended within {self.wait_s:g} s; nothing was stored: retry later",
                {"max_concurrent_uploads": self.total, "waited_s": self.wait_s},
            ) from None
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            semaphore.release()
