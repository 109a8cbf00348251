"""Edges of uploads, error bodies, the library and space references found in review (2026-11-28); each failed
before its fix.

* A lone surrogate carried from a request into an error's message or detail (a ``fit`` label naming no task) made
  rendering the error raise: a 500, and the connection dropped.
* A TSV (or CSV) field opened by a double quote and not closed as a quoted field was read leniently: the quotes of
  ``"Stop!" he cried`` vanished, and one unbalanced quote merged every later row into one sample — silently.
* Library mode read files under the default sample limits whatever its settings, and ``matrix()`` failed when its
  bound was above the 1,000-task page limit.
* A space whose model name holds a slash (every hub id and local directory) could not be read or exported by name.
* The client's ``find_task("3", space=…)`` fell back to task id 3 of any space.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atlas.errors import InvalidInput
from atlas.sample_io import parse_upload
from fisher_atlas import Atlas
from service.errors import safe_body

PROSE = [f"The {a} fox jumps over the {b} dog near the {c}." for a, b, c in
         [("quick", "lazy", "barn"), ("brown", "old", "road"), ("red", "small", "river"), ("grey", "big", "farm")]]


_ANY_TEXT = st.lists(st.characters(categories=["Cs"]) | st.characters(), max_size=12).map("".join)
"""Any string, lone surrogates too (``st.text()`` has none)."""


@given(st.recursive(_ANY_TEXT | st.integers(), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(_ANY_TEXT, inner, max_size=3), max_leaves=8), _ANY_TEXT)
def test_an_error_body_always_encodes(detail: Any, message: str) -> None:
    import json

    body = safe_body("not_found", message, detail)
    json.dumps(body, ensure_ascii=False).encode("utf-8")  # raised UnicodeEncodeError on a lone surrogate


def test_a_fit_label_with_a_lone_surrogate_is_a_404_not_a_500(serve: Any, tiny_lm: Any) -> None:
    svc = serve(lm=tiny_lm, sketch_dim=256, overrides={"start_runner": False})
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        r = http.post("/v1/route/fit", content=b'{"examples": [{"prompt": "a b c", "label": "\\ud800"}]}',
                      headers={"content-type": "application/json"})
        assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
        assert "\\ud800" in r.json()["message"]
        assert http.get("/healthz").status_code == 200  # the same connection still serves


_FIELD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\r\n\x00\x85\u2028\u2029"),
                 min_size=1, max_size=20).filter(lambda t: t.strip() and t.isprintable())


@given(st.lists(_FIELD, min_size=1, max_size=6), st.sampled_from([("x.tsv", "\t"), ("x.csv", ",")]))
def test_a_delimited_file_is_read_as_written_or_refused_never_altered(texts: list[str], kind: tuple[str, str]) -> None:
    """Written plainly, one text per row (no quoting): each row is read back as it is, or the file is refused
    (a 422 naming the row), or — where rows happen to form well-formed quoted fields (`"a"`, or a row `"` then a row
    `"`) — read as a strict RFC 4180 reader reads them; never leniently (a malformed field's quotes dropped, rows
    merged)."""
    name, sep = kind
    if sep == "," and any("," in t for t in texts):
        return  # an unquoted comma is another error (more fields than the header), tested elsewhere
    data = ("text\n" + "".join(t + "\n" for t in texts)).encode()
    try:
        got = [s.text for s in parse_upload(data, name, "text")]
    except InvalidInput as e:
        assert '"' in "".join(texts) and "quoted field" in e.message, e.message
        return
    if got != texts:  # rows that open and close a quoted field between them (a row `"`, a row `"`): RFC 4180's
        # reading of the file, one field holding a line break, is what the strict reader gives — not an alteration
        rows = list(csv.reader(io.StringIO(data.decode(), newline=""), delimiter=sep, strict=True))
        assert any(t.startswith('"') for t in texts) and got == [r[0] for r in rows[1:]], (texts, got)


def test_a_tsv_quote_is_refused_with_its_row(tmp_path: Path) -> None:
    data = b'text\n"Stop!" he cried, and ran.\nsecond sample\n"unclosed quote at start\nfourth\n'
    with pytest.raises(InvalidInput) as err:
        parse_upload(data, "x.tsv", "text")
    assert err.value.message.startswith("x.tsv: row 2: malformed TSV") and err.value.detail == {"row": 2}
    quoted = b'text\n"""Stop!"" he cried, and ran."\nsecond sample\n'  # quoted as TSV writers quote
    assert [s.text for s in parse_upload(quoted, "x.tsv", "text")] == ['"Stop!" he cried, and ran.', "second sample"]


def test_library_files_use_the_configured_limits(tmp_path: Path, tiny_model_dir: Path) -> None:
    long = "word " * 30_000  # 150,000 characters: over the default 100,000, under the configured 200,000
    path = tmp_path / "long.jsonl"
    import json

    path.write_text(json.dumps({"text": long}) + "\n" + json.dumps({"text": PROSE[0]}) + "\n", encoding="utf-8")
    with Atlas(tmp_path / "a", model=str(tiny_model_dir), sketch_dim=256, device="cpu",
               max_sample_chars=200_000, max_matrix_tasks=1500) as atlas:
        task = atlas.add("long", path, progress=False)
        assert task.n_samples == 2
        atlas.add("prose", PROSE, progress=False)
        # a matrix bound above the 1,000-task page limit was passed as one page's limit: a 422
        assert len(atlas.matrix().ids) == 2


def test_a_space_named_with_slashes_is_read_and_exported_by_name(serve: Any, tiny_lm: Any) -> None:
    from service.client import AtlasClient

    svc = serve(lm=tiny_lm, sketch_dim=256)
    with AtlasClient(svc.url) as client:
        client.add_task("prose", samples=PROSE, wait=True)
        name = client.get_space("default").model_name
        assert "/" in name  # the tiny model's directory
        assert client.get_space(name).id == client.get_space("default").id
        lines = client.export_space(name).decode().splitlines()
        assert len(lines) == 3 and '"prose"' in lines[1]  # header, the task, the trailer


def test_a_library_matrix_of_no_named_tasks_takes_the_first_40_as_the_cli_does(tmp_path: Path,
                                                                              tiny_model_dir: Path) -> None:
    """With no tasks named, the library's matrix took every ready task up to the service's matrix bound (256) and
    the CLI's ``matrix`` (and the dashboard) the first 40: over 40 tasks the same question got two answers."""
    from atlas.vocabulary import MATRIX_DEFAULT_TASKS

    with Atlas(tmp_path / "a", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        for i in range(MATRIX_DEFAULT_TASKS + 2):
            atlas.add(f"t{i:02d}", [f"{PROSE[i % len(PROSE)]} number {i}", f"another line {i} of words"],
                      progress=False)
        ids = [t.id for t in atlas.tasks()]
        assert len(ids) == MATRIX_DEFAULT_TASKS + 2
        assert atlas.matrix().ids == sorted(ids)[:MATRIX_DEFAULT_TASKS]
