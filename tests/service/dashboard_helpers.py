"""Helpers of the dashboard's browser tests (``test_dashboard_*_browser.py``; plain functions, no fixtures).

* Where Debian's Chromium is (:data:`CHROMIUM`) and how it is started headless (:data:`CHROMIUM_ARGS`).
* :func:`task_texts`: the five small tasks the shared ``dashboard_service`` (``conftest.py``) adds, and
  :class:`DashboardService`, what that fixture yields.
* :func:`ready_ids`, :func:`shot` (a screenshot into ``artifacts/dashboard/``, kept by CI) and
  :func:`write_jsonl` (an upload file for the add form).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "dashboard"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

JOB_TIMEOUT_S = 60.0


def task_texts() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """Five small tasks from clearly different text families (deterministic)."""
    rng = random.Random(7)
    words = ["fox", "dog", "river", "stone", "cloud", "garden", "light", "window"]
    return {
        "arithmetic": (
            {"domain": "math"},
            [f"{a} + {b} = {a + b}" for a, b in ((rng.randint(1, 99), rng.randint(1, 99)) for _ in range(10))],
        ),
        "python-code": ({"domain": "code"}, [f"def f{i}(a, b):\n    return a * {i} + b\n" for i in range(10)]),
        "smiles": (
            {"domain": "chemistry"},
            [
                "CC(=O)OC1=CC=CC=C1C(=O)O",
                "CCO",
                "c1ccccc1O",
                "CC(C)O",
                "CCN(CC)CC",
                "C1CCCCC1",
                "CC(=O)O",
                "OC(=O)C1=CC=CC=C1",
                "CCOC(=O)C",
                "N#CC1=CC=CC=C1",
            ],
        ),
        "questions": (
            {"domain": "qa"},
            [
                f"Question: is the {w} blue? Answer: {'yes' if i % 2 else 'no'}."
                for i, w in enumerate(words + words[:2])
            ],
        ),
        "prose": (
            {"domain": "prose"},
            [
                f"The quick brown {w} jumps over the lazy {rng.choice(words)} near the {rng.choice(words)}."
                for w in words + words[:2]
            ],
        ),
    }


FAILING_TASK = "too-short"
"""A task whose samples are single characters: no next-token positions, so its job fails."""


class DashboardService:
    """The running service of ``dashboard_service``: its URL, its ready tasks, their jobs and the failed job."""

    def __init__(
        self, base: str, tasks: dict[str, dict[str, Any]], jobs: list[dict[str, Any]], failed_job: dict[str, Any]
    ) -> None:
        self.base = base
        self.tasks = tasks  # the ready ones
        self.jobs = jobs  # their (succeeded) jobs
        self.failed_job = failed_job


def ready_ids(service: DashboardService) -> list[str]:
    """Ids of the ready tasks, as the API lists them now."""
    import httpx

    r = httpx.get(f"{service.base}/v1/tasks", params={"status": "ready", "limit": 1000}, timeout=10)
    r.raise_for_status()
    return sorted(str(t["id"]) for t in r.json()["items"])


def shot(page: Any, name: str) -> None:
    """A full-page screenshot ``artifacts/dashboard/<name>.png``."""
    page.wait_for_timeout(150)  # let hover styles and transitions settle
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def write_jsonl(path: Path, texts: list[str]) -> Path:
    """``texts`` as a JSON-lines upload file (``{"text": ...}`` per line)."""
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path
