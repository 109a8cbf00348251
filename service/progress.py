"""A dependency-free progress bar for jobs on stderr (used by ``fisher-atlas add --wait``)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from service.schemas import JobOut


class JobProgressBar:
    """Render job progress as ``[#####-----]  20/40 samples  911 tokens  412 tok/s  running``.

    On a terminal the line is redrawn in place; otherwise a line is written when the status changes
    or at most every ``interval`` seconds, so logs stay readable.

    Parameters
    ----------
    label
        Shown before the bar (e.g. the task name).
    stream
        Where to write (default ``sys.stderr``).
    width
        Bar width in characters.
    interval
        Minimum seconds between lines when ``stream`` is not a terminal.
    """

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30, interval: float = 2.0) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.interval = interval
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_status: str | None = None
        self._last_line_at = 0.0
        self._drawn = False

    def render(self, job: JobOut) -> str:
        """The text of the bar for ``job``."""
        p = job.progress
        total = max(p.samples_total, 0)
        done = min(p.samples_done, total) if total else p.samples_done
        frac = (done / total) if total else (1.0 if job.status == "succeeded" else 0.0)
        filled = round(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        rate = f"{p.tokens_per_s:,.0f} tok/s" if p.tokens_per_s else "- tok/s"
        return f"{self.label} [{bar}] {done}/{total} samples  {p.tokens:,} tokens  {rate}  {job.status}"

    def __call__(self, job: JobOut) -> None:
        """Update with the latest job state (usable as an ``on_progress`` callback)."""
        line = self.render(job)
        now = time.monotonic()
        if self._tty:
            self.stream.write("\r\x1b[2K" + line)
            self._drawn = True
        elif job.status != self._last_status or now - self._last_line_at >= self.interval or job.done:
            self.stream.write(line + "\n")
            self._last_line_at = now
        self._last_status = job.status
        self.stream.flush()

    def close(self) -> None:
        """End the line on a terminal."""
        if self._tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
