"""The dashboard's routing page and the task page's routing card, in a real browser against a real service.

Like ``test_dashboard_browser`` (the package's ``dashboard_service`` and Chromium, ``conftest.py``): the routing
playground returns the matches and the open-set "none" the API returns; a task's routing card switches its template
and novelty tests, sets its false-reject rate and a threshold override, and its sources show the "ρ at bound" badge.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from tests.service.dashboard_helpers import CHROMIUM, JOB_TIMEOUT_S, DashboardService, shot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]


def test_routing_playground_returns_matches_and_none(dashboard_service: DashboardService, page: Any) -> None:
    import httpx

    prompt = "Question: is the cloud blue? Answer:"
    page.goto(f"{dashboard_service.base}/dashboard/#/route")
    page.fill("[data-testid=route-prompt]", prompt)
    page.fill("#route-k", "3")
    page.click("[data-testid=route-submit]")
    matches = page.locator("[data-testid=route-match]")
    matches.first.wait_for()
    with httpx.Client(base_url=dashboard_service.base, timeout=30) as http:
        expected = http.post("/v1/route", json={"prompt": prompt, "k": 3}).json()
        strict = http.post("/v1/route", json={"prompt": prompt, "k": 3, "threshold": 1.0}).json()
    shown = [matches.nth(i).get_attribute("data-task-id") for i in range(matches.count())]
    assert shown == [str(m["task_id"]) for m in expected["matches"]]
    assert 1 <= len(shown) <= 3
    verdict = page.locator("[data-testid=route-verdict]")
    assert verdict.get_attribute("data-none") == str(expected["none"]).lower()
    shot(page, "route")

    # the open-set answer at the strictest threshold: the page says what the API says
    page.fill("#route-threshold", "1")
    page.click("[data-testid=route-submit]")
    page.locator("[data-testid=route-verdict][data-threshold='1']").wait_for()
    assert verdict.get_attribute("data-none") == str(strict["none"]).lower()
    assert page.locator("[data-testid=route-none]").count() == (1 if strict["none"] else 0)
    if strict["none"]:  # the task that decided it is named, with its score and threshold (rejected_by)
        by = strict["rejected_by"]
        text = page.locator("[data-testid=route-none]").inner_text()
        assert by["name"][:40] in text and "below its threshold 1.000" in text, (text, by)
    shot(page, "route-threshold")

    # any threshold the API takes (step 0.01 refused 0.123), and a note on how the rows are ordered
    page.fill("#route-threshold", "0.123")
    page.click("[data-testid=route-submit]")
    page.locator("[data-testid=route-verdict][data-threshold='0.123']").wait_for()
    note = page.locator("[data-testid=route-note]").inner_text()
    assert "ranking" in note and "answered (first) task" in note
    # a bad k: the form says so and the last answer goes (only a browser bubble showed, over the old answer)
    page.fill("#route-k", "0")
    page.click("[data-testid=route-submit]")
    page.locator("[data-testid=route-results] [data-testid=error]", has_text="top k").wait_for()
    assert page.locator("[data-testid=route-match]").count() == 0
    # a prompt over the model's token limit: the page says only its first tokens were read (as the API's
    # `truncated` does); the short prompt's answer above said nothing of it
    long_prompt = " ".join([prompt] * 120)
    with httpx.Client(base_url=dashboard_service.base, timeout=30) as http:
        assert http.post("/v1/route", json={"prompt": long_prompt}).json()["truncated"] is True
    page.fill("#route-k", "3")
    page.fill("[data-testid=route-prompt]", long_prompt)
    page.click("[data-testid=route-submit]")
    note = page.locator("[data-testid=route-truncated]")
    note.wait_for()
    assert "only its first tokens were read" in note.inner_text()
    page.fill("[data-testid=route-prompt]", prompt)
    page.click("[data-testid=route-submit]")
    page.locator("[data-testid=route-match]").first.wait_for()
    assert note.count() == 0


def test_task_page_routing_side_template_switch_rate_and_override(
    dashboard_service: DashboardService, page: Any
) -> None:
    import httpx

    names = ["Ada", "Bela", "Chen", "Dara", "Emil", "Fern", "Goran", "Hana", "Ivo", "Jana", "Kofi", "Lena"]
    texts = [f"The native language of {a} {b}son is ___ ." for a in names for b in names[:5]]  # 60 samples
    with httpx.Client(base_url=dashboard_service.base, timeout=60) as http:
        r = http.post("/v1/tasks", json={"name": "native-language", "samples": [{"text": t} for t in texts]})
        assert r.status_code == 202, r.text
        task_id, job_id = r.json()["task"]["id"], r.json()["job"]["id"]
        deadline = time.monotonic() + 3 * JOB_TIMEOUT_S
        while http.get(f"/v1/jobs/{job_id}").json()["status"] != "succeeded":
            assert time.monotonic() < deadline, "the job did not finish"
            time.sleep(0.2)
        try:
            page.goto(f"{dashboard_service.base}/dashboard/#/task/{task_id}")
            card = page.locator("[data-testid=task-routing]")
            state = card.locator("[data-testid=template-state]")
            state.wait_for()
            assert "active" in state.inner_text() and "not active" not in state.inner_text()
            assert card.locator("[data-testid=template-test]").inner_text() == "on"
            assert "calibrated" in card.inner_text()
            shot(page, "task-routing")
            _sources_show_the_rho_bound(page, http, task_id)
            card.locator("[data-testid=template-toggle]").focus()  # by keyboard: the focus stays on the switch
            page.keyboard.press("Enter")
            page.locator("[data-testid=template-toggle][data-on=false]").wait_for()
            assert card.locator("[data-testid=template-test]").inner_text() == "off"
            assert page.evaluate("document.activeElement.dataset.testid") == "template-toggle"  # (it fell to body)
            assert card.locator("[data-testid=routing-saved]").inner_text() == "Saved: the template test is off."
            assert http.get(f"/v1/tasks/{task_id}/routing").json()["template_test"] is False  # stored
            card.locator("[data-testid=template-toggle]").click()
            page.locator("[data-testid=template-toggle][data-on=true]").wait_for()
            assert http.get(f"/v1/tasks/{task_id}/routing").json()["template_test"] is True
            novelty = card.locator("[data-testid=novelty-test]")
            assert novelty.inner_text().startswith("on (60 sample vectors")  # 60 samples: tested
            card.locator("[data-testid=novelty-toggle]").click()
            page.locator("[data-testid=novelty-toggle][data-on=false]").wait_for()
            assert novelty.inner_text().startswith("switched off")
            got = http.get(f"/v1/tasks/{task_id}/routing").json()
            assert got["novelty_test"] is False and got["template_test"] is True  # stored, the other one kept
            card.locator("[data-testid=novelty-toggle]").click()
            page.locator("[data-testid=novelty-toggle][data-on=true]").wait_for()
            assert http.get(f"/v1/tasks/{task_id}/routing").json()["novelty_test"] is True
            info = http.get(f"/v1/tasks/{task_id}/routing").json()
            assert card.locator("[data-testid=routing-short-prompts]").inner_text().startswith(
                f"under {math.floor(info['short_prompt_tokens'] + 0.5)} tokens: threshold of their length "
                f"({info['length_views']} held-out views)")
            _set_rate_and_override(page, http, task_id)
            # at 1 % the test needs 199 vectors, more than a task keeps: on but not tested, and its switch says
            # what it does then (it offered "Turn the novelty test off" with no word)
            assert http.patch(f"/v1/tasks/{task_id}/routing", json={"false_reject_rate": 0.01}).status_code == 200
            page.reload()
            card.locator("[data-testid=novelty-test]", has_text="not tested").wait_for()
            title = card.locator("[data-testid=novelty-toggle]").get_attribute("title") or ""
            assert "does not run for this task now" in title, title
        finally:
            assert http.delete(f"/v1/tasks/{task_id}").status_code == 204


def _set_rate_and_override(page: Any, http: Any, task_id: int) -> None:
    """The routing card's form: a false-reject rate re-calibrates the threshold (stored), an override wins and
    is cleared, and a form without a rate says so and changes nothing (the service's 422s: test_routing_api)."""
    card = page.locator("[data-testid=task-routing]")
    before = http.get(f"/v1/tasks/{task_id}/routing").json()
    assert before["false_reject_rate"] == 0.05 and before["source"] == "calibrated"
    assert card.locator("[data-testid=routing-rate]").input_value() == "5"
    card.locator("[data-testid=routing-rate]").fill("20")
    card.locator("[data-testid=routing-rate]").press("Enter")  # the field keeps the focus, and a line says saved
    page.locator("[data-testid=routing-rate-state]", has_text="20 %").wait_for()
    assert page.evaluate("document.activeElement.dataset.testid") == "routing-rate"
    assert "Saved" in card.locator("[data-testid=routing-saved]").inner_text()
    after = http.get(f"/v1/tasks/{task_id}/routing").json()
    assert after["false_reject_rate"] == 0.2 and after["source"] == "calibrated"
    assert after["threshold_auto"] >= before["threshold_auto"]  # a higher rate never lowers the bound
    shown = card.locator("[data-testid=routing-threshold]").inner_text()  # what whole prompts are held to: with the
    assert f"{after['threshold']:.3f}" in shown and after["novelty_active"]  # novelty test, the rate's other half
    assert "at half the rate" in shown and after["threshold"] <= after["threshold_auto"]

    card.locator("[data-testid=routing-override]").fill("0.9")
    card.locator("[data-testid=routing-apply]").click()
    page.locator("[data-testid=routing-threshold][data-source=override]").wait_for()
    got = http.get(f"/v1/tasks/{task_id}/routing").json()
    assert got["threshold_override"] == 0.9 and got["threshold"] == 0.9 and got["false_reject_rate"] == 0.2
    card.locator("[data-testid=routing-clear]").click()
    page.locator("[data-testid=routing-threshold][data-source=calibrated]").wait_for()
    got = http.get(f"/v1/tasks/{task_id}/routing").json()
    assert got["threshold_override"] is None and got["threshold"] == after["threshold"]
    assert card.locator("[data-testid=routing-clear]").is_disabled()

    card.locator("[data-testid=routing-rate]").fill("")  # no rate: the form says so and sends nothing
    card.locator("[data-testid=routing-apply]").click()
    error = card.locator("[data-testid=routing-message] [data-testid=error]")
    error.wait_for()
    assert "false-reject rate as a percentage" in error.inner_text()
    assert http.get(f"/v1/tasks/{task_id}/routing").json()["false_reject_rate"] == 0.2  # unchanged
    card.locator("[data-testid=routing-rate]").fill("60")  # the API takes (0, 0.5]: said in percent, nothing sent
    card.locator("[data-testid=routing-apply]").click()
    card.locator("[data-testid=routing-message] [data-testid=error]", has_text="at most 50").wait_for()
    assert http.get(f"/v1/tasks/{task_id}/routing").json()["false_reject_rate"] == 0.2


def _sources_show_the_rho_bound(page: Any, http: Any, task_id: int) -> None:
    """Each recommended source carries a "ρ at bound" badge exactly when the API flags it ``rho_bounded``."""
    sources = http.get(f"/v1/tasks/{task_id}/sources", params={"k": 8, "candidates": 64}).json()["sources"]
    rows = page.locator("[data-testid=source-row]")
    rows.first.wait_for()
    assert rows.count() == len(sources)
    for src in sources:
        row = page.locator(f"[data-testid=source-row][data-task-id='{src['task_id']}']")
        assert row.locator("[data-testid=rho-bound-badge]").count() == ("rho_bounded" in src["flags"]), src
