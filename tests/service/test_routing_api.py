"""Route thresholds over real HTTP with a tiny model: calibration at job end, PATCH override, fit."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from service.client import AtlasClient

PROSE = [f"The {a} fox jumps over the {b} dog near the {c}." for a, b, c in
         [("quick", "lazy", "barn"), ("brown", "old", "road"), ("red", "small", "river"), ("grey", "big", "farm"),
          ("young", "tired", "hill"), ("wild", "sleepy", "fence"), ("sly", "happy", "forest")]]
CODE = [f"def f{i}(a, b):\n    return a {op} b\n" for i, op in enumerate("+-*/%&|")]
QA = [(f"Question: is {x} {y}? Answer:", z) for x, y, z in
      [("the sky", "blue", " yes"), ("fire", "cold", " no"), ("water", "wet", " yes"), ("the sun", "dark", " no"),
       ("ice", "hot", " no"), ("grass", "green", " yes"), ("snow", "white", " yes")]]


def _write(tmp: Path) -> dict[str, tuple[Path, str]]:
    files = {}
    for name, rows in (("prose", [{"text": t} for t in PROSE]), ("code", [{"text": t} for t in CODE]),
                       ("qa", [{"prompt": p, "completion": c} for p, c in QA])):
        p = tmp / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[name] = (p, "completion" if name == "qa" else "text")
    return files


def test_calibration_override_and_fit(serve, tiny_lm, tmp_path: Path) -> None:
    svc = serve(lm=tiny_lm)
    with AtlasClient(svc.url) as c:
        ids = {}
        for name, (path, mode) in _write(tmp_path).items():
            r = c.add_task(name, path, mode=mode, wait=True)
            assert r.job.status == "succeeded", r.job.error
            ids[name] = r.task.id
        info = {n: httpx.get(f"{svc.url}/v1/tasks/{i}/routing").json() for n, i in ids.items()}
        for n, body in info.items():
            assert body["source"] == "calibrated", body
            assert -1.0 <= body["threshold"] <= 1.0 and body["calibration_scores"] == 7
            assert body["false_reject_rate"] == 0.05 and body["prompt_side"] is (n == "qa")
            # the ranking's typical score: 7 held-out scores shrunk towards the prior, inside (mean, prior]
            assert body["threshold"] < body["typical_score"] <= 1.0

            assert body["novelty_samples_needed"] == 39  # at half of 5 %
        # a task whose job failed has no routing row: the vectors its novelty test would need are still said (null,
        # and the dashboard and the CLI fell back to 20)
        failed = c.add_task("too-short", samples=["x", "y"], wait=True)
        assert failed.job.status == "failed"
        body = httpx.get(f"{svc.url}/v1/tasks/{failed.task.id}/routing").json()
        assert body["source"] == "default" and body["novelty_samples_needed"] == 39, body
        c.delete_task(failed.task.id)

        res = c.route(["The calm fox jumps over the lazy cat.", "Question: is salt sweet? Answer:"], k=3)
        for r in res.results:
            assert 0.0 <= r.confidence <= 1.0
            for m in r.matches:
                assert -1.0 <= m.score <= 1.0 and 0.0 <= m.confidence <= 1.0
            assert r.none is (r.matches[0].score < r.matches[0].threshold)
            assert r.nearest_rejects is False  # a space of 3 tasks is not whitened: one task decides
        assert res.nearest_rejects is res.results[0].nearest_rejects
        assert res.results[1].matches[0].name == "qa"  # the completion task receives a prompt like its own

        # PATCH override: 1.0 rejects everything for that task, null restores the calibrated one
        body = httpx.patch(f"{svc.url}/v1/tasks/{ids['qa']}/routing", json={"threshold": 1.0}).json()
        assert body["source"] == "override" and body["threshold"] == 1.0
        assert c.route("Question: is salt sweet? Answer:", k=1).none is True
        assert httpx.patch(f"{svc.url}/v1/tasks/{ids['qa']}/routing", json={"threshold": 2}).status_code == 422
        for path, method, body in ((f"/v1/tasks/{ids['qa']}/routing", "PATCH", b'{"threshold": NaN}'),
                                   ("/v1/route", "POST", b'{"prompt": "is salt sweet", "threshold": NaN}')):
            r = httpx.request(method, f"{svc.url}{path}", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422 and "finite number" in r.text, r.text  # not "less than or equal to 1"
        body = httpx.patch(f"{svc.url}/v1/tasks/{ids['qa']}/routing", json={"threshold": None}).json()
        assert body["source"] == "calibrated"
        assert httpx.get(f"{svc.url}/v1/tasks/999999/routing").status_code == 404

        # fit: off-domain prompts labelled none; thresholds only change within the documented bound
        examples = [(t, "prose") for t in PROSE[:4]] + [(p, "qa") for p, _ in QA[:4]]
        examples += [("SELECT name FROM users;", "none"), ("1 2 3 4 5 6 7", "none"), ("Bonjour tout le monde", "none")]
        dry = c.fit(examples, dry_run=True)
        assert dry.stored is False and dry.accuracy_after >= dry.accuracy_before
        fitted = c.fit(examples)
        assert fitted.stored is True and fitted.thresholds == dry.thresholds
        assert fitted.previous == dry.previous and set(fitted.previous) == set(fitted.thresholds)
        for name, was in fitted.previous.items():  # held to the calibrated threshold (3 tasks: no novelty test)
            assert was == info[name]["threshold"]
        for name, thr in fitted.thresholds.items():
            got = httpx.get(f"{svc.url}/v1/tasks/{ids[name]}/routing").json()
            assert got["source"] == "override" and abs(got["threshold"] - thr) < 1e-12
        bad = httpx.post(f"{svc.url}/v1/route/fit", json={"examples": [{"prompt": "x y z", "label": "nope"}]})
        assert bad.status_code == 404


def test_false_reject_rate_recalibrates_from_stored_scores_and_appends_keep_it(serve, tiny_lm, tmp_path: Path) -> None:
    svc = serve(lm=tiny_lm)
    files = _write(tmp_path)
    with AtlasClient(svc.url) as c:
        tid = c.add_task("prose", files["prose"][0], wait=True).task.id
        url = f"{svc.url}/v1/tasks/{tid}/routing"
        before = httpx.get(url).json()
        assert before["false_reject_rate"] == 0.05 and before["calibration_scores"] == 7

        looser = c.set_false_reject_rate(tid, 0.3)  # more of its own prompts may be answered none: a higher bar
        assert looser.source == "calibrated" and looser.false_reject_rate == 0.3
        assert looser.calibration_scores == 7  # no model run: the stored held-out scores, re-read
        assert looser.threshold > before["threshold"]
        back = httpx.patch(url, json={"false_reject_rate": 0.05}).json()
        assert back["threshold"] == before["threshold"]  # the same scores at the same rate: the same threshold
        for bad in (0, -0.1, 0.6, "x"):
            assert httpx.patch(url, json={"false_reject_rate": bad}).status_code == 422
        for tiny in (5e-324, 1e-17):  # in (0, 0.5]: a valid rate, however small (these once answered 500)
            r = httpx.patch(url, json={"false_reject_rate": tiny})
            assert r.status_code == 200 and r.json()["threshold"] <= before["threshold"], r.text
        httpx.patch(url, json={"false_reject_rate": 0.05})
        assert httpx.patch(f"{svc.url}/v1/tasks/999999/routing", json={"false_reject_rate": 0.1}).status_code == 404
        assert httpx.patch(url, json={}).json()["threshold"] == before["threshold"]  # an empty body changes nothing

        c.set_false_reject_rate(tid, 0.3)
        job = c.append(tid, samples=[{"text": t.replace("fox", "cat")} for t in PROSE], wait=True)
        assert job.status == "succeeded", job.error
        after = httpx.get(url).json()
        assert after["false_reject_rate"] == 0.3 and after["calibration_scores"] == 14  # the append kept the rate

        over = httpx.patch(url, json={"threshold": 0.9, "false_reject_rate": 0.1}).json()
        assert over["source"] == "override" and over["threshold"] == 0.9  # an override still wins
        assert over["false_reject_rate"] == 0.1 and over["threshold_auto"] <= after["threshold_auto"]


def test_a_patch_waits_for_a_jobs_final_transaction_and_is_not_lost(serve, tiny_lm, tmp_path: Path,
                                                                    pg_database) -> None:
    """PATCH of the false-reject rate takes the task's row lock, as a job's final transaction does: while a job
    holds it (it has read the routing row and will write its calibration), the PATCH waits, then re-calibrates
    from the job's scores — it was silently overwritten by the job's calibration at the old rate (PostgreSQL)."""
    import threading

    from atlas import repository, routing_repo
    from atlas.route_calibration import calibrate

    svc = serve(lm=tiny_lm, database_url=pg_database())
    with AtlasClient(svc.url) as c:
        tid = c.add_task("prose", samples=[{"text": t} for t in PROSE], wait=True).task.id
    store, thresholds = svc.container.store, svc.container.thresholds
    job_scores = [0.30 + 0.01 * i for i in range(60)]
    done = threading.Event()
    with store.session() as job:  # a job's final transaction
        repository.lock_task(job, tid)
        row = routing_repo.get_routing(job, tid)
        assert row is not None and row.false_reject_rate == 0.05
        patch = threading.Thread(target=lambda: (thresholds.patch(tid, false_reject_rate=0.2), done.set()))
        patch.start()
        assert not done.wait(1.0)  # the PATCH waits for the task's lock
        routing_repo.store_routing(job, tid, prompt_state=None, calibration=calibrate(job_scores, 0.05))
    patch.join(30)
    assert done.is_set()
    info = thresholds.info(tid)
    assert info["false_reject_rate"] == 0.2  # the PATCH is kept ...
    assert info["threshold_auto"] == calibrate(job_scores, 0.2).threshold  # ... re-calibrated on the job's scores


def test_a_completion_task_added_after_a_route_is_re_ranked_at_once(serve, tiny_lm, tmp_path: Path) -> None:
    """Completion tasks are re-ranked on every route whatever FAISS finds (their signature covers answers, not
    prompts); the set of them is cached per space and must follow a task added after it was read."""
    svc = serve(lm=tiny_lm)
    files = _write(tmp_path)
    body = {"prompts": ["Question: is salt sweet? Answer:"], "k": 3, "candidates": 1}
    with AtlasClient(svc.url) as c:
        for name in ("prose", "code"):
            assert c.add_task(name, files[name][0], mode="text", wait=True).job.status == "succeeded"
        before = httpx.post(f"{svc.url}/v1/route", json=body).json()["results"][0]["matches"]
        assert [m["name"] for m in before] != [] and "qa" not in [m["name"] for m in before]
        assert c.add_task("qa", files["qa"][0], mode="completion", wait=True).job.status == "succeeded"
        after = httpx.post(f"{svc.url}/v1/route", json=body).json()["results"][0]["matches"]
        assert "qa" in [m["name"] for m in after], after  # one FAISS candidate + every completion task
