"""The data path over real HTTP with a tiny model: every valid input round-trips, no upload hurts the server.

Round trip: samples written by the standard writers (json, csv, pyarrow, plain text) → upload →
store (read back from SQL) → export → import into a second service → the same samples and the same
route answers. Then one regression test per data-path finding of issue 14, each asserting the
documented status and that nothing was stored.
"""

from __future__ import annotations

import base64
import csv
import io
import itertools
import json
import time
import tracemalloc
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atlas import repository
from atlas.models import Job, Task
from atlas.samples import Sample, is_blank, main_field

SEPARATORS = ["\n", "\r", "\u0085", "\u2028", "\u2029", "\x1c", "\x1d", "\x1e", "\x00"]
chars = st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from([*SEPARATORS, '"', ","]))
texts = st.text(alphabet=chars, min_size=1, max_size=30)
PROBES = ["The quick brown fox.", "CC(=O)O", "def add(a, b): return a + b"]


def _encode(samples: list[Sample], fmt: str, mode: str) -> tuple[str, bytes]:
    keys = ["text"] if mode == "text" else ["prompt", "completion"]
    recs = [s.model_dump(exclude_none=True) for s in samples]
    if fmt == "jsonl":
        return "s.jsonl", "".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(recs)).encode()
    if fmt == "json":
        return "s.json", json.dumps(recs, ensure_ascii=False).encode()
    if fmt == "csv":
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(keys)
        w.writerows([[r[k] for k in keys] for r in recs])
        return "s.csv", buf.getvalue().encode()
    if fmt == "parquet":
        out = io.BytesIO()
        pq.write_table(pa.table({k: [r[k] for r in recs] for k in keys}), out, compression="zstd")
        return "s.parquet", out.getvalue()
    return "s.txt", "".join(r["text"] + "\n" for r in recs).encode()


def _representable_as_text(s: Sample) -> bool:
    t = s.text or ""
    return "\n" not in t and not t.endswith("\r") and bool(t.strip()) and not t.startswith("\ufeff")


def _upload(url: str, name: str, fname: str, data: bytes, mode: str = "text", **extra: Any) -> httpx.Response:
    headers = extra.pop("headers", {})
    return httpx.post(f"{url}/v1/tasks", data={"name": name, "mode": mode, **extra},
                      files={"file": (fname, data)}, headers=headers, timeout=120)


def _wait(url: str, job_id: int, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise TimeoutError(job_id)


def _stored_samples(svc: Any, job_id: int) -> list[Sample]:
    with svc.container.store.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.upload_id is not None
        return repository.load_upload_samples(session, job.upload_id)


def _counts(svc: Any) -> tuple[int, int]:
    with svc.container.store.read() as session:
        return session.query(Task).count(), session.query(Job).count()


def _routes(url: str) -> list[list[tuple[str, float]]]:
    body = httpx.post(f"{url}/v1/route", json={"prompts": PROBES, "k": 5, "threshold": -1.0}, timeout=60).json()
    return [[(m["name"], round(m["score"], 9)) for m in r["matches"]] for r in body["results"]]


def test_any_samples_round_trip_upload_store_export_import(serve, tiny_lm) -> None:
    a, b = serve(lm=tiny_lm), serve(lm=tiny_lm)
    counter = itertools.count()
    exported: list[str] = []

    @settings(max_examples=14, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        mode = data.draw(st.sampled_from(["text", "text", "completion"]), label="mode")
        if mode == "text":
            samples = data.draw(st.lists(texts.map(lambda t: Sample(text=t)), min_size=1, max_size=5))
            fmts = ["jsonl", "json", "csv", "parquet"] + (["txt"] if all(map(_representable_as_text, samples)) else [])
        else:
            samples = data.draw(st.lists(st.builds(lambda p, c: Sample(prompt=p, completion=c), texts, texts),
                                         min_size=1, max_size=4))
            fmts = ["jsonl", "json", "csv", "parquet"]
        fmt = data.draw(st.sampled_from(fmts), label="format")
        fname, blob = _encode(samples, fmt, mode)
        name = f"task-{next(counter)}"
        r = _upload(a.url, name, fname, blob, mode=mode)
        if all(is_blank(main_field(s)) for s in samples):  # refused whole, nothing stored (d3f5582)
            assert r.status_code == 422 and "every sample is blank" in r.json()["message"], r.text
            return
        assert r.status_code == 202, r.text
        job = _wait(a.url, r.json()["job"]["id"])
        assert _stored_samples(a, job["id"]) == samples  # the store holds exactly what was uploaded
        if job["status"] != "succeeded":  # no usable token (e.g. one-character texts): nothing to export
            assert "usable" in (job["error"] or "") or "token" in (job["error"] or ""), job
            return
        exp = httpx.get(f"{a.url}/v1/spaces/default/export", timeout=60)
        assert exp.status_code == 200
        imp = httpx.post(f"{b.url}/v1/spaces/import", params={"on_conflict": "skip"},
                         files={"file": ("space.jsonl", exp.content)}, timeout=60)
        assert imp.status_code == 200, imp.text
        assert name not in imp.json()["skipped"]
        exported.append(name)
        assert _routes(a.url) == _routes(b.url)
        task_a = httpx.get(f"{a.url}/v1/tasks", params={"name": name}).json()["items"][0]
        task_b = httpx.get(f"{b.url}/v1/tasks", params={"name": name}).json()["items"][0]
        for key in ("mode", "metadata", "n_samples", "n_tokens", "version", "status"):
            assert task_a[key] == task_b[key], key

    check()
    assert exported, "no example reached export/import"


def test_nul_and_line_separators_round_trip_on_postgres(serve, tiny_lm, pg_database) -> None:
    svc = serve(lm=tiny_lm, database_url=pg_database())
    samples = [Sample(text="nul \x00 inside a sample"), Sample(text="line\u2028separator\u2029and\x1cfile")]
    for fmt in ("jsonl", "csv", "parquet"):
        r = _upload(svc.url, f"nul-{fmt}", *_encode(samples, fmt, "text"))
        assert r.status_code == 202, r.text
        job = _wait(svc.url, r.json()["job"]["id"])
        assert job["status"] == "succeeded", job
        assert _stored_samples(svc, job["id"]) == samples
    before = _counts(svc)
    for name, meta in (("bad\x00name", "{}"), ("ok-name", json.dumps({"k": "v\x00"}))):
        r = _upload(svc.url, name, *_encode(samples, "jsonl", "text"), metadata=meta)
        assert r.status_code == 422 and "NUL" in r.json()["message"], r.text
    r = httpx.patch(f"{svc.url}/v1/tasks/1", json={"metadata": {"a\x00": 1}})
    assert r.status_code == 422
    assert _counts(svc) == before


def test_nested_json_and_unbounded_metadata_are_refused(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm)
    deep = "[" * 50_000 + "]" * 50_000
    ok = _encode([Sample(text="hello world")], "jsonl", "text")
    cases = [
        httpx.post(f"{svc.url}/v1/tasks", content=f'{{"name": "n", "samples": [{{"text": "ab"}}], "metadata": '
                   f'{{"x": {deep}}}}}', headers={"content-type": "application/json"}),
        _upload(svc.url, "n", *ok, metadata=f'{{"x": {deep}}}'),
        _upload(svc.url, "n", "s.jsonl", f'{{"text": "a", "x": {deep}}}\n'.encode()),
        _upload(svc.url, "n", *ok, metadata=json.dumps({"x": "y" * 20_000})),
        _upload(svc.url, "n", *ok, metadata=json.dumps(json.loads('{"a":' * 20 + "1" + "}" * 20))),
        httpx.post(f"{svc.url}/v1/tasks", json={"name": "n", "samples": [{"text": "ab"}],
                                                "metadata": {"x": "y" * 20_000}}),
    ]
    for r in cases:
        assert r.status_code == 422, r.text
        assert len(r.content) < 4096  # bounded error bodies
    # an element of a JSON array is bounded in values before it is built (100,000: this one holds 100,003)
    r = _upload(svc.url, "n", "s.json", f'[{{"text": "a", "x": {deep}}}]'.encode())
    assert r.status_code == 413 and "s.json: item 0 holds more than 100000 JSON values" in r.text, r.text
    assert _counts(svc) == (0, 0)
    r = _upload(svc.url, "meta", *ok, metadata=json.dumps({"a": "b"}))
    assert r.status_code == 202
    tid = r.json()["task"]["id"]
    for body in ({"metadata": {"big": "y" * 20_000}}, {"metadata": json.loads('{"a":' * 20 + "1" + "}" * 20)}):
        assert httpx.patch(f"{svc.url}/v1/tasks/{tid}", json=body).status_code == 422
    r = httpx.patch(f"{svc.url}/v1/tasks/{tid}", content=f'{{"metadata": {{"x": {deep}}}}}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 422
    for i in range(2):  # merged metadata over the bound: refused, not stored
        r = httpx.patch(f"{svc.url}/v1/tasks/{tid}", json={"metadata": {f"k{i}": "z" * 9_000}})
    assert r.status_code == 422
    assert httpx.get(f"{svc.url}/v1/tasks/{tid}").json()["metadata"] == {"a": "b", "k0": "z" * 9_000}


def test_bomb_uploads_answer_413_with_bounded_memory(serve, tiny_lm) -> None:
    # a lower sample limit keeps the test fast under tracemalloc; the default limits are measured in
    # tests/atlas/test_sample_io.py (peak RSS of a fresh process) and in bench/store/bench_upload_memory.py
    svc = serve(lm=tiny_lm, max_samples=20_000)
    lines = b"a\n" * 5_000_000  # 10 MB of 5 M short lines
    bomb = io.BytesIO()
    one = pa.DictionaryArray.from_arrays(pa.array(np.zeros(3_000, dtype=np.int32)), pa.array(["x" * 1_000_000]))
    pq.write_table(pa.table({"text": one}), bomb, compression="zstd")  # 3 GB of values, built without them
    assert len(bomb.getvalue()) < 64 * 1024
    for fname, data in (("lines.txt", lines), ("bomb.parquet", bomb.getvalue())):
        tracemalloc.start()
        try:
            r = _upload(svc.url, "bomb", fname, data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert r.status_code == 413, r.text
        assert peak < 100 * 1024 * 1024, (fname, peak)
    body = ('{"name": "bomb", "samples": [' + ",".join(['{"text": "a"}'] * 800_000) + "]}").encode()
    tracemalloc.start()
    try:
        r = httpx.post(f"{svc.url}/v1/tasks", content=body, headers={"content-type": "application/json"}, timeout=120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status_code == 413, r.text
    assert peak < 100 * 1024 * 1024, ("json body", peak)
    malformed = bomb.getvalue()[:200] + b"\x00" * 500 + bomb.getvalue()[-300:]
    for data in (malformed, b"PAR1garbagePAR1"):
        r = _upload(svc.url, "bad", "x.parquet", data)
        assert r.status_code == 422 and "Parquet" in r.json()["message"], r.text
    assert _counts(svc) == (0, 0)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet=chars),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet=chars), inner,
                                                                                         max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(items=st.lists(json_values, max_size=6), ascii_only=st.booleans(),
       before=st.dictionaries(st.text(alphabet=chars), json_values, max_size=3))
def test_json_sample_count_matches_the_parser(items: list[Any], before: dict[str, Any], ascii_only: bool) -> None:
    from atlas.json_bounds import json_array_length

    body = {k: v for k, v in before.items() if k != "samples"} | {"samples": items, "after": before}
    raw = json.dumps(body, ensure_ascii=ascii_only).encode()
    # every element counted except bare scalars other than strings (those are invalid samples anyway)
    countable = sum(1 for x in items if isinstance(x, str | list | dict))
    assert countable <= json_array_length(raw, "samples") <= len(items)


def test_idempotency_key_is_bound_to_the_body(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm)
    first = _encode([Sample(text="the quick brown fox jumps")], "jsonl", "text")
    other = _encode([Sample(text="an entirely different sample")], "jsonl", "text")
    h = {"Idempotency-Key": "key-1"}
    r1 = _upload(svc.url, "idem", *first, headers=h)
    r2 = _upload(svc.url, "idem", *first, headers=h)
    assert r1.status_code == r2.status_code == 202 and r1.json()["job"]["id"] == r2.json()["job"]["id"]
    before = _counts(svc)
    for name, body in (("idem", other), ("idem-2", first)):
        r = _upload(svc.url, name, *body, headers=h)
        assert r.status_code == 409 and "Idempotency-Key" in r.json()["message"], r.text
    _wait(svc.url, r1.json()["job"]["id"])
    tid = r1.json()["task"]["id"]
    h2 = {"Idempotency-Key": "append-1"}
    a1 = httpx.post(f"{svc.url}/v1/tasks/{tid}/samples", json={"samples": [{"text": "more text here"}]}, headers=h2)
    a2 = httpx.post(f"{svc.url}/v1/tasks/{tid}/samples", json={"samples": [{"text": "other text"}]}, headers=h2)
    assert a1.status_code == 202 and a2.status_code == 409, a2.text
    assert _counts(svc) == (before[0], before[1] + 1)


def test_failed_create_frees_its_name(serve, tiny_lm) -> None:
    svc = serve(lm=tiny_lm)
    r = _upload(svc.url, "reuse", "s.txt", b"a\n")  # one token: nothing usable, the create job fails
    assert r.status_code == 202
    assert _wait(svc.url, r.json()["job"]["id"])["status"] == "failed"
    assert httpx.get(f"{svc.url}/v1/tasks/{r.json()['task']['id']}").json()["status"] == "failed"
    r2 = _upload(svc.url, "  reuse ", *_encode([Sample(text="a longer sample of text")], "jsonl", "text"))
    assert r2.status_code == 202, r2.text
    assert r2.json()["task"]["name"] == "reuse"
    assert _wait(svc.url, r2.json()["job"]["id"])["status"] == "succeeded"
    assert httpx.get(f"{svc.url}/v1/tasks", params={"name": "reuse"}).json()["total"] == 1


def _export(url: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(x) for x in httpx.get(f"{url}/v1/spaces/default/export").content.split(b"\n") if x]
    return lines[0], lines[1:-1], lines[-1]


def _import(url: str, lines: list[Any], **params: str) -> httpx.Response:
    blob = b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)
    return httpx.post(f"{url}/v1/spaces/import", params=params, files={"file": ("s.jsonl", blob)})


def _resign(lines: list[Any]) -> list[Any]:
    """Recompute the trailer, as a forger would: checks must not rest on the checksum alone."""
    import hashlib

    body = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    return [*lines, {"trailer": True, "n_tasks": len(lines) - 1, "sha256": hashlib.sha256(body).hexdigest()}]


def test_import_verifies_never_trusts(serve, tiny_lm) -> None:
    src, dst = serve(lm=tiny_lm), serve(lm=tiny_lm)
    for name, text in (("prose", "The quick brown fox jumps over the lazy dog."), ("chem", "CC(=O)OC1=CC=CC=C1")):
        r = _upload(src.url, name, *_encode([Sample(text=text), Sample(text=text[::-1])], "jsonl", "text"))
        assert _wait(src.url, r.json()["job"]["id"])["status"] == "succeeded"
    tid = httpx.get(f"{src.url}/v1/tasks", params={"name": "prose"}).json()["items"][0]["id"]
    job = httpx.post(f"{src.url}/v1/tasks/{tid}/samples", json={"samples": [{"text": "More prose, more words."}]})
    assert _wait(src.url, job.json()["job"]["id"])["status"] == "succeeded"
    header, tasks, trailer = _export(src.url)
    assert trailer["trailer"] is True and trailer["n_tasks"] == 2
    scaled = dict(tasks[0])
    vec = np.frombuffer(base64.b64decode(scaled["signature"]), dtype="<f4") * 1e6
    scaled["signature"] = base64.b64encode(vec.astype("<f4").tobytes()).decode()
    other = dict(tasks[1])
    other["signature"] = tasks[0]["signature"]
    huge = json.loads(json.dumps(header))
    huge["space"]["m"] = huge["space"]["spec"]["m"] = 2**33
    v1_short = dict(header, version=1)
    bad = {
        "scaled signature": _resign([header, scaled, tasks[1]]),
        "another task's signature": _resign([header, tasks[0], other]),
        "counts": _resign([header, dict(tasks[0], n_tokens=tasks[0]["n_tokens"] + 1), tasks[1]]),
        "truncated": [header, tasks[0]],
        "trailer of another file": [header, tasks[0], trailer],
        "m = 2**33": _resign([huge, *tasks]),
        "version 1 incomplete": [v1_short, tasks[0]],
        "nested metadata": _resign([header, dict(tasks[0], metadata=json.loads('{"a":' * 40 + "1" + "}" * 40))]),
    }
    routing = tasks[0]["routing"]  # a routing record out of its documented ranges is refused, not stored
    for field, value in (("false_reject_rate", 3.0), ("false_reject_rate", 0.9), ("false_reject_rate", 0),
                         ("false_reject_rate", "0.1"), ("threshold_override", "abc"), ("threshold_override", [0.1]),
                         ("threshold_override", True), ("threshold_override", 2.0),
                         # a switch that is not a JSON boolean was dropped (the test stayed on); a string of scores
                         # was read a character at a time ("could not convert string to float: 'a'")
                         ("template_test", "false"), ("novelty_test", 0), ("cal_scores", "abc"),
                         ("cal_scores", [0.1, True]), ("cal_scores", {"a": 0.1})):
        bad[f"routing {field} {value!r}"] = _resign([header, dict(tasks[0], routing={**routing, field: value}),
                                                     tasks[1]])
    for why, lines in bad.items():
        r = _import(dst.url, lines)
        assert r.status_code == 422, (why, r.text)
        if why.startswith("routing"):  # named by the file's task, not by an id the rollback took back
            assert r.json()["message"].startswith(f"task {tasks[0]['name']!r}: invalid routing record"), r.text
    assert _counts(dst) == (0, 0)
    cut = httpx.get(f"{src.url}/v1/spaces/default/export").content
    assert _import(dst.url, [cut[: len(cut) - 40]]).status_code == 422  # cut mid-trailer
    assert _import(dst.url, [cut[: len(cut) // 2]]).status_code == 422  # cut mid-line
    assert _counts(dst) == (0, 0)
    # a complete version-1 file (no trailer) is still accepted
    r = _import(dst.url, [dict(header, version=1, n_tasks=1), tasks[1]])
    assert r.status_code == 200 and r.json()["imported"] == 1, r.text
    # names with surrounding whitespace are normalised like every task name: skip works
    spaced = dict(tasks[1], name=f"  {tasks[1]['name']}\t")
    r = _import(dst.url, _resign([header, tasks[0], spaced]), on_conflict="skip")
    assert r.status_code == 200 and r.json()["skipped"] == [tasks[1]["name"]], r.text
    # versions preserved, answers equal
    got = {t["name"]: t for t in httpx.get(f"{dst.url}/v1/tasks").json()["items"]}
    want = {t["name"]: t for t in httpx.get(f"{src.url}/v1/tasks").json()["items"]}
    assert got["prose"]["version"] == want["prose"]["version"] == 2
    assert _routes(src.url) == _routes(dst.url)


def test_uploads_that_once_answered_500_or_lost_text_are_422(serve, tiny_lm) -> None:
    """Review findings: invalid UTF-8 in a .json file, a 5,000-digit number (in a sample or the metadata
    field), a CSV row with an unquoted comma (it was cut, its tail stored as another field) — each a 422
    naming the place, and nothing stored."""
    svc = serve(lm=tiny_lm)
    huge = "1" * 5001
    cases = [
        (dict(fname="a.json", data=b'[{"text": "\xff"}]'), "not valid UTF-8"),
        (dict(fname="a.jsonl", data=b'{"text": "hello", "n": ' + huge.encode() + b"}\n"), "too many digits"),
        (dict(fname="a.jsonl", data=b'{"text": "hello"}\n', metadata='{"a": ' + huge + "}"), "too many digits"),
        (dict(fname="a.csv", data=b"prompt,completion\nWhat is 2+2, exactly?,4\n", mode="completion"),
         "3 fields but the header has 2"),
    ]
    for case, message in cases:
        r = _upload(svc.url, "bad", **case)  # type: ignore[arg-type]
        assert r.status_code == 422 and message in r.json()["message"], (case["fname"], r.text)
    assert _counts(svc) == (0, 0)
