"""Honest job progress: tokens streamed through the model, samples/s and an ETA, over the API and SSE."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.service.conftest import wait_job as _wait

PAIRS = [
    ("Question: is the sky blue on a clear day?\nAnswer:", " yes"),
    ("Translate to French: good morning, my friend. The weather is fine today.\n", " bonjour mon ami, il fait beau."),
    ("Summarise: The committee met on Tuesday and agreed to postpone the vote until the next session.\n",
     " The vote was postponed."),
    ("2 + 2 =", " 4"),
    ("Write a haiku about rivers and stones, slow and patient in the evening light:\n",
     " Water over stone / patient hands of evening light / the river keeps time"),
]


def test_completion_job_counts_every_token_streamed(serve, tiny_lm, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    svc = serve(lm=tiny_lm)
    # the tokens the model must see, counted independently of the service's tokeniser wrapper
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompt_lens = [len(tok(p, add_special_tokens=True)["input_ids"]) for p, _ in PAIRS]
    compl_lens = [len(tok(c, add_special_tokens=False)["input_ids"]) for _, c in PAIRS]
    assert sum(prompt_lens) > 2 * sum(compl_lens)  # the prompts dominate: the old count would be far off

    with httpx.Client(base_url=svc.url, timeout=60) as http:
        r = http.post("/v1/tasks", json={"name": "qa", "mode": "completion",
                                         "samples": [{"prompt": p, "completion": c} for p, c in PAIRS]})
        assert r.status_code == 202, r.text
        job = _wait(http, r.json()["job"]["id"])
        assert job["status"] == "succeeded", job
        progress = job["progress"]
        assert progress["samples_done"] == progress["samples_total"] == len(PAIRS)
        assert progress["tokens_streamed"] == sum(prompt_lens) + sum(compl_lens)
        assert progress["tokens"] == sum(compl_lens)  # counted (completion) tokens, kept separately
        assert progress["samples_per_s"] > 0 and progress["tokens_streamed_per_s"] > 0
        assert progress["tokens_streamed_per_s"] >= progress["tokens_per_s"]
        assert progress["eta_s"] == 0.0

        # the SSE stream carries the same progress fields
        with http.stream("GET", f"/v1/jobs/{job['id']}/events") as events:
            data = [json.loads(line[5:]) for line in events.iter_lines() if line.startswith("data:")]
        jobs = [d for d in data if "progress" in d]
        assert jobs and jobs[-1]["progress"]["tokens_streamed"] == progress["tokens_streamed"]
        assert data[-1] == {"id": job["id"], "status": "succeeded"}  # the end event
        # an event's id names the job's state on every connection (a counter restarted at 0 on each, so
        # Last-Event-ID told a reconnecting client nothing; an API review, 2026-12-07): reconnecting with the id of
        # the state it has, a client is not sent that state again
        with http.stream("GET", f"/v1/jobs/{job['id']}/events") as events:
            ids = [line[3:].strip() for line in events.iter_lines() if line.startswith("id:")]
        assert len(ids) == 1 and len(ids[0]) == 16, ids
        with http.stream("GET", f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": ids[0]}) as events:
            lines = list(events.iter_lines())
        assert not [line for line in lines if line.startswith(("id:", "event: progress"))], lines
        assert f'data: {{"id": {job["id"]}, "status": "succeeded"}}' in lines

        # text mode: every token counts, so both counts agree
        texts = [p + c for p, c in PAIRS]
        r = http.post("/v1/tasks", json={"name": "plain", "samples": [{"text": t} for t in texts]})
        job = _wait(http, r.json()["job"]["id"])
        lens = [len(tok(t, add_special_tokens=True)["input_ids"]) for t in texts]
        assert job["progress"]["tokens_streamed"] == sum(lens)
        assert job["progress"]["tokens"] == sum(n - 1 for n in lens)
