"""Where the quality harness reads and writes (shared by :mod:`bench.quality.common` and ``report``)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""Root of the FisherAtlas checkout."""

OUT_DIR = REPO_ROOT / "bench" / "out" / "quality"
"""Raw run outputs (JSON) and caches; git-ignored (``bench/out/``)."""
