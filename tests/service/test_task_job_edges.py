"""Edges of the task and job endpoints: name-prefix listing, idempotency keys, consistent pages."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atlas.samples import Sample

ALPHABET = "aAbB_%\\üÜ"
NAMES = ["ab", "AB", "aB", "Ab", "a_b", "a%b", "a\\b", "axb", "üa", "Üa", "b", "B_", "%", "_"]


def _create(http: httpx.Client, name: str, key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return http.post("/v1/tasks", json={"name": name, "samples": [{"text": "a b c"}]}, headers=headers)


def test_name_prefix_is_case_sensitive_and_literal(serve, tiny_lm) -> None:
    # SQLite's LIKE ignores ASCII case: ?name_prefix=AB listed "ab" and "aB" (PostgreSQL did not)
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        for name in NAMES:
            assert _create(http, name).status_code == 202

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(prefix=st.text(alphabet=ALPHABET, min_size=1, max_size=3), exact=st.sampled_from([None, *NAMES]))
        def check(prefix: str, exact: str | None) -> None:
            params: dict[str, Any] = {"name_prefix": prefix, "limit": 1000}
            if exact is not None:
                params["name"] = exact
            r = http.get("/v1/tasks", params=params)
            assert r.status_code == 200, r.text
            got = [t["name"] for t in r.json()["items"]]
            want = [n for n in NAMES if n.startswith(prefix) and (exact is None or n == exact)]
            assert got == want and r.json()["total"] == len(want), (prefix, exact, got)

        check()
        # a decomposed prefix finds the name stored in NFC, as an exact name does (it found nothing)
        assert _create(http, "caf\u00e9 au lait").status_code == 202
        for prefix in ("cafe\u0301", "caf\u00e9", "cafe\u0301 au"):
            got = [t["name"] for t in http.get("/v1/tasks", params={"name_prefix": prefix}).json()["items"]]
            assert got == ["caf\u00e9 au lait"], (prefix, got)


def test_listing_by_ids_filters_with_every_other_filter(serve, tiny_lm) -> None:
    """``GET /v1/tasks?id=…`` (the dashboard's map reads its tasks so, in a bounded number of requests at any size: a
    scale review found the map listing only the 2,000 oldest tasks) lists exactly the stored tasks of those ids, with
    the other filters; more than 1,000 ids is a 422; the client's ``ids`` sends the same request."""
    from service.client import AtlasClient

    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        stored = {}
        for name in NAMES:
            r = _create(http, name)
            assert r.status_code == 202, r.text
            stored[r.json()["task"]["id"]] = name

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(ids=st.lists(st.integers(1, max(stored) + 3), max_size=12),
               prefix=st.sampled_from([None, "a", "A", "_"]), limit=st.integers(1, 5))
        def check(ids: list[int], prefix: str | None, limit: int) -> None:
            params: dict[str, Any] = {"id": ids, "limit": limit}
            if prefix is not None:
                params["name_prefix"] = prefix
            r = http.get("/v1/tasks", params=params)
            assert r.status_code == 200, r.text
            chosen = sorted(set(ids)) if ids else sorted(stored)  # no id parameter: no id filter
            want = [t for t in chosen if t in stored and (prefix is None or stored[t].startswith(prefix))]
            assert r.json()["total"] == len(want)
            assert [t["id"] for t in r.json()["items"]] == want[:limit]

        check()
        assert http.get("/v1/tasks", params={"id": list(range(1, 1002))}).status_code == 422
        for bad in ("x", "0", "-1", "9223372036854775808", "99999999999999999999"):  # past int64: a 500 before
            assert http.get("/v1/tasks", params={"id": bad}).status_code == 422, bad
        assert http.get("/v1/tasks", params={"id": list(range(1, 1001))}).json()["total"] == len(stored)
    with AtlasClient(svc.url) as client:
        some = sorted(stored)[::3]
        assert [t.id for t in client.list_tasks(ids=some, limit=100).items] == some
        assert [t.name for t in client.list_tasks(ids=some, name=stored[some[1]]).items] == [stored[some[1]]]
        assert client.list_tasks(ids=[]).total == 0  # none of no ids (httpx sends no parameter: every task, before)


def test_replayed_request_whose_wakeup_fails_keeps_the_first_task(serve, tiny_lm) -> None:
    # a retried request (same key) whose wake-up failed took back what the FIRST request stored
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        created = _create(http, "kept", key="create-key")
        assert created.status_code == 202, created.text
        task_id = created.json()["task"]["id"]
        append = {"samples": [{"text": "more"}]}
        appended = http.post(f"/v1/tasks/{task_id}/samples", json=append, headers={"Idempotency-Key": "append-key"})
        assert appended.status_code == 202, appended.text

        class Down:
            def enqueue(self, job_id: int, serving_key: str | None = None) -> None:
                raise ConnectionError("broker down")

            def depth(self) -> int:
                return 0

        tasks = svc.container.tasks
        real, tasks.queue = tasks.queue, Down()
        try:
            again = http.post(f"/v1/tasks/{task_id}/samples", json=append, headers={"Idempotency-Key": "append-key"})
            assert again.status_code == 202 and again.json()["job"]["id"] == appended.json()["job"]["id"]
            again = _create(http, "kept", key="create-key")
            assert again.status_code == 202 and again.json()["task"]["id"] == task_id
            # a new request still takes back what it wrote when its wake-up fails: 503 (the broker, not a full queue:
            # a 429 queue_full made clients back off as if the service were overloaded)
            down = _create(http, "new")
            assert down.status_code == 503 and down.json()["code"] == "queue_unavailable", down.text
            assert "nothing was stored" in down.json()["message"] and down.headers["retry-after"] == "5"
        finally:
            tasks.queue = real
        assert http.get(f"/v1/tasks/{task_id}").status_code == 200
        assert http.get(f"/v1/jobs/{appended.json()['job']['id']}").status_code == 200
        assert http.get("/v1/tasks", params={"name": "new"}).json()["total"] == 0


def test_exact_name_filter_is_normalised_like_a_stored_name(serve, tiny_lm) -> None:
    # stored names are stripped; ?name=%20abc%20 found nothing
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        assert _create(http, " abc ").status_code == 202
        for query in ("abc", " abc ", "abc "):
            items = http.get("/v1/tasks", params={"name": query}).json()["items"]
            assert [t["name"] for t in items] == ["abc"], query


def test_empty_idempotency_key_is_no_key(serve, tiny_lm) -> None:
    # an empty key was one key shared by every request: the second task got 409 "key already used"
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        assert _create(http, "one", key="").status_code == 202
        assert _create(http, "two", key="").status_code == 202
        assert _create(http, "four", key="k").status_code == 202
        assert _create(http, "four", key="k").status_code == 202  # a replay of "four"
        assert http.get("/v1/tasks").json()["total"] == 3


def test_list_pages_are_one_snapshot_on_postgresql(serve, tiny_lm, pg_database) -> None:
    # READ COMMITTED counted `total` and read the items in two snapshots: len(items) > total under inserts
    svc = serve(lm=tiny_lm, database_url=pg_database(), max_queued_jobs=100_000, overrides={"start_runner": False})
    c = svc.container
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            c.tasks.create(f"w{i}", "text", None, [Sample(text="a b")])
            i += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        deadline, checks = time.monotonic() + 8.0, 0
        while time.monotonic() < deadline and checks < 300:
            tasks = c.tasks.page(limit=1000)
            jobs = c.jobs.page(limit=1000)
            assert len(tasks.items) == min(tasks.total, 1000), (len(tasks.items), tasks.total)
            assert len(jobs.items) == min(jobs.total, 1000), (len(jobs.items), jobs.total)
            checks += 1
    finally:
        stop.set()
        thread.join(timeout=30)


def test_appending_the_samples_a_task_already_holds_is_a_conflict(serve, tiny_lm) -> None:
    """Appending the file a task was made from counted every sample twice, silently (n_samples 60 -> 120, the
    threshold moved); the same upload is now refused with 409 naming the job that holds it. Other samples, or
    the same ones after a cancelled append, are taken."""
    from service.client import AtlasClient
    from service.client.errors import Conflict

    svc = serve(lm=tiny_lm, sketch_dim=256)
    first = [f"sample number {i} of the first upload" for i in range(6)]
    with AtlasClient(svc.url) as c:
        created = c.add_task("twice", samples=first, wait=True)
        with pytest.raises(Conflict, match=f"job {created.job.id} added the same upload") as info:
            c.append(created.task.id, samples=first)
        assert info.value.status == 409 and info.value.detail["job_id"] == created.job.id
        assert c.get_task(created.task.id).n_samples == 6
        more = [f"another sample {i}" for i in range(3)]
        c.append(created.task.id, samples=more, wait=True)
        assert c.get_task(created.task.id).n_samples == 9
        assert c.list_jobs(task_id=created.task.id).total == 2


@pytest.mark.parametrize("name", ["esc\x1b]0;PWNED\x07\x1b[2J", "two\nlines", "tab\there", "del\x7f", "c1\x85x",
                                  "rlo\u202eevil", "ls\u2028name", "para\u2029graph"])
def test_a_task_name_with_control_characters_is_refused(serve, tiny_lm, name: str) -> None:
    """An escape sequence in a task name retitled and cleared the terminal of whoever ran `tasks list`, a newline
    forged a line of its output; such names are 422 now, storing nothing. Unicode's line and paragraph separators
    too (they were taken, while the refusal said names hold no newline: a review, 2026-12-07); an export's name is
    imported (a store of names taken before 2026-11-25 was refused by its own import: an upgrade review, 2026-12-07),
    its separators kept and every other control character written as its escape (kept, a newline forged a row of
    ``tasks list``: a diff review, 2026-12-07)."""
    from atlas.samples import control_chars
    from atlas.task_names import normalize_name

    imported = normalize_name(name, imported=True)
    if "\u2028" in name or "\u2029" in name:
        assert imported == name
    else:
        assert not control_chars(imported) and "\\u" in imported
    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    r = httpx.post(f"{svc.url}/v1/tasks", json={"name": name, "samples": [{"text": "hello there friend"}]})
    assert r.status_code == 422 and "control characters" in r.json()["message"], r.text
    assert httpx.get(f"{svc.url}/v1/tasks").json()["total"] == 0


@pytest.mark.parametrize("name", ["chem\u200b", "\ufeffchem", "chem\u2060", "rlm\u200fx", "soft\u00adhyphen"])
def test_a_task_name_with_invisible_characters_is_refused(serve, tiny_lm, name: str) -> None:
    """``chem`` and ``chem\\u200b`` looked the same in every listing and were two tasks. The message names the
    character and its place (the CLI and the client show the message alone, and a direction mark that an RTL
    keyboard typed cannot be seen: an i18n review, 2026-12-07)."""
    import unicodedata

    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    r = httpx.post(f"{svc.url}/v1/tasks", json={"name": name, "samples": [{"text": "hello there friend"}]})
    assert r.status_code == 422 and "invisible characters" in r.json()["message"], r.text
    bad = next(c for c in name if not c.isalnum())
    said = f"U+{ord(bad):04X} {unicodedata.name(bad)} at character {name.index(bad) + 1}"
    assert said in r.json()["message"], r.text


def test_none_is_no_task_name(serve, tiny_lm) -> None:
    """``fit`` reads the label "none" (any case) as "the prompt belongs to no task": a task so named could not be
    labelled by name, and its prompts would count as foreign. Creating a task so named is a 422 (an import keeps
    such a name from an older export: the task is labelled by its id)."""
    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    for name in ("none", " None ", "NONE", "nOnE"):
        r = httpx.post(f"{svc.url}/v1/tasks", json={"name": name, "samples": [{"text": "hello there friend"}]})
        assert r.status_code == 422 and "labels a prompt of no task" in r.json()["message"], r.text
    r = httpx.post(f"{svc.url}/v1/tasks", json={"name": "none of these", "samples": [{"text": "hello there friend"}]})
    assert r.status_code == 202, r.text


def test_task_names_are_one_unicode_form_and_joiners_are_kept(serve, tiny_lm) -> None:
    """A decomposed ``café`` (e + U+0301) is stored composed: it is the same name as the composed one, and either
    spelling finds it; zero-width joiners (emoji sequences, Persian) stay valid."""
    import unicodedata

    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    nfd, nfc = unicodedata.normalize("NFD", "café_任务"), unicodedata.normalize("NFC", "café_任务")
    assert nfd != nfc
    r = httpx.post(f"{svc.url}/v1/tasks", json={"name": nfd, "samples": [{"text": "hello there friend"}]})
    assert r.status_code == 202 and r.json()["task"]["name"] == nfc, r.text
    again = httpx.post(f"{svc.url}/v1/tasks", json={"name": nfc, "samples": [{"text": "hello there friend"}]})
    assert again.status_code == 409, again.text
    for spelling in (nfd, nfc):
        found = httpx.get(f"{svc.url}/v1/tasks", params={"name": spelling}).json()
        assert [t["name"] for t in found["items"]] == [nfc]
    for name in ("👩\u200d💻 coders", "می\u200cخواهم"):
        r = httpx.post(f"{svc.url}/v1/tasks", json={"name": name, "samples": [{"text": "hello there friend"}]})
        assert r.status_code == 202 and r.json()["task"]["name"] == name, r.text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_the_cli_prints_no_control_character_but_newline_and_tab(text: str) -> None:
    """What the CLI prints of names and messages stored elsewhere (an older store, another server) cannot act on
    the terminal: every control character but newline and tab, and every bidi override, is escaped."""
    import unicodedata

    from atlas.samples import BIDI_CONTROLS, INVISIBLE_CHARS
    from service.cli.common import terminal_safe

    def acts(c: str) -> bool:
        return unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in BIDI_CONTROLS or c in INVISIBLE_CHARS

    out = terminal_safe(text)
    assert all(c in "\n\t" or not acts(c) for c in out)
    if not any(acts(c) for c in text.replace("\n", "").replace("\t", "")):
        assert out == text


def test_an_upload_whose_every_sample_is_blank_is_refused_at_once(serve, tiny_lm, tmp_path) -> None:
    """Every sample blank (whitespace only, Unicode's too): the upload was accepted and its job failed later with
    "no usable tokens" (a create left a failed task behind); it is refused with 422 now, as JSON, as a file and in
    either mode, storing nothing. One non-blank sample among blank ones is taken."""
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    blank = ["", " ", "\u2028", "\t\x85 \x1c"]
    jsonl = tmp_path / "blank.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in blank), encoding="utf-8")
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        refused = [
            http.post("/v1/tasks", json={"name": "b1", "samples": [{"text": t} for t in blank]}),
            http.post("/v1/tasks", json={"name": "b2", "mode": "completion",
                                         "samples": [{"prompt": "Question: why?", "completion": t} for t in blank]}),
            http.post("/v1/tasks", data={"name": "b3"}, files={"file": ("blank.jsonl", jsonl.read_bytes())}),
        ]
        for r in refused:
            assert r.status_code == 422 and r.json()["code"] == "invalid_input", r.text
            assert "every sample is blank (4 sample(s))" in r.json()["message"], r.text
        kept = http.post("/v1/tasks", json={"name": "k", "samples": [{"text": " "}, {"text": "a real sample"}]})
        assert kept.status_code == 202, kept.text
        r = http.post(f"/v1/tasks/{kept.json()['task']['id']}/samples", json={"samples": [{"text": "\u2028"}]})
        assert r.status_code == 422 and "every sample is blank" in r.json()["message"], r.text
        assert [t["name"] for t in http.get("/v1/tasks").json()["items"]] == ["k"]
        assert http.get("/v1/jobs").json()["total"] == 1


@pytest.mark.parametrize("status", ["queued", "running", "succeeded", "failed", "cancelled"])
def test_a_job_that_nothing_runs_has_no_time_left(status: str) -> None:
    """A cancelled job kept its last heartbeat's estimate (``eta_s`` 10.2 after it ended), and so did a job queued
    again after its worker died (reviews)."""
    import datetime as dt

    from atlas.models import Job
    from service.views import job_out

    progress = {"samples_done": 20, "samples_total": 40, "tokens": 900, "tokens_per_s": 88.0, "eta_s": 10.156,
                "tokens_streamed": 1500}
    job = Job(id=7, kind="create", task_id=3, upload_id=1, status=status, progress=progress, attempts=1,
              cancel_requested=status == "cancelled", created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    eta = job_out(job).progress.eta_s
    assert eta == (None if status in ("queued", "failed", "cancelled") else 10.156), (status, eta)


def test_a_multipart_field_the_route_does_not_read_is_refused(serve, tiny_lm) -> None:
    """A misspelt field ("metdata") was dropped: the task was made without the user's metadata, and of two "name"
    fields the last silently won; an append's "metadata" or "name" was dropped too (a review, 2026-12-07). A JSON
    body's unknown key was a 422 already; a form's is now, naming the field, and nothing is stored."""
    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    file = {"file": ("one.jsonl", b'{"text": "hello there friend"}\n', "application/x-ndjson")}
    with httpx.Client(base_url=svc.url, timeout=30) as http:
        r = http.post("/v1/tasks", data={"name": "typo-meta", "metdata": '{"domain": "chem"}'}, files=file)
        assert r.status_code == 422 and "unknown form field(s) 'metdata'" in r.json()["message"], r.text
        assert r.json()["detail"]["allowed"] == ["file", "name", "mode", "space", "metadata"]
        r = http.post("/v1/tasks", data={"name": ["first", "second"]}, files=file)
        assert r.status_code == 422 and "'name' given more than once" in r.json()["message"], r.text
        assert http.get("/v1/tasks").json()["total"] == 0
        r = http.post("/v1/tasks", data={"name": "ok", "metadata": '{"domain": "chem"}'}, files=file)
        assert r.status_code == 202 and r.json()["task"]["metadata"] == {"domain": "chem"}, r.text
        task_id = r.json()["task"]["id"]
        r = http.post(f"/v1/tasks/{task_id}/samples", data={"metadata": '{"a": 1}'}, files=file)
        assert r.status_code == 422 and "this upload takes 'file'" in r.json()["message"], r.text
