"""Over HTTP, an upload whose JSON record repeats a sample field, or whose metadata form field repeats a key, is a
422 naming it, and nothing is stored (the readers' rule: ``tests/atlas/test_repeated_json_keys.py``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st


def test_an_upload_repeating_a_field_stores_nothing_and_names_the_line(serve: Any, tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    body = b'{"prompt": "Q: 1?", "completion": "A"}\n{"prompt": "Q: 2?", "prompt": "Q: 3?", "completion": "B"}\n'
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        r = http.post("/v1/tasks", data={"name": "pairs", "mode": "completion"},
                      files={"file": ("pairs.jsonl", body, "application/jsonl")})
        assert r.status_code == 422, r.text
        assert "line 2" in r.json()["message"] and "'prompt'" in r.json()["message"], r.text
        r = http.post("/v1/tasks", data={"name": "meta", "mode": "text", "metadata": '{"owner": "a", "owner": "b"}'},
                      files={"file": ("t.txt", b"one sample\nanother sample\n", "text/plain")})
        assert r.status_code == 422 and "'owner'" in r.json()["message"], r.text
        assert http.get("/v1/tasks").json()["total"] == 0  # nothing stored


def test_every_json_body_refuses_a_repeated_key(serve: Any, tiny_lm: Any) -> None:
    """A JSON upload body of any size (validated by pydantic, which keeps the last value) and the other JSON bodies
    (read by the bounded request) refuse a key given twice in one object; the same bodies without it pass."""
    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    filler = ", ".join(f'{{"text": "sample {i} of the task"}}' for i in range(3000))  # past the precount size
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        for samples in ('{"text": "a b c"}', filler):
            for repeated, key in ((f'[{samples}, {{"text": "x", "text": "y"}}]', "text"),
                                  (f'[{samples}], "samples": [{{"text": "z"}}]', "samples")):
                r = http.post("/v1/tasks", content=f'{{"name": "t", "samples": {repeated}}}'.encode(),
                              headers={"content-type": "application/json"})
                assert r.status_code == 422 and f"'{key}'" in r.json()["message"], r.text
        r = http.post("/v1/tasks", content=b'{"name": "t", "metadata": {"a": {"b": 1, "b": 2}}, '
                                            b'"samples": [{"text": "\\"k\\": 1"}]}',
                      headers={"content-type": "application/json"})
        assert r.status_code == 422 and "'b'" in r.json()["message"], r.text
        assert http.get("/v1/tasks").json()["total"] == 0
        r = http.post("/v1/tasks", content=b'{"name": "t", "metadata": {"a": {"b": 1}, "b": 2}, '
                                            b'"samples": [{"text": "\\"text\\": \\"b\\": 1"}]}',
                      headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text
        task = r.json()["task"]["id"]
        r = http.patch(f"/v1/tasks/{task}", content=b'{"metadata": {"owner": "a", "owner": "b"}}',
                       headers={"content-type": "application/json"})
        assert r.status_code == 422 and "'owner'" in r.json()["message"], r.text
        assert http.get(f"/v1/tasks/{task}").json()["metadata"] == {"a": {"b": 1}, "b": 2}
        r = http.post("/v1/route", content=b'{"prompts": ["a"], "prompts": ["b"]}',
                      headers={"content-type": "application/json"})
        assert r.status_code == 422 and "'prompts'" in r.json()["message"], r.text
        # a UTF-8 byte-order mark is no JSON: read past by every route (an upload's body answered "expected value at
        # line 1 column 1"; a data-integrity review, 2026-12-07)
        for path, body in (("/v1/tasks", b'{"name": "bom", "samples": [{"text": "a b c"}]}'),
                           ("/v1/route", b'{"prompt": "a b c"}')):
            r = http.post(path, content=b"\xef\xbb\xbf" + body, headers={"content-type": "application/json"})
            assert r.status_code in (200, 202), (path, r.text)


_JSON_TREES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


@given(tree=_JSON_TREES, indent=st.sampled_from([None, 1]), ascii_only=st.booleans())
def test_the_key_count_of_a_json_body_is_exact(tree: Any, indent: int | None, ascii_only: bool) -> None:
    """The cheap test's count of a body's keys (strings followed by a colon, every string matched whole) equals the
    keys of its objects, whatever its strings hold (quotes, backslashes, colons): a body without a repeated key is
    never decoded twice, and one with a repeat always is."""
    from atlas.json_bounds import json_key_count

    def keys(node: Any) -> int:
        if isinstance(node, dict):
            return len(node) + sum(keys(v) for v in node.values())
        return sum(keys(v) for v in node) if isinstance(node, list) else 0

    body = json.dumps(tree, indent=indent, ensure_ascii=ascii_only).encode()
    assert json_key_count(body) == keys(tree)
