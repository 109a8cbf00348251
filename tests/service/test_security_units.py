"""Properties of the security building blocks, over open-ended inputs (hypothesis)."""

from __future__ import annotations

import json
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from atlas.db import redact_url
from atlas.redaction import redact_secrets
from service.errors import MAX_DETAIL_CHARS, MAX_MESSAGE_CHARS, safe_body
from service.security import TokenBucket, _host_name, _normal_origin, _origin_of

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=2000),
    lambda kids: st.lists(kids, max_size=60) | st.dictionaries(st.text(max_size=50), kids, max_size=60),
    max_leaves=400,
)


@given(rate=st.floats(0.1, 100), burst=st.integers(1, 50),
       gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200))
@settings(max_examples=200, deadline=None)
def test_token_bucket_never_allows_more_than_burst_plus_rate(rate: float, burst: int, gaps: list[float]) -> None:
    bucket = TokenBucket(rate, burst)
    t, allowed = 0.0, []
    for g in gaps:
        t += g
        wait = bucket.take("c", now=t)
        if wait == 0:
            allowed.append(t)
        else:  # the promised wait is enough, and not needlessly long
            assert 0 < wait <= 1.0 / rate + 1e-9
    for i, start in enumerate(allowed):
        for j in range(i, len(allowed)):
            assert j - i + 1 <= burst + rate * (allowed[j] - start) + 1e-6


@given(password=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=6, max_size=40))
@settings(max_examples=200, deadline=None)
def test_redact_url_never_shows_the_password(password: str) -> None:
    url = f"postgresql+psycopg://u:{quote(password, safe='')}@h:5432/d"
    shown = redact_url(url)
    assert quote(password, safe="") not in shown and "***" in shown
    assert quote(password, safe="") not in redact_secrets(f"could not connect to {url}")


@given(message=st.text(max_size=50_000), detail=json_values)
@settings(max_examples=100, deadline=None)
def test_error_bodies_are_bounded(message: str, detail: object) -> None:
    body = safe_body("invalid_input", message, detail)
    assert len(body["message"]) <= MAX_MESSAGE_CHARS + 40
    assert len(json.dumps(body["detail"])) <= 2 * MAX_DETAIL_CHARS


@given(host=st.text(max_size=80), port=st.integers(1, 65535))
def test_own_origin_matches_what_a_browser_sends(host: str, port: int) -> None:
    name = "".join(ch for ch in host.lower() if ch.isascii() and (ch.isalnum() or ch in ".-")) or "h"
    assert _normal_origin(f"http://{name}:{port}") == _origin_of("http", f"{name}:{port}")
    assert _host_name(f"{name}:{port}") == name
    assert _host_name(f"[::1]:{port}") == "::1"
