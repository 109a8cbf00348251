"""Adding tasks through the dashboard's form, in a real browser against a real service.

Like ``test_dashboard_browser`` (the package's ``dashboard_service`` and Chromium, ``conftest.py``): a file uploaded
through the add form becomes a task on the atlas, another file is appended to it and the task is deleted from its page;
the API's and the form's errors are shown as messages; with keys required (a service of its own, ``serve``), the form
sends the key and its progress streams with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.dashboard_helpers import CHROMIUM, JOB_TIMEOUT_S, DashboardService, shot, write_jsonl

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]


def test_add_append_and_delete_a_task_through_the_form(
    dashboard_service: DashboardService, page: Any, tmp_path: Path
) -> None:

    page.goto(f"{dashboard_service.base}/dashboard/#/atlas")
    points = page.locator("[data-testid=atlas-point]")
    points.first.wait_for()
    before = points.count()
    assert "null" not in page.locator(".list-card").inner_text()  # the stray "null" under the task list
    texts = [f"Sonnet {i}: shall I compare thee to a summer's day, {i % 9} times more lovely?" for i in range(60)]
    # the file picker offers every format the API reads, gzip-compressed ones included
    assert ".gz" in (page.get_attribute("[data-testid=add-file]", "accept") or "").split(",")
    page.set_input_files("[data-testid=add-file]", str(write_jsonl(tmp_path / "poems.jsonl", texts)))
    page.fill("[data-testid=add-name]", "form-poems")
    page.select_option("[data-testid=add-mode]", "text")
    # an integer beyond 2^53 is sent and shown with its digits (JSON.parse and JSON.stringify rounded it before)
    page.fill("[data-testid=add-metadata]", '{"domain": "poetry", "catalogue": 12345678901234567891}')
    page.click("[data-testid=add-submit]")
    progress = page.locator("[data-testid=add-progress]")
    page.locator("[data-testid=add-progress][data-status=succeeded]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
    # the button pressed was disabled while busy (the focus fell to <body>): the outcome has it, for the keyboard
    page.locator("[data-testid=add-message]:focus").wait_for(timeout=5_000)
    # read once: by the focus, not by a live region too (the message was both, so it was announced twice)
    assert page.get_attribute("[data-testid=add-message]", "aria-live") is None
    assert "form-poems added" in page.locator("[data-testid=add-message]").inner_text()
    assert page.locator("[data-testid=add-live]").text_content() == ""

    with httpx.Client(base_url=dashboard_service.base, timeout=10) as http:
        task = http.get("/v1/tasks", params={"name": "form-poems"}).json()["items"][0]
        job = http.get(f"/v1/jobs/{progress.get_attribute('data-job-id')}").json()
    assert task["metadata"] == {"domain": "poetry", "catalogue": 12345678901234567891}
    assert task["n_samples"] == len(texts)
    assert job["task_id"] == task["id"] and job["status"] == "succeeded"
    shown = page.locator("[data-testid=add-progress-text]").inner_text()
    assert f"{len(texts)} / {len(texts)} samples" in shown
    assert f"{job['progress']['tokens_streamed']:,} tokens through the model" in shown
    # the atlas redrew with the new point and the list has the new task
    page.locator(f"[data-testid=atlas-point][data-task-id='{task['id']}']").wait_for()
    assert points.count() == before + 1
    assert page.locator(f"[data-testid=atlas-list] tr[data-task-id='{task['id']}']").count() == 1
    shot(page, "add-task")

    # append a file to the new task
    first_job = progress.get_attribute("data-job-id")
    page.select_option("[data-testid=add-target]", str(task["id"]))
    assert page.locator("[data-testid=add-name]").is_hidden()
    assert page.locator("[data-testid=add-notes]").count() == 0  # nothing was left out of the first file
    more = [f"Sonnet {i}: rough winds do shake the darling buds of May." for i in range(60, 75)]
    # one sample of a single token cannot be sketched: the form says so (it passed unseen before 2026-11-25)
    page.set_input_files("[data-testid=add-file]", str(write_jsonl(tmp_path / "more.jsonl", [*more, "x"])))
    page.click("[data-testid=add-submit]")
    page.locator(
        f"[data-testid=add-progress][data-status=succeeded]:not([data-job-id='{first_job}'])"
    ).wait_for(timeout=JOB_TIMEOUT_S * 1000)
    notes = page.locator("[data-testid=add-notes]")
    notes.wait_for()
    assert f"1 of {len(more) + 1} samples skipped (too_short: 1)" in notes.inner_text()
    with httpx.Client(base_url=dashboard_service.base, timeout=10) as http:
        assert http.get(f"/v1/tasks/{task['id']}").json()["n_samples"] == len(texts) + len(more)

    # samples pasted instead of a file (the form took files only): one per line, appended to the task
    # (a first line in braces is a text sample unless it is a JSON object: it was sent as JSON lines, a 422)
    pasted = ["{{poet}} wrote: so long lives this, and this gives life to thee."]
    pasted += [f"Sonnet {i}: so long as men can breathe or eyes can see." for i in range(75, 80)]
    second_job = progress.get_attribute("data-job-id")
    page.set_input_files("[data-testid=add-file]", str(write_jsonl(tmp_path / "both.jsonl", pasted)))
    page.fill("[data-testid=add-paste]", "\n".join(pasted))
    page.click("[data-testid=add-submit]")  # both a file and pasted text: which one was meant is said, not guessed
    page.locator("[data-testid=add-message] [data-testid=error]", has_text="not both").wait_for()
    # the focus stays on the button pressed (nothing was sent): the live region reads the refusal
    assert page.evaluate("document.activeElement.dataset.testid") == "add-submit"
    assert "not both" in (page.locator("[data-testid=add-live][aria-live=polite]").text_content() or "")
    page.set_input_files("[data-testid=add-file]", [])
    page.click("[data-testid=add-submit]")
    page.locator(
        f"[data-testid=add-progress][data-status=succeeded]:not([data-job-id='{second_job}'])"
    ).wait_for(timeout=JOB_TIMEOUT_S * 1000)
    assert page.input_value("[data-testid=add-paste]") == ""
    with httpx.Client(base_url=dashboard_service.base, timeout=10) as http:
        total = len(texts) + len(more) + len(pasted)
        assert http.get(f"/v1/tasks/{task['id']}").json()["n_samples"] == total
    # pasted JSON lines make a completion task (its pairs read as a .jsonl file's)
    pairs = [{"prompt": f"Question: is {w} a colour?\nAnswer:", "completion": " yes"} for w in ("red", "blue", "teal")]
    page.select_option("[data-testid=add-target]", "")
    page.fill("[data-testid=add-name]", "form-pasted-pairs")
    page.select_option("[data-testid=add-mode]", "completion")
    page.fill("[data-testid=add-paste]", "\n".join(json.dumps(p) for p in pairs))
    third_job = progress.get_attribute("data-job-id")
    page.click("[data-testid=add-submit]")
    page.locator(
        f"[data-testid=add-progress][data-status=succeeded]:not([data-job-id='{third_job}'])"
    ).wait_for(timeout=JOB_TIMEOUT_S * 1000)
    with httpx.Client(base_url=dashboard_service.base, timeout=10) as http:
        made = http.get("/v1/tasks", params={"name": "form-pasted-pairs"}).json()["items"][0]
        assert (made["mode"], made["n_samples"]) == ("completion", len(pairs))
        assert http.delete(f"/v1/tasks/{made['id']}").status_code == 204

    # delete it from its page: the atlas is back to what it was
    page.goto(f"{dashboard_service.base}/dashboard/#/task/{task['id']}")
    page.locator(".card", has_text="Metadata").get_by_text("12345678901234567891", exact=True).wait_for(timeout=10_000)
    delete = page.locator("[data-testid=task-delete]")
    delete.click()
    assert delete.get_attribute("data-armed") == "true"
    delete.click()
    page.locator("[data-testid=atlas-view]").wait_for()
    page.locator("#view:focus").wait_for(timeout=5_000)  # the deleted page's button took the focus with it
    page.wait_for_function(f"document.querySelectorAll('[data-testid=atlas-point]').length === {before}")
    with httpx.Client(base_url=dashboard_service.base, timeout=10) as http:
        assert http.get(f"/v1/tasks/{task['id']}").status_code == 404


def test_form_shows_api_and_input_errors_as_messages(
    dashboard_service: DashboardService, browser: Any, tmp_path: Path
) -> None:

    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    # the browser itself logs a refused request ("Failed to load resource: ... 409"): that one is expected here
    pg.on("console", lambda m: problems.append(m.text)
          if m.type == "error" and "Failed to load" not in m.text else None)
    progress = pg.locator("[data-testid=add-progress]")
    try:
        pg.goto(f"{dashboard_service.base}/dashboard/#/atlas")
        pg.locator("[data-testid=add-form]").wait_for()
        # a first upload succeeds: its green bar must not stay under the next upload's error
        ok = write_jsonl(tmp_path / "ok.jsonl", ["CCO and CCN", "CC(=O)O"])
        pg.set_input_files("[data-testid=add-file]", str(ok))
        pg.fill("[data-testid=add-name]", "form-ok")
        # scrolled down to the form in a short window: the page stays there while the job runs and after the atlas
        # redraws with the new task (it jumped to the top mid-upload, a dashboard review)
        pg.set_viewport_size({"width": 1360, "height": 420})
        points = pg.locator("[data-testid=atlas-point]").count()
        pg.locator("[data-testid=add-submit]").scroll_into_view_if_needed()
        y0 = pg.evaluate("window.scrollY")
        assert y0 > 0
        pg.click("[data-testid=add-submit]")
        pg.locator("[data-testid=add-progress][data-status=succeeded]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
        pg.locator("[data-testid=atlas-point]").nth(points).wait_for()  # (a polled string is eval: the CSP refuses it)
        assert abs(pg.evaluate("window.scrollY") - y0) <= 2, (y0, pg.evaluate("window.scrollY"))
        pg.set_viewport_size({"width": 1360, "height": 900})
        upload = write_jsonl(tmp_path / "s.jsonl", ["CCO and CCN", "c1ccccc1"])
        pg.set_input_files("[data-testid=add-file]", str(upload))
        pg.fill("[data-testid=add-name]", "smiles")  # taken: the API answers 409 {code: conflict}
        pg.fill("[data-testid=add-metadata]", "{not json")
        pg.click("[data-testid=add-submit]")
        assert "metadata is not JSON" in pg.locator("[data-testid=add-message]").inner_text()
        assert progress.is_hidden()

        def refused(name: str, metadata: str) -> str:
            """The API's error the form shows for an upload named ``name`` with ``metadata``."""
            pg.fill("[data-testid=add-name]", name)
            pg.fill("[data-testid=add-metadata]", metadata)
            pg.click("[data-testid=add-submit]")
            error = pg.locator("[data-testid=add-message] [data-testid=error]")
            error.wait_for()
            return error.inner_text()

        # a number JSON cannot hold is refused by the service, not sent as null (it became {"x": null} before)
        said = refused("form-huge-number", '{"x": 1e400}')
        assert "metadata" in said and "not representable as JSON" in said
        with httpx.Client(base_url=dashboard_service.base, timeout=10) as http:
            assert http.get("/v1/tasks", params={"name": "form-huge-number"}).json()["items"] == []
        said = refused("smiles", "")
        assert "(conflict)" in said and "smiles" in said
        assert progress.is_hidden() and progress.get_attribute("data-status") is None
        # a job that fails: the open atlas counts the failed task at once (it redrew only after a success)
        note = pg.locator("[data-testid=atlas-not-ready]")
        failed_before = int(note.inner_text().split(" failed")[0].split()[-1])
        pg.set_input_files("[data-testid=add-file]", str(write_jsonl(tmp_path / "short.jsonl", ["a", "b"])))
        pg.fill("[data-testid=add-name]", "form-fails")
        pg.click("[data-testid=add-submit]")
        pg.locator("[data-testid=add-progress][data-status=failed]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
        pg.locator("[data-testid=atlas-not-ready]", has_text=f"{failed_before + 1} failed").wait_for(timeout=5_000)
        # pasted samples the service refuses are named so, not by the file the form made of them ("pasted.txt: …")
        pg.fill("[data-testid=add-name]", "form-pasted")
        pg.set_input_files("[data-testid=add-file]", [])
        pg.select_option("[data-testid=add-mode]", "completion")
        pg.fill("[data-testid=add-paste]", "just a line of words\nanother line of words")
        pg.click("[data-testid=add-submit]")
        error = pg.locator("[data-testid=add-message] [data-testid=error]", has_text="the pasted samples: ")
        error.wait_for()
        assert "pasted.txt" not in error.inner_text(), error.inner_text()
        # contact lost while the form follows an accepted upload's job: not "Upload: cannot reach the service" over
        # a box still "running" with a live Cancel (a new-user review, 2026-12-07)
        pg.select_option("[data-testid=add-mode]", "text")
        pg.route("**/v1/jobs/**", lambda route: route.abort())
        pg.fill("[data-testid=add-name]", "form-lost")
        pg.click("[data-testid=add-submit]")
        pg.locator("[data-testid=add-progress][data-status=unknown]").wait_for()
        assert pg.locator("[data-testid=add-progress] [data-testid=status-badge]").inner_text() == "unknown"
        assert pg.locator("[data-testid=add-cancel]").is_hidden()
        assert "Lost contact with job" in pg.locator("[data-testid=add-progress-text]").inner_text()
        assert "asking again" in pg.locator("[data-testid=add-progress-text]").inner_text()
        # the service answers again (a restart): the panel takes the job up (it said "unknown" for good before)
        pg.unroute("**/v1/jobs/**")
        pg.locator("[data-testid=add-progress][data-status=succeeded]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
        pg.locator("[data-testid=add-done]").wait_for()
    finally:
        context.close()
        with httpx.Client(base_url=dashboard_service.base, timeout=10) as http:
            for name in ("form-ok", "form-fails", "form-lost"):
                for task in http.get("/v1/tasks", params={"name": name}).json()["items"]:
                    http.delete(f"/v1/tasks/{task['id']}")
    assert not problems, problems


def test_with_keys_on_the_form_streams_progress_with_the_key(
    serve: Any, tiny_lm: Any, browser: Any, tmp_path: Path
) -> None:
    from atlas import apikeys

    svc = serve(lm=tiny_lm, require_keys=True)
    with svc.container.store.session() as s:
        _, key = apikeys.create_api_key(s, "dashboard", ["read", "write"])
        _, read_key = apikeys.create_api_key(s, "viewer", ["read"])
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    problems: list[str] = []
    events: list[tuple[str, int, str | None]] = []
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    # before the key is entered the API answers 401, which the browser logs as a failed resource load
    pg.on("console", lambda m: problems.append(m.text)
          if m.type == "error" and "Failed to load" not in m.text else None)
    pg.on("response", lambda r: events.append((r.url, r.status, r.request.headers.get("x-api-key")))
          if "/events" in r.url else None)
    try:
        pg.goto(f"{svc.url}/dashboard/#/atlas")
        pg.locator("[data-testid=error]").wait_for()  # 401 shown as a message
        pg.fill("#apikey", key)
        pg.click("#keyform button[type=submit]")
        pg.locator("[data-testid=add-form]").wait_for()
        stored = pg.evaluate("[sessionStorage.getItem('fisherAtlas.apiKey'), localStorage.length]")
        assert stored == [key, 0]
        texts = [f"Stanza {i}: the river bends where the willows lean, {i} times." for i in range(40)]
        pg.set_input_files("[data-testid=add-file]", str(write_jsonl(tmp_path / "k.jsonl", texts)))
        pg.fill("[data-testid=add-name]", "keyed-upload")
        pg.click("[data-testid=add-submit]")
        pg.locator("[data-testid=add-progress][data-status=succeeded]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
        pg.locator("[data-testid=atlas-point]").first.wait_for()
        assert pg.locator("[data-testid=atlas-point]").count() == 1
        # progress came over the SSE stream, requested with the key header (EventSource could not send it)
        assert events and all(status == 200 and k == key for _, status, k in events), events
        assert pg.locator("#keystate").text_content() == "saved · read, write"
        # a read key: every control that calls a write endpoint is disabled, saying why; reading still works
        pg.fill("#apikey", read_key)
        pg.click("#keyform button[type=submit]")
        pg.locator("#keystate", has_text="read only").wait_for()
        pg.locator("[data-testid=add-read-only]").wait_for()
        assert pg.locator("[data-testid=add-submit]").is_disabled()
        task_id = httpx.get(f"{svc.url}/v1/tasks", headers={"X-API-Key": read_key}).json()["items"][0]["id"]
        pg.goto(f"{svc.url}/dashboard/#/task/{task_id}")
        pg.locator("[data-testid=routing-form]").wait_for()
        for testid in ("task-delete", "routing-apply", "routing-override", "routing-rate"):
            control = pg.locator(f"[data-testid={testid}]")
            assert control.is_disabled() and control.get_attribute("data-needs-scope") == "write", testid
        assert "read scope only" in (pg.locator("[data-testid=task-delete]").get_attribute("title") or "")
        pg.goto(f"{svc.url}/dashboard/#/route")
        pg.locator("[data-testid=fit-apply]").wait_for()
        assert pg.locator("[data-testid=fit-apply]").is_disabled()
        assert pg.locator("[data-testid=fit-preview]").is_enabled()  # a dry run needs the read scope only
        # the write key again: the controls come back
        pg.fill("#apikey", key)
        pg.click("#keyform button[type=submit]")
        pg.locator("#keystate", has_text="write").wait_for()
        pg.locator("[data-testid=fit-apply]").wait_for()
        assert pg.locator("[data-testid=fit-apply]").is_enabled()
    finally:
        context.close()
    assert not problems, problems


def test_the_form_waits_out_a_busy_service_and_adds_once(serve: Any, tiny_lm: Any, browser: Any,
                                                          tmp_path: Path) -> None:
    """Every upload slot taken (``max_concurrent_uploads``): the service answers 503 ``uploads_busy`` with Retry-After.
    The form says so, asks again with the same Idempotency-Key and adds the task once when a slot frees."""
    import threading
    import time

    from tests.service.test_upload_slots import HeldUpload, _wait_held

    svc = serve(lm=tiny_lm, max_concurrent_uploads=1, upload_slot_wait_s=0.2)
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    posts: list[tuple[int, str | None]] = []
    pg.on("response", lambda r: posts.append((r.status, r.request.headers.get("idempotency-key")))
          if r.request.method == "POST" and r.url.endswith("/v1/tasks") else None)
    try:
        pg.goto(f"{svc.url}/dashboard/#/atlas")
        pg.locator("[data-testid=add-form]").wait_for()
        held = HeldUpload(svc.url, "held")
        _wait_held(svc.app, 1)
        texts = [f"Line {i}: a sample uploaded while the service is busy." for i in range(12)]
        pg.set_input_files("[data-testid=add-file]", str(write_jsonl(tmp_path / "busy.jsonl", texts)))
        pg.fill("[data-testid=add-name]", "busy-upload")
        pg.click("[data-testid=add-submit]")
        waiting = pg.locator("[data-testid=add-waiting]")
        waiting.wait_for(timeout=15_000)
        assert "trying again" in waiting.inner_text()
        releaser = threading.Thread(target=lambda: (time.sleep(0.5), held.finish()), daemon=True)
        releaser.start()
        pg.locator("[data-testid=add-progress][data-status=succeeded]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
        releaser.join(10)
        assert waiting.count() == 0  # the message went once the upload got through
    finally:
        context.close()
    assert posts[0][0] == 503 and posts[-1][0] == 202, posts
    assert len({key for _, key in posts}) == 1 and posts[0][1], posts  # one key, sent every time
    with httpx.Client(base_url=svc.url, timeout=10) as http:
        names = sorted(t["name"] for t in http.get("/v1/tasks").json()["items"])
    assert names == ["busy-upload", "held"]
