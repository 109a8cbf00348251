"""Inputs that made the service's work quadratic (a denial-of-service review, 2026-12-07); each failed before its fix.

These are not speed targets (those live in ``bench/``): each input below took minutes (extrapolated from the review's
measurements) where the fixed code takes well under a second, and each check allows twenty times more than that.

* The JSON pre-counts (``atlas.json_bounds``) restarted a scan to the end at every escaped quote of a string left
  open: 40 KB of ``"\\"\\"…`` took 4.9 s, a 150 KB route body 75 s of the event loop.
* Secret redaction (``atlas.redaction``) tried a URL scheme from every letter of a run: a 40,000-letter query string
  took 1.6 s of the event loop in the access log, and a message was redacted whole before it was cut.
* A UTF-16 body hid its values from the count (it reads UTF-8 bytes; ``json.loads`` decoded UTF-16): a JSON body
  is UTF-8, as RFC 8259 says.
* NFC normalisation of lexical tokens reorders a run of combining marks in quadratic time: 20,000 marks in one
  prompt took 0.9 s, in a 100,000-character sample about 15 s.
"""

from __future__ import annotations

import time
import unicodedata
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from atlas.json_bounds import first_item_over, first_line_over, json_array_length, json_token_count
from atlas.lexical import nfc, tokens
from atlas.redaction import redact_cut, redact_secrets

OPEN_STRING = b'"' + b'\\"' * 200_000
"""A JSON string left open, full of escaped quotes: 400 KB (the quadratic scan: about 8 minutes)."""


def _within(seconds: float, run: Any) -> Any:
    t0 = time.monotonic()
    out = run()
    assert time.monotonic() - t0 < seconds, f"took {time.monotonic() - t0:.1f} s"
    return out


def test_json_precounts_are_linear_on_open_strings() -> None:
    assert _within(10, lambda: json_token_count(OPEN_STRING, 10**9)) == 0
    assert _within(10, lambda: first_item_over(b"[" + OPEN_STRING, 10)) is None
    assert _within(10, lambda: first_line_over(OPEN_STRING, 10)) is None
    assert _within(10, lambda: json_array_length(b'{"samples": [' + OPEN_STRING, "samples")) == 1


def test_an_open_string_body_is_refused_at_once(serve: Any, tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        for path in ("/v1/route", "/v1/tasks"):
            r = _within(20, lambda p=path: http.post(p, content=b'{"prompt": ' + OPEN_STRING,
                                                     headers={"content-type": "application/json"}))
            assert r.status_code == 422, r.text
        utf16 = ('{"prompts": ["\u0122", ' + ", ".join(["{}"] * 200_000) + "]}").encode("utf-16-le")
        r = http.post("/v1/route", content=utf16, headers={"content-type": "application/json"})  # past the count
        assert r.status_code == 422 and "not UTF-8" in r.json()["message"], r.text
        assert r.json()["detail"] == {"encoding": "utf-16-le"}
        r = http.post("/v1/route", content=b'{"prompt": "a b", "x": "\xff"}',
                      headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"] == {"byte": 24}, r.text
        # a repeated key names it in the detail on every route, as a task's upload did (a maintainability review:
        # /v1/route's 422 had "detail": null)
        for path, key in (("/v1/route", "prompt"), ("/v1/tasks", "name")):
            body = f'{{"{key}": "a", "{key}": "b", "samples": [{{"text": "hello there world"}}]}}'.encode()
            r = http.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422 and r.json()["detail"] == {"key": key}, (path, r.text)
        long_key = '{"prompt": "a b c", "' + "a" * 300_000 + '": 1}'  # echoed in the 422's detail, redacted
        r = _within(20, lambda: http.post("/v1/route", content=long_key.encode(),
                                          headers={"content-type": "application/json"}))
        assert r.status_code == 422 and len(r.content) < 20_000, r.text[:500]
        r = _within(20, lambda: http.post("/v1/tasks", data={"name": "t", "space": "a" * 300_000},
                                          files={"file": ("t.txt", b"one\ntwo\n", "text/plain")}))
        assert r.status_code == 422 and "'space' has 300000 characters" in r.json()["message"], r.text


def test_redaction_reads_a_bounded_prefix_and_finds_secrets_at_the_cut() -> None:
    assert _within(10, lambda: redact_secrets("a" * 400_000)) == "a" * 400_000
    secret = "postgresql://me:hunter2@db/x"
    cut = redact_cut("x" * 290 + secret + "y" * 100_000, 300)
    assert "hunter2" not in cut and cut.endswith(f"(cut from {len(secret) + 100_290:,} characters)") and len(cut) < 400
    long_password = redact_cut("postgresql://me:" + "p" * 900 + "@db/x", 300)  # its "@" past the first window
    assert "ppp" not in long_password and long_password.endswith(":***@db/x")
    straddling = redact_cut("postgresql://me:" + "p" * 600 + "@db/x " + "y" * 100_000, 300)  # "@" past the window
    assert "ppp" not in straddling and straddling.startswith("postgresql://me:***@db/x yyy")
    assert redact_secrets("1postgresql://me:hunter2@db -redis://:pw@h") == "1postgresql://me:***@db -redis://:***@h"


@given(st.text(alphabet=st.sampled_from("ae\u0301\u0300\u0345\u0327\u0344\u0903 ǘ日本"), max_size=120))
def test_nfc_is_unicode_nfc_for_any_text(text: str) -> None:
    """Runs of marks long or short, in any order, with marks that decompose (U+0344) or have class 0 (U+0903)."""
    assert nfc(text) == unicodedata.normalize("NFC", text)
    assert tokens(text) == tokens(unicodedata.normalize("NFC", text))


def test_a_long_run_of_marks_in_descending_class_is_normalised_in_linear_time() -> None:
    text = "a" + "\u0345" * 100_000 + "\u0301" * 100_000 + " café"
    words = _within(10, lambda: tokens(text))
    in_order = "a" + "\u0301" * 100_000 + "\u0345" * 100_000  # canonical order: class 230 before 240
    assert words[-1] == "café" and words[0] == unicodedata.normalize("NFC", in_order)
