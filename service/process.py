"""The serving processes' signals: a stop asked by SIGTERM, SIGINT or SIGHUP is a clean stop, bounded in time, from
the process's first line on.

A lifecycle review (2026-12-07) found that ``serve`` released its running job only after every open request had
finished, with no bound (117 s: past any orchestrator's grace period, so SIGKILL, and the job lost an attempt); that
a SIGTERM during a model's load waited for the load, then started the job runner; that SIGHUP killed the process with
no stop at all; and that a process started as PID 1 (a container without an init) ignored SIGTERM until its handlers
were installed, after its model's load.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger("fisher_atlas.service")

def exit_on_stop_signals() -> None:
    """Until a process installs its own handlers, SIGTERM and SIGHUP end it (exit status 128 + the signal) through
    ``SystemExit``: finally blocks run, a migration's transaction is rolled back. As PID 1 a process with no handler
    ignores SIGTERM (the kernel's rule), and the model's load came before any handler."""

    def leave(sig: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + sig)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, leave)


class AtlasServer(uvicorn.Server):
    """uvicorn's server with the service's stop: at the first SIGTERM (SIGINT, SIGHUP) the container's job runner is
    told to release its running job at once (:meth:`service.container.Container.begin_stop`) while open requests get
    ``shutdown_grace_s`` (uvicorn's ``timeout_graceful_shutdown``) to finish; during startup, while no job can run
    yet, the process exits at once with 128 + the signal."""

    def __init__(self, config: uvicorn.Config, container: Any) -> None:
        super().__init__(config)
        self.container = container

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGHUP:
            sig = signal.SIGTERM
        if not self.should_exit and self.container.begin_stop():
            log.warning("stopped by %s while starting (no job runs yet): exiting now", signal.Signals(sig).name)
            logging.shutdown()  # its lines written out
            os._exit(128 + sig)
        super().handle_exit(sig, frame)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = signal.signal(signal.SIGHUP, self.handle_exit)
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(signal.SIGHUP, previous)
