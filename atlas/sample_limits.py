"""The bounds an upload is read within, and the count of its samples against them (:mod:`atlas.sample_io`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas.errors import PayloadTooLarge


@dataclass(frozen=True)
class SampleLimits:
    """Bounds applied while reading an upload.

    Attributes
    ----------
    max_samples
        Most samples in one upload.
    max_sample_chars
        Most characters in one sample (text, or prompt + completion).
    max_bytes
        Most bytes of decoded content (after gzip/Parquet decompression).
    """

    max_samples: int = 200_000
    max_sample_chars: int = 100_000
    max_bytes: int = 64 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Any) -> SampleLimits:
        """The limits of :class:`atlas.settings.Settings`."""
        return cls(max_samples=int(settings.max_samples), max_sample_chars=int(settings.max_sample_chars),
                   max_bytes=int(settings.max_upload_bytes))

    @property
    def max_line_bytes(self) -> int:
        """Longest JSON line that can hold a sample within the limits (``\\uXXXX\\uXXXX`` per char)."""
        return 2 * 12 * self.max_sample_chars + 4096


class SampleCounter:
    """Counts samples and characters against the limits."""

    def __init__(self, limits: SampleLimits, filename: str) -> None:
        self.limits = limits
        self.filename = filename
        self.n = 0

    def add(self, sample: tuple[str, ...], where: str) -> tuple[str, ...]:
        """Count one record's values (kept as plain strings: Samples are built once all limits passed)."""
        self.n += 1
        if self.n > self.limits.max_samples:
            raise PayloadTooLarge(
                f"{self.filename}: more than {self.limits.max_samples} samples (limit reached at {where})",
                {"max_samples": self.limits.max_samples, "at": where},
            )
        chars = sum(len(v) for v in sample)
        if chars > self.limits.max_sample_chars:
            raise PayloadTooLarge(
                f"{where}: the sample has {chars} characters; the limit is {self.limits.max_sample_chars}",
                {"chars": chars, "max_sample_chars": self.limits.max_sample_chars, "at": where},
            )
        return sample
