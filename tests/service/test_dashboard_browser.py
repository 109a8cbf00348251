"""The dashboard in a real browser against a real service.

Starts the service (``service.app.create_app``) with uvicorn in a thread on a free loopback port,
with a temporary data directory, a tiny GPT-2 saved by :mod:`tests.tiny_models` and a small sketch,
adds a few tasks through the REST API, waits for their jobs, then drives ``/dashboard`` with
Debian's headless Chromium (``/usr/bin/chromium``) through Playwright: one map mark per task, the
heatmaps have ``n × n`` cells, a click on a mark opens its task page, the routing playground returns
matches and the open-set "none", the jobs page lists the jobs. Screenshots are written to
``artifacts/dashboard/`` (CI keeps them as test artifacts).
"""

from __future__ import annotations

import math
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]

JOB_TIMEOUT_S = 60.0


def _task_texts() -> dict[str, tuple[dict[str, Any], list[str]]]:
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FAILING_TASK = "too-short"
"""A task whose samples are single characters: no next-token positions, so its job fails."""


class _Service:
    def __init__(
        self, base: str, tasks: dict[str, dict[str, Any]], jobs: list[dict[str, Any]], failed_job: dict[str, Any]
    ) -> None:
        self.base = base
        self.tasks = tasks  # the ready ones
        self.jobs = jobs  # their (succeeded) jobs
        self.failed_job = failed_job


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Service]:
    httpx = pytest.importorskip("httpx")
    uvicorn = pytest.importorskip("uvicorn")
    from atlas.settings import Settings
    from service.app import create_app
    from tests.tiny_models import save_tiny_gpt2

    tmp = tmp_path_factory.mktemp("dashboard")
    model_dir = save_tiny_gpt2(tmp / "model")
    settings = Settings(
        data_dir=tmp / "data",
        database_url=None,
        host="127.0.0.1",
        port=_free_port(),
        model=str(model_dir),
        device="cpu",
        dtype="float32",
        sketch_dim=256,
        queue="inprocess",
        worker_threads=1,
        require_keys=False,
        checkpoint_every=64,
    )
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning", lifespan="on", ws="none")
    )
    thread = threading.Thread(target=server.run, name="dashboard-uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{settings.port}"
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the service did not start")
            time.sleep(0.05)
        tasks: dict[str, dict[str, Any]] = {}
        jobs: list[dict[str, Any]] = []
        with httpx.Client(base_url=base, timeout=30) as http:
            for name, (metadata, texts) in _task_texts().items():
                r = http.post(
                    "/v1/tasks",
                    json={"name": name, "mode": "text", "metadata": metadata, "samples": [{"text": t} for t in texts]},
                )
                assert r.status_code == 202, r.text
                body = r.json()
                tasks[name] = body["task"]
                jobs.append(body["job"])
            r = http.post("/v1/tasks", json={"name": FAILING_TASK, "samples": [{"text": "a"}, {"text": "b"}]})
            assert r.status_code == 202, r.text
            failing = r.json()["job"]
            deadline = time.monotonic() + JOB_TIMEOUT_S
            done: dict[int, dict[str, Any]] = {}
            while len(done) < len(jobs) + 1:
                assert time.monotonic() < deadline, f"jobs did not finish in {JOB_TIMEOUT_S} s: {jobs}"
                for job in [*jobs, failing]:
                    if job["id"] in done:
                        continue
                    j = http.get(f"/v1/jobs/{job['id']}").json()
                    if j["status"] in ("succeeded", "failed", "cancelled"):
                        assert j["status"] == ("failed" if job is failing else "succeeded"), j
                        done[job["id"]] = j
                time.sleep(0.1)
            failed_job = done.pop(failing["id"])
            assert failed_job["error"], failed_job
            for name, t in tasks.items():
                tasks[name] = http.get(f"/v1/tasks/{t['id']}").json()
                assert tasks[name]["status"] == "ready", tasks[name]
        yield _Service(base, tasks, list(done.values()), failed_job)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    problems: list[str] = []
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    pg.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    yield pg
    context.close()
    assert not problems, problems


def _ready_ids(service: _Service) -> list[str]:
    """Ids of the ready tasks, as the API lists them now."""
    import httpx

    r = httpx.get(f"{service.base}/v1/tasks", params={"status": "ready", "limit": 1000}, timeout=10)
    r.raise_for_status()
    return sorted(str(t["id"]) for t in r.json()["items"])


def _shot(page: Any, name: str) -> None:
    page.wait_for_timeout(150)  # let hover styles and transitions settle
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_static_files_served_with_content_types(service: _Service) -> None:
    import httpx

    with httpx.Client(base_url=service.base, timeout=10) as http:
        r = http.get("/dashboard", follow_redirects=False)
        assert r.status_code in (301, 302, 307, 308) and r.headers["location"].endswith("dashboard/")
        r = http.get("/dashboard/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert 'src="app.js"' in r.text
        for name, ctype in (("app.js", "text/javascript"), ("style.css", "text/css")):
            r = http.get(f"/dashboard/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(ctype), (name, r.headers)
            assert r.headers["x-content-type-options"] == "nosniff"
        assert http.get("/dashboard/missing.js").status_code == 404
        assert http.get("/dashboard/..%2Fdashboard.py").status_code == 404


def test_atlas_draws_one_mark_per_task_and_click_opens_task_page(service: _Service, page: Any) -> None:
    page.goto(f"{service.base}/dashboard")
    points = page.locator("[data-testid=atlas-point]")
    points.first.wait_for()
    ready = _ready_ids(service)
    assert sorted(str(t["id"]) for t in service.tasks.values()) == ready
    assert points.count() == len(ready)
    assert sorted(points.nth(i).get_attribute("data-task-id") for i in range(points.count())) == ready
    assert "1 failed" in page.locator("[data-testid=atlas-not-ready]").inner_text()  # the too-short task
    target = service.tasks["smiles"]
    mark = page.locator(f"[data-testid=atlas-point][data-task-id='{target['id']}']")
    mark.hover()
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    assert "smiles" in tip.inner_text()
    _shot(page, "atlas")

    page.select_option("#atlas-colour", "meta:domain")
    assert page.locator("[data-testid=atlas-legend]").inner_text().count("(1)") == len(service.tasks)

    mark.click()
    task_page = page.locator("[data-testid=task-page]")
    task_page.wait_for()
    assert page.url.endswith(f"#/task/{target['id']}")
    assert task_page.get_attribute("data-task-id") == str(target["id"])
    assert "smiles" in page.locator("[data-testid=task-name]").inner_text()
    assert page.locator("[data-testid=task-samples]").inner_text().startswith(str(target["n_samples"]))
    sources = page.locator("[data-testid=source-row]")
    sources.first.wait_for()
    assert 1 <= sources.count() <= len(service.tasks) - 1
    assert page.locator("[data-testid=source-row] [data-factor=fisher]").count() == sources.count()
    page.locator("[data-testid=nearest-row]").first.wait_for()
    assert page.locator("[data-testid=nearest-row]").count() == len(service.tasks) - 1
    assert page.locator("[data-testid=dark-neighbours] .loading").count() == 0
    _shot(page, "task")


def test_heatmaps_have_the_right_size(service: _Service, page: Any) -> None:
    n = len(_ready_ids(service))
    page.goto(f"{service.base}/dashboard/#/matrix")
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
    _shot(page, "matrix")
    assert page.locator("[data-testid=matrix-count]").inner_text() == f"{n} of {n} selected"
    # a link naming a task that is not on the map (deleted, or never was): it drops out of the selection
    ids = _ready_ids(service)[:2]
    page.goto(f"{service.base}/dashboard/#/matrix?ids={ids[0]},{ids[1]},999999")
    page.locator("[data-testid=matrix-count]", has_text=f"2 of {n} selected").wait_for()
    page.goto(f"{service.base}/dashboard/#/matrix")
    page.reload()  # a fresh page: the default selection (every task) again
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


def test_routing_playground_returns_matches_and_none(service: _Service, page: Any) -> None:
    import httpx

    prompt = "Question: is the cloud blue? Answer:"
    page.goto(f"{service.base}/dashboard/#/route")
    page.fill("[data-testid=route-prompt]", prompt)
    page.fill("#route-k", "3")
    page.click("[data-testid=route-submit]")
    matches = page.locator("[data-testid=route-match]")
    matches.first.wait_for()
    with httpx.Client(base_url=service.base, timeout=30) as http:
        expected = http.post("/v1/route", json={"prompt": prompt, "k": 3}).json()
        strict = http.post("/v1/route", json={"prompt": prompt, "k": 3, "threshold": 1.0}).json()
    shown = [matches.nth(i).get_attribute("data-task-id") for i in range(matches.count())]
    assert shown == [str(m["task_id"]) for m in expected["matches"]]
    assert 1 <= len(shown) <= 3
    verdict = page.locator("[data-testid=route-verdict]")
    assert verdict.get_attribute("data-none") == str(expected["none"]).lower()
    _shot(page, "route")

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
    _shot(page, "route-threshold")

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


def test_jobs_page_lists_the_jobs_and_the_failed_one_with_its_error(service: _Service, page: Any) -> None:
    page.goto(f"{service.base}/dashboard/#/jobs")
    rows = page.locator("[data-testid=jobs-finished] [data-testid=job-row][data-status=succeeded]")
    rows.first.wait_for()
    assert rows.count() == len(service.jobs)
    failed = page.locator("[data-testid=jobs-failed] [data-testid=job-row][data-status=failed]")
    assert failed.count() == 1
    assert failed.get_attribute("data-job-id") == str(service.failed_job["id"])
    assert failed.locator("[data-testid=job-error]").inner_text().strip() == service.failed_job["error"].strip()
    assert page.locator("[data-testid=jobs-running] [data-testid=job-row]").count() == 0
    assert page.locator("[data-testid=error]").count() == 0
    _shot(page, "jobs")

    # live progress: a bigger upload appears and ends as succeeded without reloading the page
    import httpx

    texts = [f"Line {i}: the {i % 7} quick brown foxes jump over {i % 5} lazy dogs." for i in range(1500)]
    r = httpx.post(
        f"{service.base}/v1/tasks",
        json={"name": "live-upload", "samples": [{"text": t} for t in texts]},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job"]["id"]
    page.goto(f"{service.base}/dashboard/#/jobs")
    page.reload()
    row = page.locator(f"[data-testid=job-row][data-job-id='{job_id}']")
    row.first.wait_for()
    if row.first.get_attribute("data-status") in ("queued", "running"):
        _shot(page, "jobs-live")
    page.locator(
        f"[data-testid=jobs-finished] [data-testid=job-row][data-job-id='{job_id}'][data-status=succeeded]"
    ).wait_for(timeout=JOB_TIMEOUT_S * 1000)
    # a task created while the page is open is named on its row (it showed "task N": names were read once)
    r = httpx.post(f"{service.base}/v1/tasks", json={"name": "named-late", "samples": [{"text": texts[0]}]}, timeout=30)
    late = page.locator(f"[data-testid=jobs-finished] [data-testid=job-row][data-job-id='{r.json()['job']['id']}']")
    late.wait_for(timeout=JOB_TIMEOUT_S * 1000)
    assert "named-late" in late.inner_text()


def _write_jsonl(path: Path, texts: list[str]) -> Path:
    import json

    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_add_append_and_delete_a_task_through_the_form(
    service: _Service, page: Any, tmp_path: Path
) -> None:
    import httpx

    page.goto(f"{service.base}/dashboard/#/atlas")
    points = page.locator("[data-testid=atlas-point]")
    points.first.wait_for()
    before = points.count()
    assert "null" not in page.locator(".list-card").inner_text()  # the stray "null" under the task list
    texts = [f"Sonnet {i}: shall I compare thee to a summer's day, {i % 9} times more lovely?" for i in range(60)]
    # the file picker offers every format the API reads, gzip-compressed ones included
    assert ".gz" in (page.get_attribute("[data-testid=add-file]", "accept") or "").split(",")
    page.set_input_files("[data-testid=add-file]", str(_write_jsonl(tmp_path / "poems.jsonl", texts)))
    page.fill("[data-testid=add-name]", "form-poems")
    page.select_option("[data-testid=add-mode]", "text")
    page.fill("[data-testid=add-metadata]", '{"domain": "poetry"}')
    page.click("[data-testid=add-submit]")
    progress = page.locator("[data-testid=add-progress]")
    page.locator("[data-testid=add-progress][data-status=succeeded]").wait_for(timeout=JOB_TIMEOUT_S * 1000)

    with httpx.Client(base_url=service.base, timeout=10) as http:
        task = http.get("/v1/tasks", params={"name": "form-poems"}).json()["items"][0]
        job = http.get(f"/v1/jobs/{progress.get_attribute('data-job-id')}").json()
    assert task["metadata"] == {"domain": "poetry"} and task["n_samples"] == len(texts)
    assert job["task_id"] == task["id"] and job["status"] == "succeeded"
    shown = page.locator("[data-testid=add-progress-text]").inner_text()
    assert f"{len(texts)} / {len(texts)} samples" in shown
    assert f"{job['progress']['tokens_streamed']:,} tokens through the model" in shown
    # the atlas redrew with the new point and the list has the new task
    page.locator(f"[data-testid=atlas-point][data-task-id='{task['id']}']").wait_for()
    assert points.count() == before + 1
    assert page.locator(f"[data-testid=atlas-list] tr[data-task-id='{task['id']}']").count() == 1
    _shot(page, "add-task")

    # append a file to the new task
    first_job = progress.get_attribute("data-job-id")
    page.select_option("[data-testid=add-target]", str(task["id"]))
    assert page.locator("[data-testid=add-name]").is_hidden()
    assert page.locator("[data-testid=add-notes]").count() == 0  # nothing was left out of the first file
    more = [f"Sonnet {i}: rough winds do shake the darling buds of May." for i in range(60, 75)]
    # one sample of a single token cannot be sketched: the form says so (it passed unseen before 2026-11-25)
    page.set_input_files("[data-testid=add-file]", str(_write_jsonl(tmp_path / "more.jsonl", [*more, "x"])))
    page.click("[data-testid=add-submit]")
    page.locator(
        f"[data-testid=add-progress][data-status=succeeded]:not([data-job-id='{first_job}'])"
    ).wait_for(timeout=JOB_TIMEOUT_S * 1000)
    notes = page.locator("[data-testid=add-notes]")
    notes.wait_for()
    assert f"1 of {len(more) + 1} samples skipped (too_short: 1)" in notes.inner_text()
    with httpx.Client(base_url=service.base, timeout=10) as http:
        assert http.get(f"/v1/tasks/{task['id']}").json()["n_samples"] == len(texts) + len(more)

    # delete it from its page: the atlas is back to what it was
    page.goto(f"{service.base}/dashboard/#/task/{task['id']}")
    delete = page.locator("[data-testid=task-delete]")
    delete.click()
    assert delete.get_attribute("data-armed") == "true"
    delete.click()
    page.locator("[data-testid=atlas-view]").wait_for()
    page.wait_for_function(f"document.querySelectorAll('[data-testid=atlas-point]').length === {before}")
    with httpx.Client(base_url=service.base, timeout=10) as http:
        assert http.get(f"/v1/tasks/{task['id']}").status_code == 404


def test_form_shows_api_and_input_errors_as_messages(service: _Service, browser: Any, tmp_path: Path) -> None:
    import httpx

    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    # the browser itself logs a refused request ("Failed to load resource: ... 409"): that one is expected here
    pg.on("console", lambda m: problems.append(m.text)
          if m.type == "error" and "Failed to load" not in m.text else None)
    progress = pg.locator("[data-testid=add-progress]")
    try:
        pg.goto(f"{service.base}/dashboard/#/atlas")
        pg.locator("[data-testid=add-form]").wait_for()
        # a first upload succeeds: its green bar must not stay under the next upload's error
        ok = _write_jsonl(tmp_path / "ok.jsonl", ["CCO and CCN", "CC(=O)O"])
        pg.set_input_files("[data-testid=add-file]", str(ok))
        pg.fill("[data-testid=add-name]", "form-ok")
        pg.click("[data-testid=add-submit]")
        pg.locator("[data-testid=add-progress][data-status=succeeded]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
        upload = _write_jsonl(tmp_path / "s.jsonl", ["CCO and CCN", "c1ccccc1"])
        pg.set_input_files("[data-testid=add-file]", str(upload))
        pg.fill("[data-testid=add-name]", "smiles")  # taken: the API answers 409 {code: conflict}
        pg.fill("[data-testid=add-metadata]", "{not json")
        pg.click("[data-testid=add-submit]")
        assert "metadata is not JSON" in pg.locator("[data-testid=add-message]").inner_text()
        assert progress.is_hidden()
        pg.fill("[data-testid=add-metadata]", "")
        pg.click("[data-testid=add-submit]")
        error = pg.locator("[data-testid=add-message] [data-testid=error]")
        error.wait_for()
        assert "(conflict)" in error.inner_text() and "smiles" in error.inner_text()
        assert progress.is_hidden() and progress.get_attribute("data-status") is None
        # a job that fails: the open atlas counts the failed task at once (it redrew only after a success)
        note = pg.locator("[data-testid=atlas-not-ready]")
        failed_before = int(note.inner_text().split(" failed")[0].split()[-1])
        pg.set_input_files("[data-testid=add-file]", str(_write_jsonl(tmp_path / "short.jsonl", ["a", "b"])))
        pg.fill("[data-testid=add-name]", "form-fails")
        pg.click("[data-testid=add-submit]")
        pg.locator("[data-testid=add-progress][data-status=failed]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
        pg.locator("[data-testid=atlas-not-ready]", has_text=f"{failed_before + 1} failed").wait_for(timeout=5_000)
    finally:
        context.close()
        with httpx.Client(base_url=service.base, timeout=10) as http:
            for name in ("form-ok", "form-fails"):
                for task in http.get("/v1/tasks", params={"name": name}).json()["items"]:
                    http.delete(f"/v1/tasks/{task['id']}")
    assert not problems, problems


def test_narrow_screen_keeps_every_page_within_the_viewport(service: _Service, page: Any) -> None:
    """At 390 px the top bar pushed the key field off-screen (the page was 749 px wide) and the heatmaps widened
    the alignment page: the bar wraps and a wide heatmap scrolls inside its card."""
    page.set_viewport_size({"width": 390, "height": 844})
    for route, ready in (("atlas", "atlas-point"), ("matrix", "heatmap-cell"), ("jobs", "job-row")):
        page.goto(f"{service.base}/dashboard/#/{route}")
        page.locator(f"[data-testid={ready}]").first.wait_for()
        scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client, (route, scroll, client)
        key = page.locator("#apikey").bounding_box()
        assert key is not None and key["x"] >= 0 and key["x"] + key["width"] <= client, (route, key)
    _shot(page, "narrow-jobs")


def test_skip_link_focuses_the_page_and_keeps_the_route(service: _Service, page: Any) -> None:
    page.goto(f"{service.base}/dashboard/#/jobs")
    page.locator("[data-testid=jobs-view]").wait_for()
    page.focus(".skip-link")
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement && document.activeElement.id === 'view'")
    assert page.url.endswith("#/jobs")  # it was taken for an unknown route and replaced by #/atlas
    assert page.locator("[data-testid=jobs-view]").count() == 1


def test_with_keys_on_the_form_streams_progress_with_the_key(
    serve: Any, tiny_lm: Any, browser: Any, tmp_path: Path
) -> None:
    from atlas import apikeys

    svc = serve(lm=tiny_lm, require_keys=True)
    with svc.container.store.session() as s:
        _, key = apikeys.create_api_key(s, "dashboard", ["read", "write"])
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
        pg.set_input_files("[data-testid=add-file]", str(_write_jsonl(tmp_path / "k.jsonl", texts)))
        pg.fill("[data-testid=add-name]", "keyed-upload")
        pg.click("[data-testid=add-submit]")
        pg.locator("[data-testid=add-progress][data-status=succeeded]").wait_for(timeout=JOB_TIMEOUT_S * 1000)
        pg.locator("[data-testid=atlas-point]").first.wait_for()
        assert pg.locator("[data-testid=atlas-point]").count() == 1
        # progress came over the SSE stream, requested with the key header (EventSource could not send it)
        assert events and all(status == 200 and k == key for _, status, k in events), events
    finally:
        context.close()
    assert not problems, problems


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

        page.set_input_files("[data-testid=add-file]", str(_write_jsonl(tmp_path / "q.jsonl", ["six seven eight"])))
        page.fill("[data-testid=add-name]", "queued-form")
        page.click("[data-testid=add-submit]")
        page.locator("[data-testid=add-progress][data-status=queued]").wait_for()
        form_job = page.locator("[data-testid=add-progress]").get_attribute("data-job-id")
        page.click("[data-testid=add-cancel]")
        page.locator("[data-testid=add-progress][data-status=cancelled]").wait_for()
        assert page.locator("[data-testid=add-cancel]").is_hidden()
        assert http.get(f"/v1/jobs/{form_job}").json()["status"] == "cancelled"

        page.goto(f"{svc.url}/dashboard/#/jobs")
        page.locator(f"[data-testid=jobs-running] [data-testid=job-row][data-job-id='{job_id}'] "
                     "[data-testid=job-cancel]").click()
        page.locator(f"[data-testid=job-row][data-job-id='{job_id}'][data-status=cancelled]").wait_for()
        assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


def test_task_added_elsewhere_lands_on_the_open_atlas(service: _Service, page: Any) -> None:
    import httpx

    page.goto(f"{service.base}/dashboard/#/atlas")
    points = page.locator("[data-testid=atlas-point]")
    points.first.wait_for()
    before = points.count()
    # One job runs at a time: a long blocker keeps the new task queued while the page loads, so the page
    # sees it pending; cancelling the blocker lets it run and land while the page is open.
    blocker_texts = [f"Filler {i}: pour {i % 9 + 1} cups of water into the pot and stir slowly." for i in range(20000)]
    texts = [f"Recipe {i}: whisk {i % 4 + 1} eggs with sugar, fold in flour and bake for {20 + i} minutes."
             for i in range(40)]
    with httpx.Client(base_url=service.base, timeout=60) as http:
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


def test_task_page_routing_side_template_switch_rate_and_override(service: _Service, page: Any) -> None:
    import httpx

    names = ["Ada", "Bela", "Chen", "Dara", "Emil", "Fern", "Goran", "Hana", "Ivo", "Jana", "Kofi", "Lena"]
    texts = [f"The native language of {a} {b}son is ___ ." for a in names for b in names[:5]]  # 60 samples
    with httpx.Client(base_url=service.base, timeout=60) as http:
        r = http.post("/v1/tasks", json={"name": "native-language", "samples": [{"text": t} for t in texts]})
        assert r.status_code == 202, r.text
        task_id, job_id = r.json()["task"]["id"], r.json()["job"]["id"]
        deadline = time.monotonic() + 3 * JOB_TIMEOUT_S
        while http.get(f"/v1/jobs/{job_id}").json()["status"] != "succeeded":
            assert time.monotonic() < deadline, "the job did not finish"
            time.sleep(0.2)
        try:
            page.goto(f"{service.base}/dashboard/#/task/{task_id}")
            card = page.locator("[data-testid=task-routing]")
            state = card.locator("[data-testid=template-state]")
            state.wait_for()
            assert "active" in state.inner_text() and "not active" not in state.inner_text()
            assert card.locator("[data-testid=template-test]").inner_text() == "on"
            assert "calibrated" in card.inner_text()
            _shot(page, "task-routing")
            _sources_show_the_rho_bound(page, http, task_id)
            card.locator("[data-testid=template-toggle]").click()
            page.locator("[data-testid=template-toggle][data-on=false]").wait_for()
            assert card.locator("[data-testid=template-test]").inner_text() == "off"
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
    card.locator("[data-testid=routing-apply]").click()
    page.locator("[data-testid=routing-rate-state]", has_text="20 %").wait_for()
    after = http.get(f"/v1/tasks/{task_id}/routing").json()
    assert after["false_reject_rate"] == 0.2 and after["source"] == "calibrated"
    assert after["threshold_auto"] >= before["threshold_auto"]  # a higher rate never lowers the bound
    assert f"{after['threshold_auto']:.3f}" in card.locator("[data-testid=routing-threshold]").inner_text()

    card.locator("[data-testid=routing-override]").fill("0.9")
    card.locator("[data-testid=routing-apply]").click()
    page.locator("[data-testid=routing-threshold][data-source=override]").wait_for()
    got = http.get(f"/v1/tasks/{task_id}/routing").json()
    assert got["threshold_override"] == 0.9 and got["threshold"] == 0.9 and got["false_reject_rate"] == 0.2
    card.locator("[data-testid=routing-clear]").click()
    page.locator("[data-testid=routing-threshold][data-source=calibrated]").wait_for()
    got = http.get(f"/v1/tasks/{task_id}/routing").json()
    assert got["threshold_override"] is None and got["threshold"] == after["threshold_auto"]
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
