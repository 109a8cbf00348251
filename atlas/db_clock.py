"""Wall-clock time read on the database server's clock: the one clock every API process and worker share.

A job's heartbeat is written by its worker and judged stale by other processes (API replicas, other workers). Written
and judged on each host's own clock, a worker whose clock ran behind the API host's by more than half the stale
limit had every job it ran taken back as "its worker stopped (no heartbeat)" and, after ``job_max_attempts``,
failed as killed. :func:`db_now` corrects this host's clock by its offset from the database server's
(``clock_timestamp()`` on PostgreSQL), measured at most every :data:`REFRESH_S` per database; SQLite is a file on
this host, whose clock it is (offset 0). The same pattern as the prompts' Redis clock (``workers.redis_clock``).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from atlas.models import utcnow

log = logging.getLogger(__name__)

REFRESH_S = 30.0
"""How often the offset is measured again (one query)."""
SKEW_WARN_S = 1.0
"""An offset larger than this is logged once per database: heartbeats are still right, but the host's clock is off."""

_offsets: dict[str, tuple[float, float]] = {}  # database URL → (offset in seconds, monotonic time measured)
_warned: set[str] = set()
_lock = threading.Lock()


def db_now(session: Session) -> dt.datetime:
    """The current UTC time on the database server's clock (this host's, corrected by the measured offset).

    Parameters
    ----------
    session : Session
        A session of the database whose clock is read (a query at most every :data:`REFRESH_S`).

    Returns
    -------
    datetime
        Timezone-aware UTC.
    """
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        return utcnow()
    key = bind.engine.url.render_as_string(hide_password=True)
    with _lock:
        known = _offsets.get(key)
    if known is None or time.monotonic() - known[1] >= REFRESH_S:
        session.execute(select(1))  # the connection checked out and the transaction begun: not part of the round trip
        sent = utcnow().timestamp()  # the clock db_now corrects
        server = session.execute(select(func.clock_timestamp())).scalar_one()
        received = utcnow().timestamp()
        offset = server.timestamp() - (sent + received) / 2
        with _lock:
            _offsets[key] = (offset, time.monotonic())
            first_warning = abs(offset) > SKEW_WARN_S and key not in _warned
            if first_warning:
                _warned.add(key)
        if first_warning:
            log.warning("this host's clock is %.1f s %s the database server's: job heartbeats use the server's",
                        abs(offset), "behind" if offset > 0 else "ahead of")
        known = (offset, time.monotonic())
    return utcnow() + dt.timedelta(seconds=known[0])


def forget_offsets() -> None:
    """Measure every database's offset again at the next :func:`db_now` (tests; a clock set by an operator)."""
    with _lock:
        _offsets.clear()
        _warned.clear()


__all__ = ["REFRESH_S", "db_now", "forget_offsets"]
