"""The dashboard as a review in a real browser found it (2026-12-07), in Debian's headless Chromium.

* A task page compared its neighbours with the first 127 tasks of the map only: a twin past them was missing from
  "Nearest tasks" while "Recommended sources" ranked it first.
* The alignment page of a tab opened before a task was deleted failed whole ("tasks do not exist: [36]").
* A key revoked while the page was open kept "saved · read, write" in the header; a key holding a character no
  header carries was reported as "the service cannot be reached".
* The key field had a ``name``: without the script, Enter sent the key in the URL; the whole page was a live region.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from atlas import apikeys
from tests.service.conftest import wait_job
from tests.service.dashboard_helpers import CHROMIUM
from tests.service.test_dashboard_edges_browser import page  # noqa: F401  (fixture: console errors fail a test)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

PROSE = [f"The quick brown fox number {i} jumps over the lazy dog near the river bank." for i in range(12)]
CODE = [f"def f{i}(a, b):\n    return a * {i} + b\n" for i in range(12)]


def _add(http: httpx.Client, name: str, texts: list[str]) -> None:
    r = http.post("/v1/tasks", json={"name": name, "samples": [{"text": t} for t in texts]})
    assert r.status_code == 202, r.text
    assert wait_job(http, r.json()["job"]["id"])["status"] == "succeeded"


def _many_tasks_export(http: httpx.Client, path: Path, copies: int = 129) -> None:
    """An export of ``copies`` + 2 tasks made from two real ones: ``prose``, the copies of ``code``, then
    ``prose-twin`` (the copies share their states: imports are the quick way to a large space)."""
    lines = [json.loads(line) for line in http.get("/v1/spaces/default/export").text.splitlines()]
    header, tasks = lines[0], {t["name"]: t for t in lines[1:-1]}
    out = [tasks["prose"]] + [{**tasks["code"], "name": f"code-{i:03d}", "uploads": []} for i in range(copies)]
    out.append({**tasks["prose"], "name": "prose-twin", "uploads": []})
    header["n_tasks"] = len(out)
    body = "".join(json.dumps(line) + "\n" for line in [header, *out]).encode()
    trailer = {"trailer": True, "n_tasks": len(out), "sha256": hashlib.sha256(body).hexdigest()}
    path.write_bytes(body + (json.dumps(trailer) + "\n").encode())


def test_neighbours_of_a_large_space_and_a_matrix_after_a_deletion(serve: Any, tiny_lm: Any, page: Any,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    source = serve(lm=tiny_lm)
    with httpx.Client(base_url=source.url, timeout=120) as http:
        _add(http, "prose", PROSE)
        _add(http, "code", CODE)
        _many_tasks_export(http, tmp_path / "space.jsonl")
    svc = serve(lm=tiny_lm)
    with httpx.Client(base_url=svc.url, timeout=300) as http:
        r = http.post("/v1/spaces/import", files={"file": ("space.jsonl", (tmp_path / "space.jsonl").read_bytes())})
        assert r.status_code in (200, 201), r.text
        ids = {t["name"]: t["id"] for t in http.get("/v1/tasks", params={"limit": 1000}).json()["items"]}
        assert len(ids) == 131
        points = [p["task_id"] for p in http.get("/v1/atlas").json()["points"]]
        others = [p for p in points if p != ids["prose"]]
        assert ids["prose-twin"] not in others[:127]  # past the first 127: the page compared none of them

        page.goto(f"{svc.url}/dashboard/#/task/{ids['prose']}")
        nearest = page.locator("[data-testid=nearest-row]").first
        nearest.wait_for()
        assert "prose-twin" in nearest.inner_text()

        page.goto(f"{svc.url}/dashboard/#/matrix")
        page.locator("[data-testid=matrix-view]").wait_for()
        page.get_by_role("button", name="None").click()
        for name in ("prose", "code-000", "code-001"):
            page.locator(f"input[data-task-id='{ids[name]}']").check()
        assert http.delete(f"/v1/tasks/{ids['code-001']}").status_code == 204  # another tab deletes one
        page.locator("[data-testid=matrix-compute]").click()
        page.locator("#banner").wait_for(state="visible")
        assert "deleted since the page was drawn" in page.locator("#banner").inner_text()
        page.locator(".matrix-out svg").first.wait_for()
        assert page.locator("[data-testid=matrix-count]").inner_text().startswith("2 of 130")


def test_the_key_field_says_when_a_key_is_revoked_or_malformed(serve: Any, tiny_lm: Any,
                                                               page: Any) -> None:  # noqa: F811
    svc = serve(lm=tiny_lm)
    with svc.app.state.container.store.session() as s:
        _, admin = apikeys.create_api_key(s, "admin", ["admin"])
        row, key = apikeys.create_api_key(s, "dashboard", ["read", "write"])
        s.flush()
        key_id = row.id
    page.goto(f"{svc.url}/dashboard/#/atlas")
    assert page.get_attribute("#apikey", "name") is None  # never sent by a form submitted without the script
    assert page.get_attribute("#view", "aria-live") is None  # each panel has its own live region
    state = page.locator("#keystate")
    page.fill("#apikey", key)
    page.press("#apikey", "Enter")
    page.locator("#keystate", has_text="read, write").wait_for()  # (the page's CSP forbids wait_for_function)
    with httpx.Client(base_url=svc.url, timeout=30, headers={"X-API-Key": admin}) as http:
        assert http.delete(f"/v1/keys/{key_id}").status_code == 204
    page.locator("a[data-nav=jobs]").click()  # any call with the revoked key
    page.locator("#keystate[data-refused=true]").wait_for()
    assert "not accepted" in state.inner_text()

    page.fill("#apikey", "ключ-123")
    page.press("#apikey", "Enter")
    page.locator("#keystate", has_text="not a key").wait_for()
    assert "cannot be reached" not in state.inner_text()


def test_a_focused_map_mark_keeps_the_focus_when_the_task_list_changes(serve: Any, tiny_lm: Any,
                                                                      page: Any) -> None:  # noqa: F811
    """The atlas redraws when a task is added elsewhere: the keyboard focus on a mark fell to the page (a keyboard
    user then tabbed back through every mark); it now returns to the same task's mark."""
    svc = serve(lm=tiny_lm)
    with httpx.Client(base_url=svc.url, timeout=120) as http:
        _add(http, "prose", PROSE)
        _add(http, "code", CODE)
        page.goto(f"{svc.url}/dashboard/#/atlas")
        marks = page.locator("[data-testid=atlas-point]")
        marks.nth(1).wait_for()
        focused = marks.nth(1).get_attribute("data-task-id")
        marks.nth(1).focus()
        _add(http, "more prose", [t.replace("fox", "cat") for t in PROSE])
        marks.nth(2).wait_for(timeout=30_000)  # the page redrew with the new task
    assert page.evaluate("document.activeElement.getAttribute('data-task-id')") == focused


def test_a_large_matrix_on_a_phone_gives_the_label_column_to_the_cells(serve: Any, tiny_lm: Any, browser: Any,
                                                                       tmp_path: Path) -> None:
    """At 375 px a 40-task matrix drew 3 px cells beside an empty 150 px column (the row names dropped under 7 px
    kept their room; a review in a real browser, 2026-12-07)."""
    source = serve(lm=tiny_lm)
    with httpx.Client(base_url=source.url, timeout=120) as http:
        _add(http, "prose", PROSE)
        _add(http, "code", CODE)
        _many_tasks_export(http, tmp_path / "space.jsonl", copies=38)
    svc = serve(lm=tiny_lm)
    with httpx.Client(base_url=svc.url, timeout=300) as http:
        r = http.post("/v1/spaces/import", files={"file": ("space.jsonl", (tmp_path / "space.jsonl").read_bytes())})
        assert r.status_code in (200, 201), r.text
    context = browser.new_context(viewport={"width": 375, "height": 800})
    try:
        phone = context.new_page()
        phone.goto(f"{svc.url}/dashboard/#/matrix")
        phone.locator("[data-testid=matrix-view]").wait_for()
        phone.get_by_role("button", name="All").click()
        phone.locator("[data-testid=matrix-compute]").click()
        heatmap = phone.locator("[data-testid=heatmap]").first
        heatmap.wait_for()
        cells = phone.locator("[data-testid=heatmap] .heatmap-cell")
        first = cells.first.bounding_box()
        svg = phone.locator("[data-testid=heatmap] svg").first.bounding_box()
        assert first is not None and svg is not None
        assert first["x"] - svg["x"] < 40, (first, svg)  # the grid starts at the panel's edge, not 150 px in
        assert phone.locator("[data-testid=heatmap] .row-label").count() == 0
    finally:
        context.close()
