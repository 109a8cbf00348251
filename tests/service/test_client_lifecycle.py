"""The Python clients' lifecycle and inputs, found by a review of the client (2026-11-29), over real HTTP.

* A script that never closed its ``AtlasClient`` never exited (the loop ran in a non-daemon thread).
* Leaving ``job_events`` early left its stream open: after 16 the service refused more (429) until the job ended.
* ``wait_job(timeout=3)`` against a service that does not answer took three request timeouts per poll.
* A closed client raised ``RuntimeError``; NaN in a body a ``ValueError``; an id ``"1/../2"`` reached task 2.
"""

from __future__ import annotations

import asyncio
import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.client import AsyncAtlasClient, AtlasClient, ClientClosed, InvalidInput

ROOT = Path(__file__).resolve().parents[2]


def test_a_script_that_never_closes_its_client_exits(serve: Any, tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm)
    script = ("from service.client import AtlasClient\n"
              f"c = AtlasClient({svc.url!r})\n"
              "print(c.health().status)\n")  # no close(), no with: as in a notebook or a quick script
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_leaving_job_events_early_closes_its_stream(serve: Any, tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm, max_event_streams_per_client=2, overrides={"start_runner": False})  # the job waits
    with AtlasClient(svc.url) as c:
        created = c.add_task("prose", samples=["The fox jumps over the dog.", "A cat sleeps on the mat."])
        for _ in range(6):  # three times the cap: each early exit gives its slot back
            deadline = time.monotonic() + 10
            while True:
                try:
                    for job in c.job_events(created.job.id):
                        assert job.status == "queued"
                        break
                    break
                except Exception as exc:  # a slot given back a moment after the client left: retried briefly
                    assert "429" in str(exc) and time.monotonic() < deadline, exc
                    time.sleep(0.2)


def test_a_closed_client_says_so(serve: Any, tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm)
    c = AtlasClient(svc.url)
    assert c.health().status == "ok"
    c.close()
    c.close()  # again: nothing
    with pytest.raises(ClientClosed):
        c.health()
    with pytest.raises(ClientClosed):
        next(iter(c.job_events(1)))

    async def closed_async() -> None:
        async with AsyncAtlasClient(svc.url) as ac:
            assert (await ac.health()).status == "ok"
        with pytest.raises(ClientClosed):
            await ac.health()

    asyncio.run(closed_async())


def test_ids_and_numbers_are_checked_before_anything_is_sent(serve: Any, tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm)
    with AtlasClient(svc.url) as c:
        for bad in ("1/../2", "2?x=1", "", 1.5, True, None):
            with pytest.raises(InvalidInput, match="must be an integer"):
                c.get_task(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="must be an integer"):
            c.delete_task("3/../1")  # type: ignore[arg-type]
        # the ids of a pair and of a matrix too: a name, a bool ("b=true"), or a collection without an order
        for a, b in (("prose", 1), (1, True), (1, 2.0)):
            with pytest.raises(InvalidInput, match="must be an integer"):
                c.align(a, b)  # type: ignore[arg-type]
        for ids in ([1, "prose"], [True, 2]):
            with pytest.raises(InvalidInput, match="must be an integer"):
                c.align_matrix(ids)  # type: ignore[arg-type]
        for unordered in ({1, 2}, frozenset({1, 2}), {1: 2}.keys(), {1: 2}, "12", 12):
            with pytest.raises(InvalidInput, match="must be a list or tuple of integers"):
                c.align_matrix(unordered)  # type: ignore[arg-type]
        assert c.get_job  # a well-formed id string is taken: what a CLI argument gives
        for value in (math.nan, math.inf):
            with pytest.raises(InvalidInput, match="cannot be sent as JSON"):
                c.route("a prompt of a few words", threshold=value)
        with pytest.raises(InvalidInput, match="cannot be sent as JSON"):
            c.add_task("meta", samples=["The fox jumps over the dog."], metadata={"tags": {1, 2}})
        assert c.list_tasks().total == 0  # nothing reached the service


@pytest.fixture
def silent_service() -> Iterator[str]:
    """A TCP server that accepts connections and never answers (a hung service)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_wait_job_is_bounded_by_its_timeout_when_the_service_does_not_answer(silent_service: str) -> None:
    with AtlasClient(silent_service, timeout=20) as c:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.wait_job(1, timeout=2)
        assert time.monotonic() - t0 < 10  # was about 2 + 3 × 20 s (a poll's retries, each a full request timeout)


def test_a_progress_callback_calling_the_client_is_refused_not_deadlocked(serve: Any, tiny_lm: Any) -> None:
    """The callback runs on the client's loop thread: a blocking call from it would wait on that thread for good."""
    svc = serve(lm=tiny_lm)
    outcome: list[BaseException | None] = []

    def run() -> None:
        with AtlasClient(svc.url) as c:
            try:
                c.add_task("prose", samples=["The fox jumps over the dog.", "A cat sleeps on the mat."], wait=True,
                           on_progress=lambda job: c.get_job(job.id))
                outcome.append(None)
            except BaseException as exc:  # what the caller sees
                outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "deadlocked"
    assert isinstance(outcome[0], RuntimeError) and "progress callback" in str(outcome[0]), outcome


def test_an_export_is_streamed_to_its_file_whole_or_not_at_all(serve: Any, tiny_lm: Any, tmp_path: Path) -> None:
    """``export_space`` holds the whole export in memory (an export may be up to 1 GiB); ``download_export`` (the
    CLI's ``export``) streams it into the file, through a temporary file beside it."""
    from service.client import NotFound

    svc = serve(lm=tiny_lm)
    with AtlasClient(svc.url) as c:
        c.add_task("prose", samples=["The fox jumps over the dog.", "A cat sleeps on the mat."], wait=True)
        exports = tmp_path / "exports"
        exports.mkdir()
        out = exports / "space.jsonl"
        written = c.download_export(out)
        assert written == out.stat().st_size > 0
        task_lines = out.read_bytes().splitlines()[1:-1]  # the header's time and so the trailer's checksum differ
        assert len(task_lines) == 1 and task_lines == c.export_space().splitlines()[1:-1]
        with pytest.raises(NotFound):
            c.download_export(exports / "other.jsonl", space=999)
        assert sorted(p.name for p in exports.iterdir()) == ["space.jsonl"]  # nothing half-written


def test_an_async_client_outlives_the_event_loops_it_is_used_on(serve: Any, tiny_lm: Any) -> None:
    """``asyncio.run`` a call per notebook cell (each its own loop): the second call raised a bare ``RuntimeError:
    Event loop is closed``. Now each new loop gets a fresh pool; a second loop while the first still runs is told
    apart; ``aclose`` from a later loop closes it."""
    from service.client import AtlasClientError

    svc = serve(lm=tiny_lm)
    client = AsyncAtlasClient(svc.url)
    assert asyncio.run(client.health()).status == "ok"
    assert asyncio.run(client.health()).status == "ok"  # a new loop: was RuntimeError('Event loop is closed')
    assert asyncio.run(client.list_tasks()).total == 0
    asyncio.run(client.aclose())  # from a later loop than the one its pool last ran on
    with pytest.raises(ClientClosed):
        asyncio.run(client.health())

    # loops made by hand and left unclosed: one that has stopped has ended too (it was told "still runs")
    by_hand = AsyncAtlasClient(svc.url)
    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:
        for loop in loops:
            assert loop.run_until_complete(by_hand.health()).status == "ok"
        loops[1].run_until_complete(by_hand.aclose())
    finally:
        for loop in loops:
            loop.close()

    shared = AsyncAtlasClient(svc.url)
    started, finish = threading.Event(), threading.Event()

    async def hold() -> None:  # a loop that keeps running in another thread, the client used on it
        await shared.health()
        started.set()
        while not finish.is_set():
            await asyncio.sleep(0.02)
        await shared.aclose()

    thread = threading.Thread(target=lambda: asyncio.run(hold()))
    thread.start()
    try:
        assert started.wait(30)
        with pytest.raises(AtlasClientError) as other:
            asyncio.run(shared.health())
        assert other.value.code == "wrong_event_loop" and "one client per event loop" in other.value.message
    finally:
        finish.set()
        thread.join(30)


def test_the_client_reads_its_timeout_from_the_cli_variable(silent_service: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``FISHER_ATLAS_TIMEOUT`` set for the CLI left a script's client at 60 s (an operations review, 2026-12-07)."""
    from service.client import AtlasClientError

    monkeypatch.setenv("FISHER_ATLAS_TIMEOUT", "0.5")
    with AtlasClient(silent_service, retries=1) as c:
        t0 = time.monotonic()
        with pytest.raises(AtlasClientError) as caught:
            c.get_task(1)
        assert caught.value.code == "timed_out" and time.monotonic() - t0 < 5
    with AtlasClient(silent_service, retries=1, timeout=30) as c:  # an argument wins
        assert c._async._pool_settings["timeout"] == 30
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv("FISHER_ATLAS_TIMEOUT", bad)
        with pytest.raises(InvalidInput, match="FISHER_ATLAS_TIMEOUT must be a positive number"):
            AtlasClient(silent_service)
