"""What an extraction reports: :class:`Progress` after every batch, :class:`ExtractionResult` at the end."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from atlas.baselines import BaselineSums

TRUNCATION_POLICY = (
    "text: keep the first max_tokens_per_sample tokens; completion: drop prompt tokens from the left "
    "(keeping one), then completion tokens from the right"
)

@dataclass(frozen=True)
class Progress:
    """Progress of an extraction, passed to the progress callback after every batch.

    Attributes
    ----------
    samples_done : int
        Samples handled so far (absolute index into the input, skipped ones included).
    samples_total : int
    tokens : int
        Counted tokens sketched so far (in completion mode: completion tokens only; a resumed call goes on from
        its checkpoint's count).
    tokens_per_s : float
        Counted tokens per second of this call.
    eta_s : float or None
        Estimated seconds left (from the sample rate), None before any rate is known.
    tokens_streamed : int
        Every real (unpadded) token forwarded through the model so far, prompts included.
    tokens_streamed_per_s : float
        ``tokens_streamed`` per second of wall time.
    samples_per_s : float
        Samples handled per second in this call.
    """

    samples_done: int
    samples_total: int
    tokens: int
    tokens_per_s: float
    eta_s: float | None
    tokens_streamed: int = 0
    tokens_streamed_per_s: float = 0.0
    samples_per_s: float = 0.0


@dataclass(frozen=True)
class Counts:
    """The counters of an extraction so far, as a checkpoint keeps them and a resumed call starts from.

    Attributes
    ----------
    samples_used, samples_skipped : int
    skipped_reasons : dict of str to int
    tokens, tokens_streamed, truncated : int
    """

    samples_used: int = 0
    samples_skipped: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict, hash=False)
    tokens: int = 0
    tokens_streamed: int = 0
    truncated: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (a checkpoint's ``extra["counts"]``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, tokens: int = 0) -> Counts:
        """Read back :meth:`to_dict` (anything but a count ≥ 0 read as 0); a checkpoint written before counts
        were kept gives its ``tokens`` alone."""
        if not isinstance(data, dict):
            return cls(tokens=int(tokens))
        reasons = data.get("skipped_reasons")
        counts: dict[str, int] = {f.name: data[f.name] if _is_count(data.get(f.name)) else 0
                                  for f in fields(cls) if f.name != "skipped_reasons"}
        return cls(skipped_reasons={str(k): v for k, v in reasons.items() if _is_count(v)}
                   if isinstance(reasons, dict) else {}, **counts)

    @classmethod
    def of(cls, result: Any) -> Counts:
        """The counters of an :class:`ExtractionResult` (which holds them under the same names)."""
        return cls(**{f.name: getattr(result, f.name) for f in fields(cls)} | {
            "skipped_reasons": dict(result.skipped_reasons)})


FEW_SAMPLES = 4
"""A task of this many samples or fewer is told so by its job's notes: the ranking's minimum-evidence prior
(:data:`atlas.routing.PRIOR_SAMPLES` pseudo-samples) weighs its evidence at half or less. A review of routes of a few
utterances (2026-12-08) found a 1-sample route receiving 0 of 20 of its prompts, 3 samples 3 of 20, with empty
notes."""


def sample_notes(summary: dict[str, Any] | None) -> list[str]:
    """What a user should be told of a job's samples, from its :meth:`ExtractionResult.summary` (a succeeded
    job's ``Job.result``): ``["2 of 40 samples skipped (too_short: 2)", "1 cut to 512 tokens"]``, or ``[]``."""
    if not isinstance(summary, dict):
        return []
    skipped, truncated = summary.get("samples_skipped") or 0, summary.get("truncated") or 0
    notes = []
    if skipped:
        used = summary.get("samples_used") or 0
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted((summary.get("skipped_reasons") or {}).items()))
        notes.append(f"{skipped} of {used + skipped} samples skipped ({reasons})")
    if truncated:
        cap = summary.get("max_tokens_per_sample")
        notes.append(f"{truncated} cut to {f'{cap} tokens' if cap else 'the token cap'}")
    task_samples = summary.get("task_samples")
    if isinstance(task_samples, int) and _is_count(task_samples) and 0 < task_samples <= FEW_SAMPLES:
        notes.append(f"the task has {task_samples} sample{'s' if task_samples > 1 else ''}: a task of {FEW_SAMPLES} or "
                     "fewer receives a prompt only when it matches it far better than the other tasks, so it "
                     "receives few of its own prompts (docs/SCORES.md, \"Route score\"); add samples to route to it")
    return notes


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class ExtractionResult:
    """Outcome of :meth:`Extractor.extract` (or of a checkpoint of it).

    Counts cover the whole windows processed by this call; ``samples_done`` is absolute
    (``start`` + samples of those windows), so a resumed job passes it back as ``start``.

    Attributes
    ----------
    state : SketchState
        Running state (the given one merged with every whole window).
    baselines : BaselineSums
        Running baseline sums (width H, without the bias column).
    samples_total : int
    samples_done : int
    samples_used : int
    samples_skipped : int
    skipped_reasons : dict of str to int
    tokens : int
        Counted tokens sketched.
    tokens_streamed : int
        Real (unpadded) tokens forwarded through the model, prompts included.
    samples_start : int
        ``samples_done`` when this call began (rates count from there).
    tokens_start, tokens_streamed_start : int
        ``tokens`` and ``tokens_streamed`` when this call began (a resumed job's counts go on from its
        checkpoint's; rates count from there).
    truncated : int
        Samples cut to ``max_tokens_per_sample``.
    cancelled : bool
    mode : str
    max_tokens_per_sample : int
    truncation_policy : str
    model_key : str
        ``ModelFingerprint.key()`` of the model: states of different keys must never be merged.
    elapsed_s : float
    timings : dict of str to float
        Seconds spent in ``tokenize_wait_s``, ``forward_s``, ``head_s``, ``sketch_s``, ``baselines_s``.
    """

    state: Any
    baselines: BaselineSums
    samples_total: int
    samples_done: int
    mode: str
    max_tokens_per_sample: int
    model_key: str
    samples_used: int = 0
    samples_skipped: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    tokens_streamed: int = 0
    samples_start: int = 0
    tokens_start: int = 0
    tokens_streamed_start: int = 0
    truncated: int = 0
    cancelled: bool = False
    truncation_policy: str = TRUNCATION_POLICY
    elapsed_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Counted tokens per second of wall time (of this call)."""
        return (self.tokens - self.tokens_start) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tokens_streamed_per_s(self) -> float:
        """Tokens forwarded through the model per second of wall time (of this call)."""
        return (self.tokens_streamed - self.tokens_streamed_start) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Samples handled per second of wall time (from ``samples_start``)."""
        return (self.samples_done - self.samples_start) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def counts(self) -> Counts:
        """The counters so far (what a checkpoint keeps)."""
        return Counts.of(self)

    def summary(self) -> dict[str, Any]:
        """JSON-serialisable summary (everything but the state and baselines), for job results."""
        return {
            "samples_total": self.samples_total, "samples_done": self.samples_done,
            "samples_used": self.samples_used, "samples_skipped": self.samples_skipped,
            "skipped_reasons": dict(self.skipped_reasons), "tokens": self.tokens,
            "tokens_streamed": self.tokens_streamed, "truncated": self.truncated,
            "cancelled": self.cancelled, "mode": self.mode, "max_tokens_per_sample": self.max_tokens_per_sample,
            "truncation_policy": self.truncation_policy, "model_key": self.model_key,
            "elapsed_s": self.elapsed_s, "tokens_per_s": self.tokens_per_s,
            "tokens_streamed_per_s": self.tokens_streamed_per_s, "samples_per_s": self.samples_per_s,
            "timings": dict(self.timings),
        }
