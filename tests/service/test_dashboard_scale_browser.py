"""The dashboard in a space larger than its map, and renames made elsewhere (a scale review and a diff review,
2026-12-08; each failed before its fix).

* The atlas page listed every task to find the map's, so past the 2,000 oldest its points had no task; it now reads
  the map's tasks by id. Its add form then offered to append only to the tasks on the map (an even sample of a space
  past ``max_matrix_tasks``): it lists the space's ready tasks of its own.
* A task renamed elsewhere kept its old name on an open atlas page (the change stamp held no names) and jobs page
  (names were kept for the page's life).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.service.dashboard_helpers import CHROMIUM

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="chromium")]

ANIMALS = ["fox", "dog", "cat", "owl", "eel"]
TEXTS = {f"topic{t}": [f"topic {t} sentence {i}: the {ANIMALS[t]} jumps {i} times" for i in range(6)]
         for t in range(5)}


def _fill(url: str) -> dict[str, int]:
    from service.client import AtlasClient

    with AtlasClient(url) as client:
        return {n: client.add_task(n, samples=s, wait=True).task.id for n, s in TEXTS.items()}


def test_the_add_form_appends_to_tasks_off_a_sampled_map(serve: Any, tiny_lm: Any, page: Any) -> None:
    svc = serve(lm=tiny_lm, sketch_dim=128, max_matrix_tasks=3)
    ids = _fill(svc.url)
    page.goto(f"{svc.url}/dashboard/#/atlas")
    page.locator("[data-testid=atlas-point]").first.wait_for()
    assert page.locator("[data-testid=atlas-point]").count() == 3  # a sample of the 5
    options = page.locator("[data-testid=add-target] option").all_inner_texts()
    assert sorted(o for o in options if o.startswith("append to")) == sorted(f"append to {n}" for n in ids), options
    for point in page.locator("[data-testid=atlas-point]").all():  # every point found its task
        assert point.get_attribute("data-task-id") in {str(i) for i in ids.values()}


def test_a_rename_elsewhere_reaches_the_open_atlas_and_jobs_pages(serve: Any, tiny_lm: Any, page: Any) -> None:
    svc = serve(lm=tiny_lm, sketch_dim=128)
    ids = _fill(svc.url)
    page.goto(f"{svc.url}/dashboard/#/atlas")
    page.locator("[data-testid=atlas-list]").get_by_text("topic0").first.wait_for()
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        assert http.patch(f"/v1/tasks/{ids['topic0']}", json={"name": "renamed0"}).status_code == 200
    page.locator("[data-testid=atlas-list]").get_by_text("renamed0").first.wait_for(timeout=20_000)  # the next poll
    assert "topic0" not in page.locator("[data-testid=atlas-list]").inner_text()
    page.goto(f"{svc.url}/dashboard/#/jobs")
    page.get_by_text("topic1").first.wait_for()
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        assert http.patch(f"/v1/tasks/{ids['topic1']}", json={"name": "renamed1"}).status_code == 200
    page.get_by_text("renamed1").first.wait_for(timeout=20_000)
    assert "topic1" not in page.locator("body").inner_text()
