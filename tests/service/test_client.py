"""The client: one definition, two faces; every documented error code raises its typed error in both.

Real apps over real HTTP (uvicorn on free ports); the same scenario runs through the sync and the async
client.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from atlas import apikeys, repository
from service import client as c
from service.client.sync import public_methods
from tests.service.conftest import free_port

SAMPLES = [{"text": "the quick brown fox jumps over the lazy dog"}, {"text": "a second small sample of text"}]


def test_both_clients_expose_the_same_methods() -> None:
    sync, aio = public_methods(c.AtlasClient), public_methods(c.AsyncAtlasClient)
    assert set(sync) - {"close"} == set(aio) - {"aclose"}
    for name, fn in aio.items():
        if name == "aclose":
            continue
        assert inspect.signature(sync[name]).parameters.keys() == inspect.signature(fn).parameters.keys(), name
        assert sync[name].__doc__, name


def _run(kind: str, make: Callable[[], Any], action: Callable[[Any], Any]) -> Any:
    """Run ``action(client)`` with the sync client, or awaited with the async one."""
    if kind == "sync":
        with make() as cl:
            return action(cl)

    async def main() -> Any:
        async with make() as cl:
            out = action(cl)
            return await out if inspect.isawaitable(out) else out

    return asyncio.run(main())


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory, tiny_lm: Any) -> Any:
    from atlas.settings import Settings
    from service.app import create_app
    from tests.service.conftest import LiveServer

    base = tmp_path_factory.mktemp("client")
    started = []

    def start(**settings: Any) -> Any:
        values = {"data_dir": base / f"d{len(started)}", "sketch_dim": 256, "device": "cpu", **settings}
        lm = values.pop("lm", tiny_lm)
        server = LiveServer(create_app(Settings(**values), overrides={"lm": lm})).start()
        started.append(server)
        return server

    main = start(max_prompt_chars=200, prompt_max_pending=4)
    keyed = start(require_keys=True)
    no_model = start(lm=None)
    yield {"main": main, "keyed": keyed, "no_model": no_model}
    for s in started:
        s.stop()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_typed_errors(kind: str, services: Any) -> None:
    main, keyed, no_model = services["main"], services["keyed"], services["no_model"]
    url = main.url

    def client(u: str = url, **kw: Any) -> Callable[[], Any]:
        return lambda: (c.AtlasClient if kind == "sync" else c.AsyncAtlasClient)(u, **kw)

    created = _run(kind, client(), lambda cl: cl.add_task(f"fox-{kind}", samples=SAMPLES, wait=True))
    assert created.task.status == "ready" and created.job.status == "succeeded"
    tid = created.task.id
    cases: list[tuple[type[c.AtlasClientError], str, Callable[[], Any], Callable[[Any], Any]]] = [
        (c.NotFound, "not_found", client(), lambda cl: cl.get_task(10**9)),
        (c.Conflict, "conflict", client(), lambda cl: cl.add_task(f"fox-{kind}", samples=SAMPLES)),
        (c.InvalidInput, "invalid_input", client(), lambda cl: cl.route("   ")),
        (c.PayloadTooLarge, "payload_too_large", client(), lambda cl: cl.route("x" * 500)),
        (c.PayloadTooLarge, "payload_too_large", client(retries=1),
         lambda cl: cl.route([f"prompt {i} words" for i in range(9)])),  # more than the prompt queue holds
        (c.Unavailable, "model_unavailable", client(no_model.url, retries=1), lambda cl: cl.route("hello there")),
        (c.Unauthorized, "unauthorized", client(keyed.url), lambda cl: cl.list_tasks()),
        (c.Unreachable, "unreachable", client(f"http://127.0.0.1:{free_port()}", retries=1),
         lambda cl: cl.health()),
        (c.Unreachable, "unreachable", client(f"http://127.0.0.1:{free_port()}", retries=1),
         lambda cl: cl.ready()),  # it called httpx directly: a ConnectError escaped
    ]
    with keyed.app.state.container.store.session() as s:
        _, read_key = apikeys.create_api_key(s, f"read-{kind}", ["read"])
    cases.append((c.Forbidden, "forbidden", client(keyed.url, api_key=read_key),
                  lambda cl: cl.add_task("nope", samples=SAMPLES)))
    # A task of another space, and a task without a signature yet.
    store = main.app.state.container.store
    with store.session() as s:
        other = repository.get_or_create_space(
            s, model_fingerprint=f"other-{kind}", spec_fingerprint="spec", model_name="other", d=8, K=16, m=256,
            seed=0, spec={"d": 8, "K": 16, "m": 256, "seed": 0})
        from atlas.samples import Sample

        pending, _ = repository.create_task_with_job(s, other.id, f"pending-{kind}", "text", {}, [Sample(text="hi")])
        pending_id = pending.id
    cases.append((c.NotReady, "not_ready", client(), lambda cl: cl.sources(pending_id)))
    cases.append((c.NotReady, "not_ready", client(), lambda cl: cl.align(tid, pending_id)))
    for cls, code, make, action in cases:
        with pytest.raises(cls) as info:
            _run(kind, make, action)
        assert isinstance(info.value, c.AtlasClientError)
        assert info.value.code == code, (code, info.value)
        if cls in (c.RateLimited, c.Unavailable):
            assert info.value.retry_after is not None and info.value.retry_after >= 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_wait_job_times_out_while_the_progress_stream_is_quiet(kind: str, serve: Any, tiny_lm: Any) -> None:
    """A job that never moves (no runner here): the stream sends its state once, then keep-alive pings only;
    ``wait_job(timeout=1)`` must still raise TimeoutError near 1 s (it waited for the next event)."""
    import time

    svc = serve(lm=tiny_lm, overrides={"start_runner": False})
    make = lambda: (c.AtlasClient if kind == "sync" else c.AsyncAtlasClient)(svc.url)  # noqa: E731
    created = _run(kind, make, lambda cl: cl.add_task("stuck", samples=SAMPLES))
    assert created.job.status == "queued"
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        _run(kind, make, lambda cl: cl.wait_job(created.job.id, timeout=1.0))
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_incompatible_space(kind: str, services: Any, tiny_lm: Any) -> None:
    main = services["main"]
    store = main.app.state.container.store
    from atlas.samples import Sample
    from tests.atlas.fixtures import unit_vectors

    with store.session() as s:
        spaces = []
        for key in ("a", "b"):
            sp = repository.get_or_create_space(
                s, model_fingerprint=f"incompat-{kind}-{key}", spec_fingerprint="spec", model_name=key, d=8, K=16,
                m=256, seed=0, spec={"d": 8, "K": 16, "m": 256, "seed": 0})
            task, _ = repository.create_task_with_job(s, sp.id, f"{kind}-{key}", "text", {}, [Sample(text=key)])
            repository.store_task_result(s, task, state=b"x", signature=unit_vectors(1, 256)[0], baselines=None,
                                         n_samples=1, n_tokens=1)
            spaces.append(task.id)
    cl = c.AtlasClient if kind == "sync" else c.AsyncAtlasClient
    with pytest.raises(c.IncompatibleSpace) as info:
        _run(kind, lambda: cl(main.url), lambda x: x.align_matrix(spaces))
    for task_id, key in zip(spaces, ("a", "b"), strict=True):  # each task named by its space (it said only "different")
        assert f"{task_id} ({kind}-{key})" in info.value.message, info.value.message


def test_reads_are_retried_after_retry_after(services: Any) -> None:
    """A read answered 503 with Retry-After is retried (here it stays unavailable: 2 attempts, then raised)."""
    import time

    no_model = services["no_model"]
    with c.AtlasClient(no_model.url, retries=2) as cl:
        t0 = time.monotonic()
        with pytest.raises(c.Unavailable):
            cl.route("hello there")
        assert time.monotonic() - t0 >= 0.9  # waited the server's Retry-After (1 s) once
