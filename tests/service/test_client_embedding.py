"""The Python client embedded in applications (a review as a developer, 2026-12-07); each case failed before its fix.

* ``close()`` from one thread left another thread's ``wait_job`` blocked for good; a progress callback calling
  ``close()`` or ``job_events`` hung the client.
* ``ready()`` after ``aclose()``, a body that is not the encoding it claims, and a progress event that is not a job
  let raw ``RuntimeError`` / ``httpx.DecodingError`` / pydantic errors out.
* ``download_export`` wrote an empty answer or a cut-off export as the export, and two downloads to one path shared
  one temporary file.
* A key with a line break was "unreachable" (and echoed); metadata that is not JSON raised ``TypeError``; sample
  dicts with extra keys were refused (files and the library ignore them); ``set_threshold(True)`` stored 1.0;
  ``wait_job(timeout=0)`` called a finished job still running.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from service.client import AsyncAtlasClient, AtlasClient, AtlasClientError, ClientClosed, InvalidInput

PROSE = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs.",
         "The brown fox and the dog are friends.", "The fox jumps over the fence by the road."]


@pytest.fixture
def fake(fake_http: Any) -> Any:
    """A real HTTP server that is not FisherAtlas (``tests/service/conftest.fake_http``)."""
    return fake_http


def _in_thread(call: Any, seconds: float) -> BaseException | None:
    """What ``call`` raised in a thread of its own (``None``: nothing), failing the test if it still runs after
    ``seconds`` (a hang must fail the test, not the suite)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return outcome[0]


def test_closing_from_another_thread_ends_a_wait_and_callbacks_cannot_hang_the_client(serve: Any,
                                                                                      tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})  # no runner: the job stays queued
    client = AtlasClient(svc.url, retries=1)
    job = client.add_task("waits", samples=PROSE).job.id
    for callback in (lambda j: next(iter(client.job_events(job))), lambda j: client.close()):
        raised = _in_thread(lambda cb=callback: client.wait_job(job, timeout=10, on_progress=cb), 30)
        assert isinstance(raised, RuntimeError) and "cannot call the client" in str(raised), raised
    assert client.health().status == "ok"  # the client still works
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            client.wait_job(job, timeout=60)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    deadline = time.monotonic() + 30
    while svc.container.event_streams.open == 0:  # the waiter follows the job's stream
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.close()
    waiter.join(10)
    assert not waiter.is_alive() and outcome and isinstance(outcome[0], ClientClosed), outcome


def test_answers_the_client_cannot_read_are_its_errors(fake: Any, tmp_path: Path) -> None:
    url = fake({"/healthz": (200, {"content-encoding": "gzip", "content-type": "application/json"}, b"not gzip"),
                "/v1/jobs/1/events": (200, {"content-type": "text/event-stream"}, b"event: progress\ndata: {}\n\n"),
                "/v1/spaces/default/export": (200, {"content-type": "application/x-ndjson"}, b"")})
    with AtlasClient(url, retries=1) as client:
        with pytest.raises(AtlasClientError) as err:
            client.health()
        assert err.value.code == "unexpected_answer"
        with pytest.raises(AtlasClientError) as err:
            next(iter(client.job_events(1)))
        assert err.value.code == "unexpected_answer" and "not a job" in err.value.message
        target = tmp_path / "space.jsonl"
        with pytest.raises(AtlasClientError, match="not a whole export"):
            client.download_export(target)
        assert not target.exists() and list(tmp_path.iterdir()) == []  # nothing written, no temporary file left

    async def after_close() -> None:
        client = AsyncAtlasClient(url)
        await client.aclose()
        with pytest.raises(ClientClosed):
            await client.ready()

    asyncio.run(after_close())


def test_a_cut_off_export_is_refused_and_the_old_file_kept(serve: Any, tiny_lm: Any, fake: Any,
                                                           tmp_path: Path) -> None:
    svc = serve(lm=tiny_lm)
    with AtlasClient(svc.url) as client:
        client.add_task("prose", samples=PROSE, wait=True)
        whole = client.export_space()
        target = tmp_path / "space.jsonl"

        async def three() -> list[int]:
            async with AsyncAtlasClient(svc.url) as a:
                return list(await asyncio.gather(*(a.download_export(target) for _ in range(3))))

        assert asyncio.run(three()) == [len(whole)] * 3  # one path, three downloads: each its own temporary file
        assert target.read_bytes().splitlines()[1:-1] == whole.splitlines()[1:-1]
    cut = fake({"/v1/spaces/default/export": (200, {"content-type": "application/x-ndjson"}, whole[:-40])})
    with AtlasClient(cut, retries=1) as client:
        with pytest.raises(AtlasClientError, match="not a whole export"):
            client.download_export(target)
        with pytest.raises(AtlasClientError, match="not a whole export"):
            client.export_space()
    assert target.read_bytes().splitlines()[1:-1] == whole.splitlines()[1:-1]  # the previous export is kept


def test_inputs_are_checked_as_the_library_checks_them(serve: Any, tiny_lm: Any, tmp_path: Path) -> None:
    svc = serve(lm=tiny_lm)
    with pytest.raises(InvalidInput) as err:
        AtlasClient(svc.url, api_key="fa_secret_key\n")
    assert "fa_secret" not in err.value.message
    samples = tmp_path / "s.jsonl"
    samples.write_text("".join(json.dumps({"text": t}) + "\n" for t in PROSE))
    with AtlasClient(svc.url) as client:
        with pytest.raises(InvalidInput, match="cannot be sent as JSON"):
            client.add_task("x", samples, metadata={"s": {1}})
        created = client.add_task("prose", samples=[{"text": t, "id": i} for i, t in enumerate(PROSE)], wait=True)
        assert created.task.n_samples == len(PROSE)  # extra keys ignored, as in a file and in the library
        task = created.task.id
        for bad in (True, "0.3", None, [0.1]):
            with pytest.raises(InvalidInput, match="is a number"):
                client.set_false_reject_rate(task, bad)  # type: ignore[arg-type]
        for bad in (True, "0.3"):
            with pytest.raises(InvalidInput, match="is a number"):
                client.set_threshold(task, bad)  # type: ignore[arg-type]
        assert client.wait_job(created.job.id, timeout=0).status == "succeeded"  # was "still running"
