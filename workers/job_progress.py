"""A job's progress: as its worker stores it on the job row (``jobs.progress``) and as the API shows it."""

from __future__ import annotations

from typing import Any

from atlas.vocabulary import JobStatus
from workers.extraction_results import ExtractionResult, Progress


def _record(done: int, total: int, tokens: int, tokens_per_s: float, eta_s: float | None, streamed: int,
            streamed_per_s: float, samples_per_s: float) -> dict[str, Any]:
    return {
        "samples_done": done, "samples_total": total, "tokens": tokens, "tokens_per_s": round(tokens_per_s, 3),
        "eta_s": None if eta_s is None else round(eta_s, 3), "tokens_streamed": streamed,
        "tokens_streamed_per_s": round(streamed_per_s, 3), "samples_per_s": round(samples_per_s, 3),
    }


def of_progress(p: Progress) -> dict[str, Any]:
    """The stored progress of an extraction's :class:`Progress` (after a batch)."""
    return _record(p.samples_done, p.samples_total, p.tokens, p.tokens_per_s, p.eta_s, p.tokens_streamed,
                   p.tokens_streamed_per_s, p.samples_per_s)


def of_start(samples_done: int, samples_total: int, tokens: int, streamed: int) -> dict[str, Any]:
    """The stored progress of a job as its attempt starts: from its checkpoint when it resumes, else from zero (a
    re-claimed job showed its last attempt's figures, past the checkpoint it went back to: 912 of 4,200 samples,
    then 817)."""
    return _record(samples_done, samples_total, tokens, 0.0, None, streamed, 0.0, 0.0)


def of_result(res: ExtractionResult, *, final: bool = False) -> dict[str, Any]:
    """The stored progress of an :class:`ExtractionResult` (a checkpoint's, or the job's end with ``final``)."""
    rate = res.samples_per_s
    eta = 0.0 if final else ((res.samples_total - res.samples_done) / rate if rate > 0 else None)
    return _record(res.samples_done, res.samples_total, res.tokens, res.tokens_per_s, eta, res.tokens_streamed,
                   res.tokens_streamed_per_s, rate)


_NOT_RUNNING = frozenset({JobStatus.QUEUED, JobStatus.FAILED, JobStatus.CANCELLED})
"""Job statuses no worker runs (their stored estimate is stale)."""


def progress_view(progress: dict[str, Any] | None, status: str | None = None) -> dict[str, Any]:
    """A job row's stored progress as the API's ``JobProgress`` fields (missing ones zero, ETA null).

    Parameters
    ----------
    progress : dict or None
        ``Job.progress`` as written by the heartbeat, a checkpoint or the final update.
    status : str, optional
        ``Job.status``: a job that nothing runs — queued (again, after its worker died), failed or cancelled — has no
        time left (``eta_s`` None: its last heartbeat's estimate stays in the row).

    Returns
    -------
    dict
        ``samples_done``, ``samples_total``, ``tokens`` (counted), ``tokens_per_s``, ``tokens_streamed``
        (every token forwarded through the model), ``tokens_streamed_per_s``, ``samples_per_s``, ``eta_s``,
        ``phase`` (``sketch``: the samples; ``routing``: the prompts routed to the task, after them) and
        ``routing_done`` / ``routing_total`` (prompts of that pass).
    """
    p = dict(progress or {})
    ints = ("samples_done", "samples_total", "tokens", "tokens_streamed", "routing_done", "routing_total")
    floats = ("tokens_per_s", "tokens_streamed_per_s", "samples_per_s")
    out: dict[str, Any] = {k: int(p.get(k, 0) or 0) for k in ints} | {k: float(p.get(k, 0.0) or 0.0) for k in floats}
    eta = p.get("eta_s")
    out["eta_s"] = None if eta is None or status in _NOT_RUNNING else float(eta)
    out["phase"] = "routing" if p.get("phase") == "routing" else "sketch"
    return out
