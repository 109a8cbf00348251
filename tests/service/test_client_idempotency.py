"""The client's writes can carry an ``Idempotency-Key`` (its docs said to send one and retry, but no method could):
the same ``add_task`` / ``append`` sent twice creates one task and appends the samples once, as JSON records
and as a file upload, through both clients.

Real parts: a uvicorn server over SQLite with the tiny GPT-2 and its in-process job runner.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from service.client import AsyncAtlasClient, AtlasClient

SAMPLES = [{"text": "the quick brown fox jumps over the lazy dog"}, {"text": "a second small sample of text"}]


def _scenario(cl: Any, kind: str, extra: Path) -> Any:
    """Each write twice with one key; the answers (a coroutine for the async client)."""
    if kind == "sync":
        first = cl.add_task("fox", samples=SAMPLES, idempotency_key="add-1")
        again = cl.add_task("fox", samples=SAMPLES, idempotency_key="add-1")
        jobs = [cl.append(first.task.id, samples=SAMPLES[:1], idempotency_key="app-1") for _ in range(2)]
        jobs += [cl.append(first.task.id, extra, idempotency_key="app-2") for _ in range(2)]
        for job in jobs:
            cl.wait_job(job.id, timeout=120)
        return first, again, jobs, cl.get_task(first.task.id)

    async def run() -> Any:
        first = await cl.add_task("fox", samples=SAMPLES, idempotency_key="add-1")
        again = await cl.add_task("fox", samples=SAMPLES, idempotency_key="add-1")
        jobs = [await cl.append(first.task.id, samples=SAMPLES[:1], idempotency_key="app-1") for _ in range(2)]
        jobs += [await cl.append(first.task.id, extra, idempotency_key="app-2") for _ in range(2)]
        for job in jobs:
            await cl.wait_job(job.id, timeout=120)
        return first, again, jobs, await cl.get_task(first.task.id)

    return run()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_writes_sent_twice_with_one_idempotency_key_count_once(kind: str, serve: Any, tiny_lm: Any,
                                                                tmp_path: Path) -> None:
    svc = serve(lm=tiny_lm)
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"text": "one more sample from a file"}) + "\n")
    if kind == "sync":
        with AtlasClient(svc.url) as cl:
            first, again, jobs, task = _scenario(cl, kind, extra)
    else:
        async def main() -> Any:
            async with AsyncAtlasClient(svc.url) as cl:
                return await _scenario(cl, kind, extra)

        first, again, jobs, task = asyncio.run(main())
    assert (again.task.id, again.job.id) == (first.task.id, first.job.id)
    assert jobs[0].id == jobs[1].id and jobs[2].id == jobs[3].id and jobs[0].id != jobs[2].id
    assert task.n_samples == len(SAMPLES) + 1 + 1  # each append merged once
