"""The dashboard's pages and navigation in a real browser against a real service.

Drives ``/dashboard`` of the package's ``dashboard_service`` (``conftest.py``: the service started with uvicorn in a
thread on a free loopback port, with a temporary data directory, a tiny GPT-2 saved by :mod:`tests.tiny_models` and a
small sketch; five tasks added through the REST API and their jobs waited for) with Debian's headless Chromium
(``/usr/bin/chromium``) through Playwright: the static files, one map mark per task and a click on a mark opens its
task page, the heatmaps have ``n × n`` cells, every page fits a narrow screen, the skip link. Screenshots are written
to ``artifacts/dashboard/`` (CI keeps them as test artifacts).

The other features have modules of their own: the routing page and the task page's routing card
(``test_dashboard_routing_browser``), the jobs page and the open atlas following jobs (``test_dashboard_jobs_browser``),
adding, appending and deleting tasks through the form (``test_dashboard_upload_browser``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.dashboard_helpers import CHROMIUM, DashboardService, ready_ids, shot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]


def test_static_files_served_with_content_types(dashboard_service: DashboardService) -> None:
    import httpx

    with httpx.Client(base_url=dashboard_service.base, timeout=10) as http:
        for path in ("/dashboard", "/"):  # the root too: a person's first try in a browser (it was a JSON 404)
            r = http.get(path, follow_redirects=False)
            assert r.status_code in (301, 302, 307, 308) and r.headers["location"] == "dashboard/", path
        r = http.get("/dashboard/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert 'src="app.js"' in r.text
        for name, ctype in (("app.js", "text/javascript"), ("style.css", "text/css")):
            r = http.get(f"/dashboard/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(ctype), (name, r.headers)
            assert r.headers["x-content-type-options"] == "nosniff"
        assert http.get("/dashboard/missing.js").status_code == 404
        assert http.get("/dashboard/..%2Fdashboard.py").status_code == 404


def test_atlas_draws_one_mark_per_task_and_click_opens_task_page(
    dashboard_service: DashboardService, page: Any
) -> None:
    page.goto(f"{dashboard_service.base}/dashboard")
    points = page.locator("[data-testid=atlas-point]")
    points.first.wait_for()
    ready = ready_ids(dashboard_service)
    assert sorted(str(t["id"]) for t in dashboard_service.tasks.values()) == ready
    assert points.count() == len(ready)
    assert sorted(points.nth(i).get_attribute("data-task-id") for i in range(points.count())) == ready
    assert "1 failed" in page.locator("[data-testid=atlas-not-ready]").inner_text()  # the too-short task
    target = dashboard_service.tasks["smiles"]
    mark = page.locator(f"[data-testid=atlas-point][data-task-id='{target['id']}']")
    mark.hover()
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    assert "smiles" in tip.inner_text()
    shot(page, "atlas")

    # the legend says what its numbers are ("0 (1)" read as two numbers)
    assert "cluster " in page.locator("[data-testid=atlas-legend]").inner_text()
    page.select_option("#atlas-colour", "meta:domain")
    assert page.locator("[data-testid=atlas-legend]").inner_text().count("· 1 task") == len(dashboard_service.tasks)

    mark.click()
    task_page = page.locator("[data-testid=task-page]")
    task_page.wait_for()
    assert page.url.endswith(f"#/task/{target['id']}")
    assert task_page.get_attribute("data-task-id") == str(target["id"])
    assert "smiles" in page.locator("[data-testid=task-name]").inner_text()
    assert page.locator("[data-testid=task-samples]").inner_text().startswith(str(target["n_samples"]))
    sources = page.locator("[data-testid=source-row]")
    sources.first.wait_for()
    assert 1 <= sources.count() <= len(dashboard_service.tasks) - 1
    assert page.locator("[data-testid=source-row] [data-factor=fisher]").count() == sources.count()
    others = len(dashboard_service.tasks) - 1  # how many were compared, and of how many at most, is said
    assert page.locator("[data-testid=sources-scope]").inner_text().startswith(
        f"The best {sources.count()} of the {others} tasks nearest this one by signature (up to 64 compared)")
    page.locator("[data-testid=nearest-row]").first.wait_for()
    assert page.locator("[data-testid=nearest-row]").count() == len(dashboard_service.tasks) - 1
    assert page.locator("[data-testid=dark-neighbours] .loading").count() == 0
    shot(page, "task")


def test_heatmaps_have_the_right_size(dashboard_service: DashboardService, page: Any) -> None:
    n = len(ready_ids(dashboard_service))
    page.goto(f"{dashboard_service.base}/dashboard/#/matrix")
    page.locator("[data-testid=heatmap-cell]").first.wait_for()
    kinds = page.locator("[data-testid=heatmap]")
    assert sorted(kinds.nth(i).get_attribute("data-kind") for i in range(kinds.count())) == [
        "activation",
        "error",
        "fisher",
    ]
    for kind in ("fisher", "activation", "error"):
        cells = page.locator(f"[data-testid=heatmap][data-kind={kind}] [data-testid=heatmap-cell]")
        assert cells.count() == n * n, kind
    diag = page.locator("[data-testid=heatmap][data-kind=fisher] [data-testid=heatmap-cell]").evaluate_all(
        "cells => cells.filter(c => c.dataset.row === c.dataset.col).map(c => Number(c.dataset.value))"
    )
    assert len(diag) == n and all(abs(v - 1.0) < 1e-3 for v in diag)
    page.locator("[data-testid=heatmap][data-kind=activation] [data-testid=heatmap-cell]").nth(1).hover()
    page.locator("#tooltip").wait_for(state="visible")
    shot(page, "matrix")
    assert page.locator("[data-testid=matrix-count]").inner_text() == f"{n} of {n} selected"
    # a link naming a task that is not on the map (deleted, or never was): it drops out of the selection
    ids = ready_ids(dashboard_service)[:2]
    page.goto(f"{dashboard_service.base}/dashboard/#/matrix?ids={ids[0]},{ids[1]},999999,abc")
    page.locator("[data-testid=matrix-count]", has_text=f"2 of {n} selected").wait_for()
    banner = page.locator("#banner")  # ... and is named, not dropped silently
    assert banner.is_visible() and "2 tasks not on the map (999999, abc)" in banner.inner_text()
    page.goto(f"{dashboard_service.base}/dashboard/#/matrix")
    page.locator("#banner").wait_for(state="hidden")
    # a fresh page at the bare link: the default selection (every task) again. (Not reload(): the page keeps the
    # chosen selection across its own navigation and writes it into its link once computed, so a reload raced that
    # write: "2 of 5" on a loaded CI box.)
    page.goto("about:blank")
    page.goto(f"{dashboard_service.base}/dashboard/#/matrix")
    page.locator("[data-testid=matrix-count]", has_text=f"{n} of {n} selected").wait_for()

    # one heatmap at a time, and the pair detail from GET /v1/align
    page.get_by_role("radio", name="Error").click()
    assert page.locator("[data-testid=heatmap]").count() == 1
    assert page.locator("[data-testid=heatmap][data-kind=error] [data-testid=heatmap-cell]").count() == n * n
    page.locator("[data-testid=heatmap-cell]").nth(1).click()
    detail = page.locator("[data-testid=pair-detail]")
    detail.locator("svg.factor-bars").wait_for()
    assert "↔" in detail.inner_text()
    assert "Fisher (raw)" in detail.inner_text() and "Fisher (shrunk)" in detail.inner_text()  # bar vs tooltip

    # keyboard: one cell is in the tab order; an arrow moves it, Enter opens the pair like a click
    detail.locator("button[aria-label=Close]").click()
    cell = page.locator("[data-testid=heatmap-cell][tabindex='0']")
    assert cell.count() == 1
    cell.focus()
    page.keyboard.press("ArrowRight")
    row, col, label = page.evaluate(
        "[document.activeElement.dataset.row, document.activeElement.dataset.col, "
        "document.activeElement.getAttribute('aria-label')]"
    )
    assert row != col and "↔" in label and "Error only" in label
    page.keyboard.press("Enter")
    detail.locator("svg.factor-bars").wait_for()

    # the activation-dark fields keep their value on an empty or out-of-range entry, and say why
    act = page.locator("[data-testid=dark-darkAct]")
    for bad in ("5", ""):
        act.fill(bad)
        act.press("Tab")
        assert act.input_value() == "0.8", bad
        assert "0 to 1" in page.locator("[data-testid=dark-hint]").inner_text()
    # the page's own thresholds colour its matrix only: a task page keeps the API's rule, as its sources' badge does
    # (it showed "Activation ≥ 0.95 … None" beside a source badged activation-dark, a dashboard review)
    act.fill("0.95")
    act.press("Tab")
    assert "≥ 0.95" in page.locator(".matrix-legend").inner_text()
    page.goto(f"{dashboard_service.base}/dashboard/#/task/{ready_ids(dashboard_service)[0]}")
    rule = "Activation ≥ 0.8 but Fisher ≤ 0.3 (the API's rule"
    page.locator("[data-testid=dark-neighbours]", has_text=rule).wait_for()


TITLES_INSIDE = """svgs => svgs.map(s => {
    const t = s.querySelector('.heatmap-title').getBBox();
    return [t.x, t.x + t.width, s.viewBox.baseVal.width];
})"""
"""Each heatmap title's horizontal extent and its panel's width."""


def _titles_inside(page: Any) -> None:
    spans = page.locator("svg.heatmap-svg").evaluate_all(TITLES_INSIDE)
    assert spans and all(lo >= -0.5 and hi <= width + 0.5 for lo, hi, width in spans), spans


def test_a_task_link_that_is_no_valid_escape_is_a_message_not_a_script_error(dashboard_service: DashboardService,
                                                                           page: Any) -> None:
    """``#/task/abc%E0`` showed "Error: URI malformed", JavaScript's own words (a new-user review, 2026-12-07)."""
    page.goto(f"{dashboard_service.base}/dashboard/#/task/abc%E0")
    box = page.locator("[data-testid=error]")
    box.wait_for()
    assert "URI malformed" not in box.inner_text() and "is not a task link" in box.inner_text(), box.inner_text()


def test_heatmap_titles_fit_their_panels(dashboard_service: DashboardService, page: Any) -> None:
    """A panel was sized for a 150 px title: "Activation only S_cov(M_a)" (~170 px) was clipped over a matrix of
    a few tasks, on a wide screen and on a phone (a new-user review, 2026-12-07)."""
    ids = ready_ids(dashboard_service)[:3]
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{dashboard_service.base}/dashboard/#/matrix?ids={','.join(ids)}")
        page.locator("[data-testid=heatmap-cell]").first.wait_for()
        assert page.locator("svg.heatmap-svg").count() == 3
        _titles_inside(page)


def test_narrow_screen_keeps_every_page_within_the_viewport(dashboard_service: DashboardService, page: Any) -> None:
    """At 390 px the top bar pushed the key field off-screen (the page was 749 px wide) and the heatmaps widened
    the alignment page: the bar wraps and a wide heatmap scrolls inside its card."""
    page.set_viewport_size({"width": 390, "height": 844})
    for route, ready in (("atlas", "atlas-point"), ("matrix", "heatmap-cell"), ("jobs", "job-row")):
        page.goto(f"{dashboard_service.base}/dashboard/#/{route}")
        page.locator(f"[data-testid={ready}]").first.wait_for()
        scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client, (route, scroll, client)
        key = page.locator("#apikey").bounding_box()
        assert key is not None and key["x"] >= 0 and key["x"] + key["width"] <= client, (route, key)
        if route == "matrix":  # one heatmap per row, each with its row labels and its whole title (the second and
            # third wrapped below the first unlabelled, titles clipped: the layout took a 330 px card for 480 px)
            page.locator("svg.heatmap-svg").first.wait_for()
            labelled = page.locator("svg.heatmap-svg").evaluate_all(
                "svgs => svgs.map(s => s.querySelectorAll('.row-label').length > 0)")
            assert len(labelled) >= 2 and all(labelled), labelled
    shot(page, "narrow-jobs")


def test_skip_link_focuses_the_page_and_keeps_the_route(dashboard_service: DashboardService, page: Any) -> None:
    page.goto(f"{dashboard_service.base}/dashboard/#/jobs")
    page.locator("[data-testid=jobs-view]").wait_for()
    page.focus(".skip-link")
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement && document.activeElement.id === 'view'")
    assert page.url.endswith("#/jobs")  # it was taken for an unknown route and replaced by #/atlas
    assert page.locator("[data-testid=jobs-view]").count() == 1


MARK_SIZES = """() => [...document.querySelectorAll('[data-testid=atlas-point]')].slice(0, 5).map(c => {
    const r = c.getBoundingClientRect(); return r.width; })"""
"""Drawn widths, in CSS pixels, of the atlas's first marks (14 units across, plus the stroke)."""


def test_the_atlas_keeps_its_marks_and_names_readable_on_a_phone(dashboard_service: DashboardService,
                                                                 page: Any) -> None:
    """Drawn at 760 units and scaled to a 390 px screen's card, the atlas's marks were 6 px across and its names
    about 5 px tall (a new-user review, 2026-12-07): it is drawn at the card's width, and drawn again when the
    window is narrowed or widened."""
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{dashboard_service.base}/dashboard/#/atlas")
    page.locator("[data-testid=atlas-point]").first.wait_for()
    assert page.get_attribute("[data-testid=atlas-map]", "viewBox") == "0 0 760 520"  # a wide screen: as before
    wide = page.evaluate(MARK_SIZES)
    link = page.locator("[data-testid=atlas-list] td a").first
    link.focus()  # a resize redraws the map alone: a task link of the list keeps the focus (it fell to <body>)
    page.set_viewport_size({"width": 390, "height": 844})
    page.locator("[data-testid=atlas-map]:not([viewBox='0 0 760 520'])").wait_for()  # redrawn at the new width
    assert page.evaluate("document.activeElement.closest('[data-testid=atlas-list]') !== null")
    for narrowed in (True, False):
        if not narrowed:
            page.reload()
            page.locator("[data-testid=atlas-point]").first.wait_for()
        sizes = page.evaluate(MARK_SIZES)
        assert sizes and all(13 <= w <= 18 for w in sizes), (sizes, wide)  # 14 px marks, as on a wide screen
        label = page.locator(".point-label").first
        if label.count():
            assert label.bounding_box()["height"] >= 10  # 11 px text
        box = page.locator("[data-testid=atlas-map]").bounding_box()
        client = page.evaluate("document.documentElement.clientWidth")
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= client
        assert box["width"] >= 250  # the card's width, not a thumbnail
    shot(page, "atlas-phone")
