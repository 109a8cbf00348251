"""A job's samples that were skipped or cut are reported (REST ``result``, CLI, library log), and job lists
filter by space.

Before 2026-11-25 a task added from 5 samples of which 2 were too short to sketch (one token) reported
5/5 samples done and said nothing (the README's own library example lost one this way), and a sample cut to
the worker's token cap was not reported either; ``jobs list --space`` was accepted and ignored.

Real parts: a uvicorn server over SQLite with the tiny GPT-2, the ``fisher-atlas`` entry point, the client,
``Atlas(path)``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from fisher_atlas import Atlas
from service.cli import main
from service.client import AtlasClient
from service.client.errors import InvalidInput
from tests.service.test_default_space import _other_space_task

CAP = 48
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)  # well over CAP tokens
SAMPLES = ["the quick brown fox jumps over the lazy dog", "x", LONG, "y", "a vector database stores signatures"]


def test_skipped_and_cut_samples_are_reported_and_jobs_filter_by_space(serve: Any, tiny_lm: Any, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    svc = serve(lm=tiny_lm, max_tokens_per_sample=CAP)
    assert main(["route", "the quick brown fox", "--url", svc.url]) == 0  # the default space is empty yet
    out = capsys.readouterr().out
    assert out.strip().startswith("none: the space has no ready task to route to (add one first; tasks made with "
                                  "another model are in that model's space"), out
    elsewhere = _other_space_task(svc.container.store)  # another model's task, its job left queued
    data = tmp_path / "mixed.txt"
    data.write_text("\n".join(SAMPLES) + "\n")
    assert main(["add", "mixed", str(data), "--wait", "--url", svc.url]) == 0
    out = capsys.readouterr().out
    assert "2 of 5 samples skipped (too_short: 2)" in out and f"1 cut to {CAP} tokens" in out, out
    # a "none" names the task that decided it (it said "the best score is below the threshold" above a listed
    # task that passed its own, when the ranking had put a lower score first)
    assert main(["route", "the quick brown fox", "--threshold", "0.999", "--url", svc.url]) == 0
    out = capsys.readouterr().out
    assert "none: 'mixed' (id " in out and "the answered (first-ranked) task" in out and "threshold 0.9990" in out, out
    # a prompt over the token limit is routed on its first CAP tokens, and the answer says so (it did not)
    assert main(["route", LONG, "--url", svc.url]) == 0
    out = capsys.readouterr().out
    assert "note: the prompt is longer than the model's token limit" in out, out
    assert main(["route", SAMPLES[0], "--url", svc.url]) == 0
    assert "token limit" not in capsys.readouterr().out

    with AtlasClient(svc.url) as cl:
        task = cl.find_task("mixed")
        answer = cl.route([LONG, SAMPLES[0]], threshold=-1)
        assert answer.truncated and [r.truncated for r in answer.results] == [True, False]
        assert answer.results[0].matches[0].name == "mixed"  # its first tokens still route like its sample
        assert task.n_samples == 3
        job = cl.list_jobs(task_id=task.id).items[0]
        assert job.result is not None
        assert (job.result.samples_used, job.result.samples_skipped, job.result.truncated) == (3, 2, 1)
        assert job.result.skipped_reasons == {"too_short": 2}
        assert job.result.max_tokens_per_sample == CAP and job.result.truncation_policy
        assert cl.get_job(job.id).result == job.result
        clean = cl.add_task("clean", samples=[{"text": SAMPLES[0]}], wait=True).job
        # plain texts, as the library takes them (a raw "dictionary update sequence" ValueError before)
        texts = cl.add_task("texts", samples=[SAMPLES[0], SAMPLES[4]], wait=True)
        assert cl.get_task(texts.task.id).n_samples == 2
        cl.delete_task(texts.task.id)  # its job goes with it (the job lists below count the others)
        with pytest.raises(TypeError, match="sample 1 is a int"):
            cl.add_task("bad", samples=["a b c", 5])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="out="):  # the file given where the space goes: it was a 404
            cl.export_space(str(tmp_path / "space.jsonl"))
        assert clean.result is not None and (clean.result.samples_skipped, clean.result.truncated) == (0, 0)
        assert main(["jobs", "show", str(clean.id), "--url", svc.url]) == 0
        assert "skipped" not in capsys.readouterr().out

        with pytest.raises(InvalidInput, match="a task's numeric id; find one by name"):
            cl.sources("mixed")  # type: ignore[arg-type]  # a name where the id goes (the README once invited it)
        served = task.space_id
        other_space = cl.get_task(elsewhere).space_id
        assert {j.task_id for j in cl.list_jobs().items} == {task.id, clean.task_id, elsewhere}
        assert {j.task_id for j in cl.list_jobs(space=served).items} == {task.id, clean.task_id}
        assert [j.task_id for j in cl.list_jobs(space=other_space).items] == [elsewhere]
        queued = cl.list_jobs(space=other_space).items[0]
        assert queued.status == "queued" and queued.result is None
    for space, expected in ((None, 3), (str(served), 2), (str(other_space), 1)):
        args = ["jobs", "list", "--url", svc.url] + ([] if space is None else ["--space", space])
        assert main(args) == 0
        assert f"{expected} of {expected} jobs" in capsys.readouterr().out, (space, expected)
    assert main(["jobs", "list", "--url", svc.url, "--space", "no-such-space"]) == 1
    assert "not_found" in capsys.readouterr().err


def test_the_library_logs_skipped_and_cut_samples(tmp_path: Path, tiny_model_dir: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu",
               max_tokens_per_sample=CAP) as atlas, caplog.at_level(logging.WARNING, logger="fisher_atlas"):
        task = atlas.add("mixed", SAMPLES, progress=False)
        assert task.n_samples == 3
        warned = [r.getMessage() for r in caplog.records if r.name.startswith("fisher_atlas")]
        assert len(warned) == 1, warned
        assert warned[0].startswith(f"add mixed: 2 of 5 samples skipped (too_short: 2); 1 cut to {CAP} tokens; "
                                    "the task has 3 samples: "), warned  # and a task of 3 is told it is small
        caplog.clear()
        atlas.append("mixed", [SAMPLES[0]], progress=False)  # nothing left out; the task's 4 samples are still few
        warned = [r.getMessage() for r in caplog.records if r.name.startswith("fisher_atlas")]
        assert len(warned) == 1 and warned[0].startswith("append mixed: the task has 4 samples: "), warned
        caplog.clear()
        atlas.append("mixed", [SAMPLES[4]], progress=False)
        assert not [r for r in caplog.records if r.name.startswith("fisher_atlas")]  # 5 samples: nothing to say
        assert [a.truncated for a in atlas.route([LONG, SAMPLES[0], LONG[:CAP]])] == [True, False, False]


def test_a_restart_on_another_sketch_spec_warns_that_the_tasks_are_elsewhere(
        tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Reopened with another ``sketch_dim`` the store's tasks sit in the old space: every route answered none
    and nothing said why."""
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("fox", [SAMPLES[0], SAMPLES[4]], progress=False)
    with caplog.at_level(logging.WARNING, logger="fisher_atlas"), \
            Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu"):
        pass
    assert not [r for r in caplog.records if "holds no task" in r.getMessage()]  # the same space: no warning
    with caplog.at_level(logging.WARNING, logger="fisher_atlas"), \
            Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=512, device="cpu") as atlas:
        assert atlas.route("the quick brown fox").none
    warned = [r.getMessage() for r in caplog.records if "holds no task" in r.getMessage()]
    assert len(warned) == 1 and "m=512" in warned[0] and "{1: 1}" in warned[0], warned


def test_waiting_for_a_job_outlasts_a_restart_of_the_service(tiny_lm: Any, tmp_path: Path) -> None:
    """``add --wait`` (the client's ``wait_job``) gave up after three quick retries when its API replica
    restarted ("All connection attempts failed", exit 1) while the job went on and succeeded."""
    import threading
    import time

    from atlas.settings import Settings
    from service.app import create_app
    from tests.service.conftest import LiveServer

    settings = Settings(data_dir=tmp_path / "data", sketch_dim=256, device="cpu")
    first = LiveServer(create_app(settings, overrides={"lm": tiny_lm, "start_runner": False})).start()
    port, results = first.port, {}
    with AtlasClient(first.url) as cl:
        job_id = cl.add_task("later", samples=[{"text": SAMPLES[0]}, {"text": SAMPLES[4]}]).job.id

        def wait() -> None:
            try:
                results["job"] = cl.wait_job(job_id, timeout=90)
            except Exception as exc:  # the assertion below shows it
                results["error"] = exc

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(1.0)  # following the progress stream; no runner here: the job stays queued
        first.stop()
        time.sleep(3.0)  # the service is down: the waiter polls a closed port
        second = LiveServer(create_app(settings, overrides={"lm": tiny_lm}), port=port).start()
        try:
            waiter.join(60)
        finally:
            second.stop()
    assert "error" not in results, results
    assert results["job"].status == "succeeded" and results["job"].id == job_id
