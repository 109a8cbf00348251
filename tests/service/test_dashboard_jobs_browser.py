"""The dashboard's jobs page and the open atlas following jobs, in a real browser against a real service.

Like ``test_dashboard_browser`` (the package's ``dashboard_service`` and Chromium, ``conftest.py``): the jobs page lists
the jobs, the failed one with its error, and a job's live progress; the Cancel buttons of the add form and the jobs page
cancel queued jobs (a service of its own, ``serve``, without a runner); a task added through the API lands on the open
atlas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.service.dashboard_helpers import CHROMIUM, JOB_TIMEOUT_S, DashboardService, shot, write_jsonl

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]


def test_jobs_page_lists_the_jobs_and_the_failed_one_with_its_error(
    dashboard_service: DashboardService, page: Any
) -> None:
    page.goto(f"{dashboard_service.base}/dashboard/#/jobs")
    rows = page.locator("[data-testid=jobs-finished] [data-testid=job-row][data-status=succeeded]")
    rows.first.wait_for()
    assert rows.count() == len(dashboard_service.jobs)
    failed = page.locator("[data-testid=jobs-failed] [data-testid=job-row][data-status=failed]")
    assert failed.count() == 1
    assert failed.get_attribute("data-job-id") == str(dashboard_service.failed_job["id"])
    assert (
        failed.locator("[data-testid=job-error]").inner_text().strip()
        == dashboard_service.failed_job["error"].strip()
    )
    assert page.locator("[data-testid=jobs-running] [data-testid=job-row]").count() == 0
    assert page.locator("[data-testid=error]").count() == 0
    shot(page, "jobs")

    # live progress: a bigger upload appears and ends as succeeded without reloading the page
    import httpx

    texts = [f"Line {i}: the {i % 7} quick brown foxes jump over {i % 5} lazy dogs." for i in range(1500)]
    r = httpx.post(
        f"{dashboard_service.base}/v1/tasks",
        json={"name": "live-upload", "samples": [{"text": t} for t in texts]},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job"]["id"]
    page.goto(f"{dashboard_service.base}/dashboard/#/jobs")
    page.reload()
    row = page.locator(f"[data-testid=job-row][data-job-id='{job_id}']")
    row.first.wait_for()
    if row.first.get_attribute("data-status") in ("queued", "running"):
        shot(page, "jobs-live")
    page.locator(
        f"[data-testid=jobs-finished] [data-testid=job-row][data-job-id='{job_id}'][data-status=succeeded]"
    ).wait_for(timeout=JOB_TIMEOUT_S * 1000)
    # a task created while the page is open is named on its row (it showed "task N": names were read once)
    r = httpx.post(
        f"{dashboard_service.base}/v1/tasks",
        json={"name": "named-late", "samples": [{"text": texts[0]}]},
        timeout=30,
    )
    late = page.locator(f"[data-testid=jobs-finished] [data-testid=job-row][data-job-id='{r.json()['job']['id']}']")
    late.wait_for(timeout=JOB_TIMEOUT_S * 1000)
    assert "named-late" in late.inner_text()
    # the service is shared by the package's dashboard tests: leave it with the tasks it had
    for name in ("live-upload", "named-late"):
        for task in httpx.get(f"{dashboard_service.base}/v1/tasks", params={"name": name}, timeout=10).json()["items"]:
            assert httpx.delete(f"{dashboard_service.base}/v1/tasks/{task['id']}", timeout=10).status_code == 204


def test_cancel_buttons_and_the_open_atlas_follow_queued_jobs(
    serve: Any, tiny_lm: Any, page: Any, tmp_path: Path
) -> None:
    """No runner, so jobs stay queued. The atlas opened empty notices a task added through the API (it followed
    only tasks pending when it loaded); the add form's Cancel cancels its own job, the jobs page's Cancel another."""
    import httpx

    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    page.goto(f"{svc.url}/dashboard/#/atlas")
    page.locator("[data-testid=add-form]").wait_for()
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        r = http.post("/v1/tasks", json={"name": "queued-api", "samples": [{"text": "one two three four five"}]})
        assert r.status_code == 202, r.text
        job_id = r.json()["job"]["id"]
        page.locator("[data-testid=atlas-view]", has_text="1 task(s) stored").wait_for(timeout=15_000)

        page.set_input_files("[data-testid=add-file]", str(write_jsonl(tmp_path / "q.jsonl", ["six seven eight"])))
        page.fill("[data-testid=add-name]", "queued-form")
        page.click("[data-testid=add-submit]")
        page.locator("[data-testid=add-progress][data-status=queued]").wait_for()
        form_job = page.locator("[data-testid=add-progress]").get_attribute("data-job-id")
        page.click("[data-testid=add-cancel]")
        page.locator("[data-testid=add-progress][data-status=cancelled]").wait_for()
        assert page.locator("[data-testid=add-cancel]").is_hidden()
        assert http.get(f"/v1/jobs/{form_job}").json()["status"] == "cancelled"
        # the outcome is said, not left to the badge (a review, 2026-12-07)
        assert "Cancelled: nothing was added" in page.locator("[data-testid=add-cancelled]").inner_text()

        page.goto(f"{svc.url}/dashboard/#/jobs")
        page.locator(f"[data-testid=jobs-running] [data-testid=job-row][data-job-id='{job_id}'] "
                     "[data-testid=job-cancel]").click()
        page.locator(f"[data-testid=job-row][data-job-id='{job_id}'][data-status=cancelled]").wait_for()
        assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


def test_task_added_elsewhere_lands_on_the_open_atlas(dashboard_service: DashboardService, page: Any) -> None:
    import httpx

    page.goto(f"{dashboard_service.base}/dashboard/#/atlas")
    points = page.locator("[data-testid=atlas-point]")
    points.first.wait_for()
    before = points.count()
    # One job runs at a time: a long blocker keeps the new task queued while the page loads, so the page
    # sees it pending; cancelling the blocker lets it run and land while the page is open.
    blocker_texts = [f"Filler {i}: pour {i % 9 + 1} cups of water into the pot and stir slowly." for i in range(20000)]
    texts = [f"Recipe {i}: whisk {i % 4 + 1} eggs with sugar, fold in flour and bake for {20 + i} minutes."
             for i in range(40)]
    with httpx.Client(base_url=dashboard_service.base, timeout=60) as http:
        rb = http.post("/v1/tasks", json={"name": "blocker-api", "samples": [{"text": t} for t in blocker_texts]})
        assert rb.status_code == 202, rb.text
        r = http.post("/v1/tasks", json={"name": "recipes-api", "samples": [{"text": t} for t in texts]})
        assert r.status_code == 202, r.text
        task_id = r.json()["task"]["id"]
        page.reload()  # the page now shows the task as processing, not on the map
        note = page.locator("[data-testid=atlas-not-ready]")
        note.wait_for()
        assert "processing" in note.inner_text()
        assert page.locator(f"[data-testid=atlas-point][data-task-id='{task_id}']").count() == 0
        assert http.post(f"/v1/jobs/{rb.json()['job']['id']}/cancel").status_code == 200
        page.locator(f"[data-testid=atlas-point][data-task-id='{task_id}']").wait_for(timeout=3 * JOB_TIMEOUT_S * 1000)
        assert points.count() == before + 1
        assert http.delete(f"/v1/tasks/{task_id}").status_code == 204
        http.delete(f"/v1/tasks/{rb.json()['task']['id']}")
