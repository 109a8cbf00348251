"""The embedded prompt service: micro-batching equals one-at-a-time, bounded queue, concurrency over HTTP.

Real parts only: a tiny GPT-2 saved to disk and loaded with transformers, the real FisherSketch
projections, a real uvicorn server.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from atlas import analysis
from atlas.errors import InvalidInput, QueueFull
from atlas.samples import Sample
from fishersketch import Sketcher
from workers.extraction import Extractor
from workers.prompt_batcher import PromptBatcher

WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "ember", "cloud", "north", "seven", "quiet"]


def _prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40))) for _ in range(n)]


def _batched(extractor: Extractor, prompts: list[str], token_budget: int) -> list[Any]:
    """The prompts' states from one micro-batching :class:`PromptBatcher` (closed after)."""
    batcher = PromptBatcher(extractor, max_batch=64, token_budget=token_budget)
    try:
        return batcher.sketch_sync(prompts)
    finally:
        batcher.close()


@pytest.fixture(scope="module")
def extractor(tiny_lm: Any) -> Extractor:
    return Extractor(tiny_lm, Sketcher(tiny_lm.make_spec(m=256)))


def test_batched_equals_sequential(extractor: Extractor) -> None:
    """A prompt's state is the same alone or inside a batch of 64 mixed-length prompts, and so are the
    route answers computed from them."""
    prompts = _prompts(64, seed=1)
    batched = _batched(extractor, prompts, token_budget=512)  # several length buckets
    alone = [extractor.prompt(p).state for p in prompts]
    assert len(batched) == 64
    for b, a in zip(batched, alone, strict=True):
        scale = max(np.abs(a.sums).max(), 1e-12)
        assert np.abs(b.sums - a.sums).max() / scale < 1e-5
        np.testing.assert_allclose(b.signature(), a.signature(), atol=1e-5)
        assert b.token_counts.tolist() == a.token_counts.tolist()
        assert b.sample_counts.tolist() == a.sample_counts.tolist()
        np.testing.assert_allclose(b.sq_norms, a.sq_norms, rtol=1e-5)
    # Route answers over four "tasks" (states of prompt groups) are identical either way.
    tasks = []
    for t in range(4):
        st = extractor.extract([Sample(text=p) for p in _prompts(12, seed=100 + t)]).state
        tasks.append(analysis.Candidate(t + 1, f"t{t}", st, 0.0, analysis.state_view(st)))
    for b, a in zip(batched, alone, strict=True):
        rb = analysis.rerank_route(b, tasks, k=4, threshold=-1.0)
        ra = analysis.rerank_route(a, tasks, k=4, threshold=-1.0)
        assert [m.task_id for m in rb.matches] == [m.task_id for m in ra.matches]
        np.testing.assert_allclose([m.score for m in rb.matches], [m.score for m in ra.matches], atol=1e-5)


def test_job_prompt_side_equals_one_prompt_at_a_time(extractor: Extractor, monkeypatch: pytest.MonkeyPatch) -> None:
    """A completion job's prompt-side pass sketches its prompts in batches (windows of ``PROMPT_WINDOW``): its sum
    and held-out states equal sketching every prompt alone (what it did, one forward each); unusable prompts are
    left out."""
    from workers import calibration

    monkeypatch.setattr(calibration, "PROMPT_WINDOW", 7)  # several windows
    texts = _prompts(40, seed=11)
    samples = [Sample(prompt=t, completion=" yes") for t in texts]
    samples[3] = Sample(prompt="   ", completion=" no")  # nothing to sketch
    samples[5] = Sample(prompt="a", completion=" no")  # under 2 tokens
    side = calibration.prompt_side(extractor, samples, "completion")
    alone = []
    for s in samples:
        try:
            alone.append(extractor.prompt(s.prompt or "").state)
        except InvalidInput:
            alone.append(None)
    usable = [st for st in alone if st is not None]
    assert len(usable) == 38
    total = usable[0].copy()
    for st in usable[1:]:
        total = total.merge(st)
    assert side.prompt_sum.n_samples == total.n_samples == 38
    np.testing.assert_allclose(side.prompt_sum.signature(), total.signature(), atol=1e-5)
    from atlas import routing

    pick = [i for i in sorted(routing.calibration_pick(len(samples))) if alone[i] is not None]
    assert len(side.cal_states) == len(pick)
    for got, i in zip(side.cal_states, pick, strict=True):
        np.testing.assert_allclose(got.signature(), alone[i].signature(), atol=1e-5)


def test_prepare_refuses_bad_prompts_with_their_index(extractor: Extractor) -> None:
    batcher = PromptBatcher(extractor)
    with pytest.raises(InvalidInput) as info:
        batcher.prepare(["a perfectly fine prompt", "   "])
    assert info.value.detail["prompt"] == 1


def test_full_queue_refuses_with_retry_after_from_the_queue(extractor: Extractor) -> None:
    """Past ``max_pending`` prompts a request is refused at once; the wait is the queue's drain time."""
    batcher = PromptBatcher(extractor, max_batch=8, max_pending=200)
    try:
        batcher.sketch_sync(_prompts(16, seed=3))  # measure a rate first
        rate = batcher.stats()["prompts_per_s"]
        assert rate > 0
        big = batcher.submit(batcher.prepare(_prompts(200, seed=4)))  # fills the queue
        with pytest.raises(QueueFull) as info:
            batcher.submit(batcher.prepare(["one more prompt please"]))
        pending = info.value.detail["pending"]
        assert 0 < pending <= 200
        assert info.value.retry_after_s == pytest.approx(pending / batcher.stats()["prompts_per_s"], rel=0.5)
        assert len(big.result(timeout=120)) == 200  # the admitted request is served in full
        assert len(batcher.sketch_sync(["after the queue drained"])) == 1
    finally:
        batcher.close()


def test_concurrent_routes_over_http(serve: Any, tiny_lm: Any, tmp_path: Path) -> None:
    """64 concurrent ``/v1/route`` calls all answer, each equal to the same prompt routed alone."""
    svc = serve(lm=tiny_lm, sketch_dim=256, prompt_max_wait_ms=5.0)
    groups = {f"group-{t}": _prompts(30, seed=200 + t) for t in range(3)}
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        jobs = []
        for name, texts in groups.items():
            r = http.post("/v1/tasks", json={"name": name, "samples": [{"text": t} for t in texts]})
            assert r.status_code == 202, r.text
            jobs.append(r.json()["job"]["id"])
        for job in jobs:
            _wait_job(http, job)
        prompts = _prompts(64, seed=300)
        alone = [http.post("/v1/route", json={"prompt": p, "k": 3, "threshold": -1}).json() for p in prompts]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=svc.url, timeout=60) as client:
            return await asyncio.gather(*[client.post("/v1/route", json={"prompt": p, "k": 3, "threshold": -1})
                                          for p in prompts])

    answers = asyncio.run(burst())
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers if r.status_code != 200][:2]
    for r, a in zip(answers, alone, strict=True):
        got = r.json()
        assert [m["task_id"] for m in got["matches"]] == [m["task_id"] for m in a["matches"]]
        np.testing.assert_allclose([m["score"] for m in got["matches"]], [m["score"] for m in a["matches"]],
                                   atol=1e-5)
    stats = svc.container.prompts.stats()
    assert stats["batches"] < stats["prompts"], "concurrent prompts were never batched together"


def test_http_queue_full_is_429_oversized_is_413_and_unserved_space_is_409(serve: Any, tiny_lm: Any) -> None:
    """A full queue answers 429 with Retry-After and serves again once drained; a request larger than the whole
    queue answers 413 (no retry could admit it; it was a 429); a space of another model answers 409
    ``incompatible_space`` without Retry-After (this embedded process serves one model: it was a 503 inviting retries
    that could never succeed; a scaled-out API still answers 503 while no worker serves it)."""
    import threading

    svc = serve(lm=tiny_lm, sketch_dim=256, prompt_max_pending=4)
    batcher = svc.container.prompts.batcher
    gate, real = threading.Event(), batcher.sketch_prepared

    def held(prepared: Any) -> Any:  # the model is busy until the test opens the gate
        gate.wait(60)
        return real(prepared)

    batcher.sketch_prepared = held
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        r = http.post("/v1/route", json={"prompts": _prompts(10, seed=5)})
        assert r.status_code == 413, r.text
        assert r.json()["code"] == "payload_too_large" and r.json()["detail"]["max_pending"] == 4
        busy = batcher.submit(batcher.prepare(_prompts(4, seed=6)))  # fills the queue while the model is held
        r = http.post("/v1/route", json={"prompt": "one more prompt please"})
        assert r.status_code == 429, r.text
        assert r.json()["code"] == "queue_full"
        assert int(r.headers["Retry-After"]) >= 1
        gate.set()
        assert len(busy.result(timeout=60)) == 4
        assert http.post("/v1/route", json={"prompt": "one more prompt please"}).status_code == 200
        # A space of another model: nothing in this deployment serves it.
        from atlas import repository

        with svc.container.store.session() as s:
            other = repository.get_or_create_space(
                s, model_fingerprint="other-model@abc", spec_fingerprint="spec-x", model_name="other/model",
                d=8, K=16, m=256, seed=0, spec={"d": 8, "K": 16, "m": 256, "seed": 0},
            )
            other_id = other.id
        r = http.post("/v1/route", json={"prompt": "route me somewhere", "space": str(other_id)})
        assert r.status_code == 409 and r.json()["code"] == "incompatible_space", r.text
        assert "other/model" in r.json()["message"] and "Retry-After" not in r.headers


def _wait_job(http: httpx.Client, job_id: int, timeout: float = 120.0) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            assert job["status"] == "succeeded", job
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.fixture
def private_redis() -> Any:
    """A redis-server of this test alone (on a free port), so that it can be killed."""
    import time

    import redis

    port = _free_redis_port()
    proc = _redis_server(port)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield url, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def test_remote_prompts_refuse_at_once_and_survive_a_redis_failure(serve: Any, tiny_lm: Any,
                                                                   private_redis: Any) -> None:
    """Remote mode (a worker's PromptServer over Redis): a request larger than the worker's queue is refused at
    once with 413 as in embedded mode (it blocked the list head until its deadline, then 503), a small request
    behind it is served at once, and Redis failing while the worker list is cached is a 503 (it was a 500)."""
    import time

    from workers.prompt_remote import PromptServer, RedisPromptSketcher

    url, proc = private_redis
    svc = serve(lm=tiny_lm, sketch_dim=256)
    queries = svc.container.queries
    embedded, key = queries.prompts, queries.space_key(None)
    batcher = PromptBatcher(embedded.batcher.extractor, max_pending=8)
    server = PromptServer(url, batcher, key).start()
    queries.prompts = RedisPromptSketcher(url, timeout_s=20, max_pending=64)
    try:
        with httpx.Client(base_url=svc.url, timeout=60) as http:
            assert http.post("/v1/route", json={"prompt": "alpha beta river"}).status_code == 200
            t0 = time.monotonic()
            big = http.post("/v1/route", json={"prompts": _prompts(10, seed=8)})
            assert big.status_code == 413 and big.json()["code"] == "payload_too_large", big.text
            assert time.monotonic() - t0 < 10  # not the 20 s deadline
            t0 = time.monotonic()
            assert http.post("/v1/route", json={"prompt": "stone light ember"}).status_code == 200
            assert time.monotonic() - t0 < 10
            assert http.post("/v1/route", json={"prompt": "cloud north"}).status_code == 200  # the workers are cached
            proc.kill()
            proc.wait(10)
            r = http.post("/v1/route", json={"prompt": "seven quiet"})
            assert r.status_code == 503 and r.json()["code"] == "model_unavailable", r.text
            assert int(r.headers["Retry-After"]) >= 1
    finally:
        queries.prompts = embedded
        server.stop()
        batcher.close()


def test_remote_prompts_are_served_at_once_after_a_redis_restart(serve: Any, tiny_lm: Any,
                                                                 private_redis: Any) -> None:
    """Redis restarted under a running deployment: the first route on each replica failed with 503 "the prompt
    queue (Redis) is unreachable" although Redis was back (a pooled connection was stale); the clients retry a
    dropped connection now."""
    import time

    from workers.prompt_remote import PromptServer, RedisPromptSketcher

    url, proc = private_redis
    svc = serve(lm=tiny_lm, sketch_dim=256)
    queries = svc.container.queries
    embedded, key = queries.prompts, queries.space_key(None)
    batcher = PromptBatcher(embedded.batcher.extractor)
    server = PromptServer(url, batcher, key).start()
    queries.prompts = RedisPromptSketcher(url, timeout_s=20)
    restarted = None
    try:
        with httpx.Client(base_url=svc.url, timeout=60) as http:
            assert http.post("/v1/route", json={"prompt": "alpha beta river"}).status_code == 200
            proc.kill()
            proc.wait(10)
            restarted = _redis_server(int(url.rsplit(":", 1)[1].split("/")[0]))
            _until_announced(url)  # Redis is up again, and the worker has announced itself again
            time.sleep(0.6)  # past the replica's cached worker list: it reads the registry again
            r = http.post("/v1/route", json={"prompt": "stone light ember"})
            assert r.status_code == 200, r.text
    finally:
        queries.prompts = embedded
        server.stop()
        batcher.close()
        if restarted is not None:
            restarted.kill()
            restarted.wait(10)


def test_a_prompt_worker_started_before_redis_waits_for_it(tiny_lm: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``fisher-atlas worker`` with Redis not up yet died with a 215-line traceback (its first announcement
    raised), although Celery itself waits for its broker; it now announces at the first heartbeat that reaches
    Redis, and an outage is logged once when it starts and once when it ends, not every second."""
    import logging
    import time

    from atlas.ports import SpaceKey
    from workers.extraction import Extractor
    from workers.prompt_remote import PromptServer

    port = _free_redis_port()
    url = f"redis://127.0.0.1:{port}/0"
    spec = tiny_lm.make_spec(m=256)
    key = SpaceKey(1, "tiny", tiny_lm.fingerprint.key(), spec.fingerprint(), spec.to_dict())
    batcher = PromptBatcher(Extractor(tiny_lm, tiny_lm.make_sketcher(spec)))
    proc = None
    with caplog.at_level(logging.WARNING, logger="workers.prompt_remote"):
        server = PromptServer(url, batcher, key).start()  # nothing listens on the port yet: no exception
        try:
            time.sleep(3.5)  # three heartbeats and several serve-loop retries fail meanwhile
            proc = _redis_server(port)
            _until_announced(url)
        finally:
            server.stop()
            batcher.close()
            if proc is not None:
                proc.kill()
                proc.wait(10)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("announcing the prompt worker failed" in m for m in messages) == 1, messages
    for what in ("the prompt worker's heartbeat", "taking prompt requests"):
        assert sum(m.startswith(f"{what} failed") for m in messages) == 1, messages
        assert sum(m.startswith(f"{what} works again") for m in messages) == 1, messages


def _free_redis_port() -> int:
    """A free local port for a redis-server of a test's own (the test is skipped without redis-server)."""
    import shutil
    import socket

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_server(port: int) -> Any:
    """A redis-server process on ``port`` (no persistence)."""
    import shutil
    import subprocess

    binary = shutil.which("redis-server")
    assert binary is not None
    return subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _until_announced(url: str, timeout: float = 20.0) -> None:
    """Wait until Redis at ``url`` answers and holds a prompt worker's announcement."""
    import time

    import redis

    deadline = time.monotonic() + timeout
    while True:
        try:
            if redis.Redis.from_url(url).keys("fa:worker:*"):
                return
        except redis.ConnectionError:
            pass
        assert time.monotonic() < deadline, "no prompt worker announced itself"
        time.sleep(0.1)



def test_readyz_names_redis_not_the_database_when_redis_stalls_or_dies(serve: Any, tiny_lm: Any,
                                                                       private_redis: Any, tmp_path: Path) -> None:
    """An API without a model whose Redis stalls (accepts connections, answers nothing: each registry read waits
    for its socket timeout, retried) and then dies: ``/readyz`` answers 503 within about a second each time,
    blames the worker registry and keeps the database's probe apart. With Redis stalled it said
    ``database: timed out`` and ``model: true`` (the stalled reads held every probe thread)."""
    import signal
    import time

    url, proc = private_redis
    data = tmp_path / "shared-store"
    serve(lm=tiny_lm, data_dir=data, overrides={"start_runner": False})  # a model's space exists in the store
    svc = serve(lm=None, data_dir=data, queue="celery", prompt_service="redis", redis_url=url,
                overrides={"start_runner": False})

    def not_ready_for_redis() -> None:
        for _ in range(3):
            t0 = time.monotonic()
            r = http.get("/readyz")
            assert time.monotonic() - t0 < 4
            body = r.json()
            assert r.status_code == 503 and body["checks"] == {"database": True, "model": False, "index": True}, body
            assert "database" not in body["detail"] and "registry" in body["detail"]["model"], body

    with httpx.Client(base_url=svc.url, timeout=30) as http:
        up = http.get("/readyz")
        assert up.status_code == 503 and up.json()["checks"] == {"database": True, "model": False, "index": True}
        assert "no live worker" in up.json()["detail"]["model"]
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.6)  # past the cached worker list (0.5 s)
            not_ready_for_redis()
        finally:
            proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)
        time.sleep(0.6)
        not_ready_for_redis()


def test_prompt_novelty_vectors_equal_the_job_samples_vectors(extractor: Extractor) -> None:
    """The novelty test compares a prompt's vector (the batched prompt path) with a task's sample vectors (a job's
    extraction): the same text gives the same vector on both paths (its mean head input, atlas.novelty)."""
    prompts = _prompts(24, seed=11)
    got = _batched(extractor, prompts, token_budget=256)  # several length buckets
    novelty = getattr(got, "novelty", None)
    assert novelty is not None and novelty.shape == (24, extractor.lm.hidden_size)
    job = extractor.extract([Sample(text=p) for p in prompts]).baselines
    by_key = dict(zip(job.sample_keys.tolist(), job.sample_vectors, strict=True))
    from atlas.samples import sample_id

    for p, vec in zip(prompts, novelty, strict=True):
        np.testing.assert_allclose(vec, by_key[sample_id(Sample(text=p))], rtol=1e-4, atol=1e-5)
    assert extractor.extract([Sample(prompt=p, completion=" yes") for p in prompts[:4]],
                             mode="completion").baselines.sample_keys.size == 0  # completion tokens: no vectors
