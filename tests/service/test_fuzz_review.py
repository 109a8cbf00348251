"""Defects an API fuzz found (schemathesis and by hand, 2026-12-07); each case failed before its fix.

* A name of 300 characters that NFC makes longer (U+0958 is two characters in it) was stored at 600: a 500 on
  PostgreSQL (``varchar(300)``), and on SQLite an export its own import refused.
* ``false``, ``true`` and ``"0.3"`` were taken as thresholds and rates (``false`` stored an override of 0.0).
* A multipart field that is not UTF-8 was stored decoded as Latin-1, and a body's ``charset=latin-1`` re-read UTF-8.
* ``HEAD`` answered 405 on every API route, ``/healthz`` and ``/readyz`` included.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atlas.errors import InvalidInput
from atlas.task_names import normalize_name
from tests.service.conftest import wait_job

LONG_IN_NFC = "\u0958" * 300
"""300 characters that are 600 in NFC (U+0958 DEVANAGARI LETTER QA is a composition exclusion)."""
SAMPLES = [{"text": "The quick brown fox jumps over the lazy dog."}, {"text": "A lazy dog sleeps in the sun."},
           {"text": "The fox runs across the field at dawn."}]


@given(st.text(max_size=320))
def test_a_stored_name_is_1_to_300_characters_in_its_normal_form(name: str) -> None:
    try:
        stored = normalize_name(name)
    except InvalidInput:
        return
    assert 1 <= len(stored) <= 300 and unicodedata.is_normalized("NFC", stored)
    assert normalize_name(stored) == stored


@pytest.fixture(params=["sqlite", "postgresql"])
def service_url(request: pytest.FixtureRequest, serve: Any, tiny_lm: Any) -> str:
    extra = {}
    if request.param == "postgresql":
        extra["database_url"] = request.getfixturevalue("pg_database")()
    return str(serve(lm=tiny_lm, sketch_dim=128, **extra).url)


def test_a_name_over_300_characters_once_normalised_is_refused_and_nothing_stored(service_url: str) -> None:
    with httpx.Client(base_url=service_url, timeout=60) as http:
        r = http.post("/v1/tasks", json={"name": LONG_IN_NFC, "samples": SAMPLES})
        assert r.status_code == 422 and "600 in its normal form" in r.json()["message"], r.text
        form = http.post("/v1/tasks", data={"name": LONG_IN_NFC}, files={"file": ("s.txt", b"one line\nanother\n")})
        assert form.status_code == 422 and "normal form" in form.json()["message"], form.text
        assert http.get("/v1/tasks").json()["total"] == 0


def test_thresholds_and_rates_are_json_numbers(serve: Any, tiny_lm: Any) -> None:
    served = serve(lm=tiny_lm, sketch_dim=128)
    with httpx.Client(base_url=served.url, timeout=60) as http:
        r = http.post("/v1/tasks", json={"name": "prose", "samples": SAMPLES})
        assert wait_job(http, r.json()["job"]["id"])["status"] == "succeeded"
        task = r.json()["task"]["id"]
        for body in ({"threshold": False}, {"threshold": True}, {"threshold": "0.3"}, {"false_reject_rate": "0.1"}):
            refused = http.patch(f"/v1/tasks/{task}/routing", json=body)
            assert refused.status_code == 422, (body, refused.text)
        routing = http.get(f"/v1/tasks/{task}/routing").json()
        assert routing["threshold_override"] is None and routing["false_reject_rate"] in (None, 0.05), routing
        assert http.patch(f"/v1/tasks/{task}/routing", json={"threshold": 0}).json()["threshold_override"] == 0.0
        assert http.post("/v1/route", json={"prompt": "a fox", "threshold": True}).status_code == 422
        assert http.post("/v1/route", json={"prompt": "a fox", "threshold": 1}).status_code == 200


def _multipart(name: bytes, charset: str = "") -> tuple[bytes, dict[str, str]]:
    body = (b'--XX\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
            b'{"text": "hello world"}\n{"text": "hello again"}\n\r\n'
            b'--XX\r\nContent-Disposition: form-data; name="name"\r\n\r\n' + name + b"\r\n--XX--\r\n")
    return body, {"content-type": f"multipart/form-data; {charset}boundary=XX"}


def test_a_multipart_field_is_utf8_or_refused(serve: Any, tiny_lm: Any) -> None:
    served = serve(lm=tiny_lm, sketch_dim=128)
    with httpx.Client(base_url=served.url, timeout=60) as http:
        bad = http.post("/v1/tasks", content=_multipart(b"bad\xff\xfename")[0], headers=_multipart(b"")[1])
        assert bad.status_code == 422 and "'name' is not valid UTF-8 (byte 3)" in bad.json()["message"], bad.text
        body, headers = _multipart("naïve".encode(), "charset=latin-1; ")
        latin = http.post("/v1/tasks", content=body, headers=headers)
        assert latin.status_code == 422 and "charset='latin-1' is not taken" in latin.json()["message"], latin.text
        assert http.get("/v1/tasks").json()["total"] == 0
        body, headers = _multipart("naïve".encode(), "charset=UTF-8; ")
        ok = http.post("/v1/tasks", content=body, headers=headers)
        assert ok.status_code == 202 and ok.json()["task"]["name"] == "naïve", ok.text


def test_head_is_answered_wherever_get_is(serve: Any, tiny_lm: Any) -> None:
    served = serve(lm=tiny_lm, sketch_dim=128)
    with httpx.Client(base_url=served.url, timeout=30) as http:
        job = http.post("/v1/tasks", json={"name": "prose", "samples": SAMPLES}).json()["job"]["id"]
        wait_job(http, job)
        for path in ("/healthz", "/readyz", "/v1/tasks", f"/v1/jobs/{job}", "/v1/tasks/999"):
            got, head = http.get(path), http.head(path)
            assert head.status_code == got.status_code and head.content == b"", (path, head.status_code)
            assert head.headers.get("content-length") == got.headers.get("content-length"), path
            assert head.headers["content-type"] == got.headers["content-type"]
        stream = http.head(f"/v1/jobs/{job}/events", timeout=10)  # a stream's head ends at once
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        assert http.head("/v1/route").status_code == 405  # POST only: no GET to answer as


def test_the_schema_states_the_rules_the_service_applies(tmp_path: Any) -> None:
    """A schema-valid body was refused: an empty prompt of a batch, a task id given twice in a matrix."""
    from atlas.settings import Settings
    from service.app import create_app

    components = create_app(Settings(data_dir=tmp_path / "data")).openapi()["components"]["schemas"]
    prompts = components["RouteRequest"]["properties"]["prompts"]["anyOf"][0]
    assert prompts["items"] == {"type": "string", "minLength": 1}
    assert components["AlignMatrixRequest"]["properties"]["task_ids"]["uniqueItems"] is True
