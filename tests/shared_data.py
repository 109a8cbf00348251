"""Where the tests find ``../shared/data`` (real public datasets; ``FISHER_ATLAS_SHARED_DATA`` overrides it), and a
skip when it is absent: the product never reads it, tests and benchmarks may."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("FISHER_ATLAS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def require_shared_data(subdir: str = "") -> Path:
    """``DATA / subdir``, or skip the test when that folder is absent — a failure in CI (``CI`` set), where
    ``../shared`` is always beside the checkout: the quality tests on real data skipped silently there when it was
    not found (a test-suite audit, 2026-12-07)."""
    path = DATA / subdir if subdir else DATA
    if not path.is_dir():
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(f"shared data not found at {path} (CI runs beside ../shared; FISHER_ATLAS_SHARED_DATA "
                        "names another place)")
        pytest.skip(f"shared data not found at {path}")
    return path
