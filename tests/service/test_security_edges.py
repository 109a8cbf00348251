"""Security edges at the HTTP boundary: paths the key check must see as the router sees them.

Real uvicorn servers on real sockets (the ``bind`` fixture of :mod:`tests.service.test_security`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette._utils import get_route_path

from atlas import apikeys
from service.security import route_path
from tests.service.test_security import bind  # noqa: F401  (fixture)


@pytest.mark.parametrize("root, path", [
    ("", "/v1/tasks"), ("/api", "/api/v1/tasks"), ("/api/", "/api//v1/tasks"), ("/api/", "/api/v1/tasks"),
    ("/api", "/api"), ("/api", "/apiv1/tasks"), ("/api", "/v1/tasks"), ("/api//", "/api///v1/keys"),
])
def test_route_path_is_the_routers_path(root: str, path: str) -> None:
    """The middleware decides on the path Starlette routes on (else a route is reached unchecked)."""
    scope = {"type": "http", "path": path, "root_path": root}
    assert route_path(scope) == (get_route_path(scope) or "/")


def test_root_path_with_a_trailing_slash_keeps_keys_and_the_rate_limit(bind: Any) -> None:  # noqa: F811
    """``--root-path /api/`` makes uvicorn send ``/api//v1/keys``, which Starlette routes as ``/v1/keys``;
    the middleware saw ``//v1/keys``, skipped the key check and the rate limit, and the route fell back
    to the static rule (loopback ``settings.host`` → no key): an anonymous caller on a wildcard bind
    created an admin key."""
    url, app = bind("0.0.0.0", connect="127.0.0.1", root_path="/api/", rate_limit_per_s=0.01,
                    rate_limit_burst=3)
    with app.state.container.store.session() as s:
        _, admin = apikeys.create_api_key(s, "root", ["admin"])
    r = httpx.post(f"{url}/v1/keys", json={"name": "evil", "scopes": ["admin"]})
    assert r.status_code == 401, r.text
    assert httpx.get(f"{url}/v1/tasks").status_code == 401
    codes = [httpx.get(f"{url}/v1/tasks", headers={"X-API-Key": admin}).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    with app.state.container.store.read() as s:
        assert [k.name for k in apikeys.list_api_keys(s)] == ["root"]


def test_route_check_fails_closed_before_the_middleware_made_its_gate(bind: Any, tmp_path: Path) -> None:  # noqa: F811
    """Without the middleware's principal, ``authorize`` applies the gate's rule (a key once any exists),
    not the static rule of ``settings.host``."""
    from types import SimpleNamespace

    from atlas.errors import Unauthorized
    from service.auth import authorize

    _url, app = bind()
    container = app.state.container
    with container.store.session() as s:
        apikeys.create_api_key(s, "root", ["admin"])
    assert getattr(container, "key_gate", None) is None  # no /v1 request went through the middleware yet
    request = SimpleNamespace(scope={"type": "http", "server": ("127.0.0.1", 1), "headers": []}, headers={},
                              state=SimpleNamespace())
    with pytest.raises(Unauthorized):
        authorize(request, container, "read")  # type: ignore[arg-type]


# -- NUL in text that reaches SQL --------------------------------------------------------------------


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_nul_in_names_and_space_refs_is_answered_alike_on_both_databases(bind: Any, db: str,  # noqa: F811
                                                                         request: pytest.FixtureRequest) -> None:
    """PostgreSQL refuses NUL in text parameters (``DataError``); every lookup, filter and key name holding one
    answered 500 there, while SQLite answered 200/404 or stored a key named with a NUL."""
    values: dict[str, Any] = {}
    if db == "postgresql":
        values["database_url"] = request.getfixturevalue("pg_database")()
    url, _app = bind(**values)
    c = httpx.Client(base_url=url, timeout=30)
    expect = [
        (c.get("/v1/tasks", params={"name": "a\x00"}), 200),
        (c.get("/v1/tasks", params={"name_prefix": "a\x00"}), 200),
        (c.get("/v1/tasks", params={"space": "a\x00"}), 404),
        (c.get("/v1/spaces/a%00"), 404),
        (c.get("/v1/spaces/a%00/export"), 404),
        (c.get("/v1/atlas", params={"space": "a\x00"}), 404),
        (c.post("/v1/tasks", json={"name": "t", "space": "a\x00", "samples": [{"text": "hello world"}]}), 404),
        (c.post("/v1/route", json={"prompt": "hello world", "space": "a\x00"}), 404),
        (c.post("/v1/route/fit", json={"examples": [{"prompt": "hello world there", "label": "a\x00"}]}), 404),
        (c.post("/v1/keys", json={"name": "k\x00", "scopes": ["read"]}), 422),
        # control characters as in a task name: an escape sequence, a line separator, a bidirectional override
        (c.post("/v1/keys", json={"name": "k\x1b[2J", "scopes": ["read"]}), 422),
        (c.post("/v1/keys", json={"name": "\u202e\u2028", "scopes": ["write"]}), 422),
    ]
    for i, (r, status) in enumerate(expect):
        assert r.status_code == status, (i, r.status_code, r.text)
    for r, _status in expect[:2]:
        assert r.json()["items"] == [] and r.json()["total"] == 0
    assert c.get("/v1/keys").json()["items"] == []  # no key named with a NUL or a control character was stored



# -- Origin ----------------------------------------------------------------------------------------------


def test_an_unparsable_origin_is_refused_not_a_server_error(bind: Any) -> None:  # noqa: F811
    """``Origin: http://[::1`` made ``urlsplit`` raise ``ValueError`` in the middleware: 500 instead of 403."""
    url, app = bind()
    for origin in ("http://[::1", "http://[zz]:80", "https://[::1]x"):
        r = httpx.post(f"{url}/v1/tasks", json={"name": "t", "samples": [{"text": "hello world"}]},
                       headers={"Origin": origin})
        assert r.status_code == 403, (origin, r.text)
        assert r.json()["code"] == "forbidden_origin"
    assert app.state.container.tasks.page().total == 0


def test_a_refusal_before_any_route_masks_a_secret_it_quotes(bind: Any) -> None:  # noqa: F811
    """The middleware rendered its refusals itself, without the handlers' redaction: a foreign Origin carrying a
    password was quoted back in full. It sends the handlers' response now (``service.errors.error_response``)."""
    url, _ = bind()
    r = httpx.post(f"{url}/v1/tasks", json={"name": "t", "samples": [{"text": "hello world"}]},
                   headers={"Origin": "https://admin:hunter2secret@evil.example"})
    assert r.status_code == 403 and r.json()["code"] == "forbidden_origin", r.text
    assert "hunter2secret" not in r.text and "evil.example" in r.json()["message"], r.text


# -- JSON bodies of the small routes ----------------------------------------------------------------------


def test_json_bodies_holding_millions_of_values_are_refused_before_they_are_built(bind: Any) -> None:  # noqa: F811
    """A 6 MB body of two million empty objects (``{"scopes": [{}, {}, ...]}``) was parsed into Python objects
    (about 26 bytes of memory per byte of body: 1.6 GB for a 63 MB body) before pydantic refused it; such a
    body is now refused with 413 from a bounded scan, and bodies of legitimate size still pass."""
    url, _app = bind()
    c = httpx.Client(base_url=url, timeout=60)
    many = b",".join([b"{}"] * 2_000_000)
    for path, body in (("/v1/keys", b'{"name":"x","scopes":[' + many + b"]}"),
                       ("/v1/route", b'{"prompts":[' + many + b"]}"),
                       ("/v1/align/matrix", b'{"task_ids":[' + b",".join([b"1"] * 2_000_000) + b"]}"),
                       ("/v1/route/fit", b'{"examples":[' + many + b"]}")):
        r = c.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413, (path, r.status_code, r.text[:300])
        assert r.json()["code"] == "payload_too_large"
    r = c.patch("/v1/tasks/1", content=b'{"metadata":{"a":[' + many + b"]}}",
                headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:300]
    # the largest legitimate bodies stay well inside the bound
    examples = [{"prompt": f"prompt number {i}, with commas, [brackets] and {{braces}}", "label": "none"}
                for i in range(2000)]
    r = c.post("/v1/route/fit", json={"examples": examples, "dry_run": True})
    assert r.status_code != 413, r.text[:300]
    r = c.post("/v1/align/matrix", json={"task_ids": list(range(1, 257))})
    assert r.status_code == 404, r.text[:300]  # unknown tasks, not a refused body


# -- rate limit of failed authentication ---------------------------------------------------------------


def test_wrong_keys_take_from_the_address_bucket(bind: Any) -> None:  # noqa: F811
    """A 401 was answered before the rate limit: an address could try keys without end (each try one database
    read), however low ``rate_limit_per_s``; failed tries now spend the address's tokens, then answer 429."""
    url, app = bind(require_keys=True, rate_limit_per_s=0.01, rate_limit_burst=3)
    with app.state.container.store.session() as s:
        _, good = apikeys.create_api_key(s, "r", ["read"])
    codes = [httpx.get(f"{url}/v1/tasks", headers={"X-API-Key": f"fa_guess{i}"}).status_code for i in range(5)]
    assert codes == [401, 401, 401, 429, 429], codes
    r = httpx.get(f"{url}/v1/tasks")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert httpx.get(f"{url}/v1/tasks", headers={"X-API-Key": good}).status_code == 200  # a valid key: its bucket


def test_json_uploads_holding_millions_of_other_values_are_refused_before_they_are_built(bind: Any) -> None:  # noqa: F811
    """The JSON upload counted only its ``samples``: two million ``{}`` in ``metadata`` or in an unknown field were
    built by pydantic first (a 63 MB body: 4.8 GB of memory and 30 s) before the 422; now 413 from a bounded scan."""
    url, app = bind()
    c = httpx.Client(base_url=url, timeout=60)
    many = b",".join([b"{}"] * 2_000_000)
    one = b'{"text":"hello world"}'
    bodies = [("/v1/tasks", b'{"name":"x","samples":[' + one + b'],"metadata":{"a":[' + many + b"]}}"),
              ("/v1/tasks", b'{"name":"x","samples":[' + one + b'],"zzz":[' + many + b"]}"),
              ("/v1/tasks", b'{"name":"x","samples":[{"text":"a b","x":[' + many + b"]}]}")]
    for path, body in bodies:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413, (r.status_code, r.text[:300])
        assert r.json()["code"] == "payload_too_large"
    assert app.state.container.tasks.page().total == 0
    # a JSON upload of the most samples allowed still passes the scan (refused later only by its own limits)
    url2, _ = bind(max_samples=20_000)
    samples = [{"prompt": f"p{i}", "completion": f"c{i}", "text": None} for i in range(20_000)]
    r = httpx.post(f"{url2}/v1/tasks", json={"name": "big", "mode": "completion", "samples": samples,
                                             "metadata": {"k": list(range(2000))}}, timeout=120)
    assert r.status_code == 202, r.text[:300]


def test_an_import_line_holding_millions_of_values_is_refused_before_it_is_built(serve: Any, tiny_lm: Any) -> None:
    """An import line of a million ``{}`` was built by pydantic before the 422 (63 MB: 8.4 GB of memory, 30 s);
    a line holding more values than any export line can is now refused with 413 first."""
    from tests.service.conftest import wait_job

    c = httpx.Client(base_url=serve(lm=tiny_lm).url, timeout=60)
    many = b",".join([b"{}"] * 1_000_000)
    for data in (b'{"format":"fisher-atlas-space","zzz":[' + many + b"]}\n",
                 b'{"format":"fisher-atlas-space"}\n{"name":"t","metadata":{"a":[' + many + b"]}}\n"):
        r = c.post("/v1/spaces/import", files={"file": ("x.jsonl", data)})
        assert r.status_code == 413, (r.status_code, r.text[:300])
        assert r.json()["code"] == "payload_too_large"
    # a real export still imports
    r = c.post("/v1/tasks", json={"name": "t", "samples": [{"text": "hello world"}, {"text": "good night"}]})
    assert r.status_code == 202, r.text
    assert wait_job(c, r.json()["job"]["id"])["status"] == "succeeded"
    export = c.get("/v1/spaces/default/export")
    assert export.status_code == 200
    r = c.post("/v1/spaces/import", params={"on_conflict": "skip"}, files={"file": ("x.jsonl", export.content)})
    assert r.status_code == 200, r.text[:300]


def test_concurrent_first_uses_share_one_key_gate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``key_gate`` made the container's gate on first use without a lock: two requests at once could each make
    one, and a key created or revoked through one left the other's cached "some key exists" answer stale."""
    import threading
    import time
    from types import SimpleNamespace

    from atlas.settings import Settings
    from service import auth

    made: list[object] = []
    real_init = auth.KeyGate.__init__

    def slow_init(self: Any, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.05)  # widen the window two first uses race in
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(auth.KeyGate, "__init__", slow_init)
    store = SimpleNamespace(read=None, write=None)
    container = SimpleNamespace(settings=Settings(data_dir=tmp_path), store=store, key_gate=None)
    start = threading.Barrier(8)
    got: list[object] = []

    def first_use() -> None:
        start.wait()
        got.append(auth.key_gate(container))

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in got)
