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


def test_an_idle_client_saves_no_more_than_its_burst() -> None:
    """The bucket's fill is capped at its burst: without the cap an idle client saved up without bound (a mutation
    of the cap survived the property test above, whose gaps are short)."""
    bucket = TokenBucket(1.0, 3)
    assert bucket.take("c", now=0.0) == 0
    assert [bucket.take("c", now=1000.0) == 0 for _ in range(10)] == [True] * 3 + [False] * 7


def test_access_lines_keep_their_fields_and_mask_secrets(capsys: object) -> None:
    """uvicorn's access formatter reads the client, method, path and status from the record's arguments: the log
    redaction folded them into the message, so a request whose URL held a key-like string (a task named
    ``fa_molecules_v2``, a key in a query string) logged "--- Logging error ---" and a traceback in place of its
    line, and the exception being handled printed the secret unmasked (an operations review, 2026-12-07)."""
    import io
    import logging

    from uvicorn.logging import AccessFormatter

    from service.logs import install_log_redaction

    install_log_redaction()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False))
    access = logging.getLogger("uvicorn.access")
    # this handler alone: an earlier test's uvicorn left its handler on a stream pytest has since closed
    old_handlers, access.handlers = access.handlers, [handler]
    old_level, access.propagate = access.level, False
    access.setLevel(logging.INFO)
    secret = "fa_" + "Q" * 43
    try:
        access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5555", "GET", f"/v1/tasks?api_key={secret}&token=t0ken",
                    "1.1", 404)
        logging.getLogger("atlas.test").warning("opened %s with password=%s", "db", "hunter2secret")
    finally:
        access.handlers = old_handlers
        access.setLevel(old_level)
        access.propagate = True
    line = out.getvalue()
    assert line.startswith('127.0.0.1:5555 - "GET /v1/tasks?api_key=***&token=*** HTTP/1.1" 404'), line
    assert secret not in line and "Logging error" not in line
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "Logging error" not in err and secret not in err


def test_arguments_a_message_cannot_take_are_masked_before_they_are_printed() -> None:
    """``log.warning("no placeholder", "token=abc123")`` cannot be formatted: logging's handler prints "--- Logging
    error ---" with the record's arguments as they are, and the secret went out unmasked (a diff review,
    2026-12-07). The record the factory makes holds them masked."""
    import logging

    from service.logs import install_log_redaction

    install_log_redaction()
    record = logging.getLogRecordFactory()("atlas.test", logging.WARNING, __file__, 1, "no placeholder",
                                           ("token=abc123secret", 7), None)
    assert record.args == ("token=***", 7)
