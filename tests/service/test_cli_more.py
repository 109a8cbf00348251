"""More of the ``fisher-atlas`` CLI over real HTTP, beside ``test_cli.py``: a server with keys required
(its admin key made by ``keys create --local``), scopes and revoked keys, the progress of ``--wait``,
the plot commands (real PNG/SVG content, unknown suffix and missing matplotlib → exit 2), and
``migrate`` hiding the database password."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.cli import main
from tests.service.test_cli import CODE, PROSE, _jsonl

CHEM = ["CC(=O)OC1=CC=CC=C1C(=O)O", "CCO", "C1=CC=CC=C1", "CC(C)CC1=CC=C(C=C1)C(C)C(=O)O"]


def _out(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, tiny_lm: Any) -> Iterator[dict[str, Any]]:
    """A server requiring keys, on a data dir whose first admin key the CLI created locally."""
    from atlas.settings import Settings
    from service.app import create_app
    from tests.service.conftest import LiveServer

    data = tmp_path_factory.mktemp("cli-keyed")
    buf = io.StringIO()
    sys_stdout, sys.stdout = sys.stdout, buf
    try:
        assert main(["keys", "create", "--local", "--name", "root", "--scopes", "admin", "--json",
                     "--data-dir", str(data)]) == 0
    finally:
        sys.stdout = sys_stdout
    admin = json.loads(buf.getvalue())["key"]
    server = LiveServer(create_app(Settings(data_dir=data, sketch_dim=256, device="cpu", require_keys=True),
                                   overrides={"lm": tiny_lm})).start()
    yield {"url": server.url, "admin": admin, "data": data}
    server.stop()


@pytest.fixture
def plots() -> Any:
    """:mod:`service.plots` (matplotlib is needed to draw)."""
    pytest.importorskip("matplotlib")
    from service import plots as module

    return module


def test_scopes_progress_and_errors_over_http(keyed: dict[str, Any], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FISHER_ATLAS_URL", keyed["url"])  # env twins: no --url / --api-key below unless said
    assert main(["tasks", "list"]) == 1  # no key: refused by the service
    assert "401 unauthorized" in capsys.readouterr().err
    monkeypatch.setenv("FISHER_ATLAS_API_KEY", keyed["admin"])
    assert main(["keys", "create", "--name", "reader", "--scopes", "read", "--json"]) == 0
    reader = _out(capsys)
    assert reader["key"].startswith("fa_") and reader["scopes"] == ["read"]

    # --wait shows honest progress on stderr: samples, tokens, samples/s, ETA, the final status
    assert main(["add", "prose", str(_jsonl(tmp_path / "p.jsonl", PROSE)), "--wait"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("prose ") and "4/4 samples" in err and "tokens" in err and "samples/s" in err
    assert "succeeded" in err

    # a read key reads but cannot write or manage keys: 403, nothing changed
    assert main(["tasks", "list", "--api-key", reader["key"], "--json"]) == 0
    assert _out(capsys)["total"] == 1
    assert main(["tasks", "delete", "prose", "--yes", "--api-key", reader["key"]]) == 1
    err = capsys.readouterr().err
    assert "403 forbidden" in err and "this key lacks the scope named above" in err
    assert "`fisher-atlas keys current`" in err  # a command this key may run (`keys list` takes admin)
    with monkeypatch.context() as no_terminal:  # asked with nothing to answer: said, not a silent exit 1
        no_terminal.setattr(sys, "stdin", io.StringIO(""))
        assert main(["tasks", "delete", "prose"]) == 1
    assert "aborted: no answer to the question (pass --yes to skip it)" in capsys.readouterr().err
    assert main(["keys", "list", "--api-key", reader["key"]]) == 1
    assert "403 forbidden" in capsys.readouterr().err
    assert main(["tasks", "show", "prose", "--json"]) == 0
    prose = _out(capsys)
    assert prose["name"] == "prose"
    # a revoked key is refused
    assert main(["keys", "revoke", str(reader["id"])]) == 0
    capsys.readouterr()
    assert main(["tasks", "list", "--api-key", reader["key"]]) == 1
    assert "401 unauthorized" in capsys.readouterr().err
    # usage errors: exit 2 and no traceback; an unreachable service: exit 3 naming the URL
    assert main(["route"]) == 2
    assert main(["add", "x", str(tmp_path / "p.jsonl"), "--metadata", "[1]"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["tasks", "list", "--url", "http://127.0.0.1:9"]) == 3
    assert "127.0.0.1:9" in capsys.readouterr().err
    # file errors other than "no such file": one line, exit 1 (they were tracebacks)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b'{"prompt": "\xff", "label": "none"}\n')
    for argv in (["add", "t", str(tmp_path)], ["import", str(tmp_path)], ["fit", str(binary)]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("fisher-atlas: ") and len(err.strip().splitlines()) == 1, (argv, err)

    # --json without --yes: the confirmation goes to stderr, stdout stays one JSON document
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert main(["tasks", "delete", "prose", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"deleted": prose["id"]} and "delete task" in out.err


def test_plot_commands(keyed: dict[str, Any], plots: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    monkeypatch.setenv("FISHER_ATLAS_URL", keyed["url"])
    monkeypatch.setenv("FISHER_ATLAS_API_KEY", keyed["admin"])
    for name, texts in (("fox", PROSE), ("loops", CODE), ("smiles", CHEM)):
        assert main(["add", name, str(_jsonl(tmp_path / f"{name}.jsonl", texts)), "--wait"]) == 0
    capsys.readouterr()

    def non_blank_png(path: Path) -> None:
        assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        with Image.open(path) as im:
            assert im.width >= 200 and im.height >= 150
            colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
            assert colours is not None and len(colours) > 10  # drawn content, not a blank canvas

    png, svg = tmp_path / "atlas.png", tmp_path / "atlas.svg"
    assert main(["atlas", "--out", str(png)]) == 0
    non_blank_png(png)
    assert main(["atlas", "--out", str(svg)]) == 0
    text = svg.read_text()
    assert "<svg" in text and all(n in text for n in ("fox", "loops", "smiles"))
    heat = tmp_path / "heatmap.png"
    assert main(["matrix", "fox", "loops", "smiles", "--out", str(heat)]) == 0
    assert f"wrote {heat}" in capsys.readouterr().out
    non_blank_png(heat)
    # --json prints the numbers and writes no figure (it wrote matrix.png / atlas.png into the working directory)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main(["matrix", "fox", "loops", "--json"]) == 0 and main(["atlas", "--json"]) == 0
    assert '"ids"' in capsys.readouterr().out and not list(cwd.iterdir())
    # one task is a 1 x 1 matrix, as the REST API and the client answer (the CLI refused it before 2026-12-07)
    assert main(["matrix", "fox", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["names"] == ["fox"] and one["fisher"] == [[pytest.approx(1.0, abs=1e-6)]]
    assert main(["matrix", "fox", "--out", str(tmp_path / "one.png")]) == 0
    non_blank_png(tmp_path / "one.png")
    bars = tmp_path / "factors.svg"
    assert main(["recommend", "fox", "--plot", str(bars), "-k", "2"]) == 0
    assert "<svg" in bars.read_text()

    # an unknown suffix is refused before any request, exit 2, one clear line
    # (a server that is not there: a request would fail with exit 1); .json is named where it is written
    nowhere = ["--url", "http://127.0.0.1:9"]
    for argv, numbers in ((["atlas", "--out", str(tmp_path / "a.gif")], True),
                          (["matrix", "--out", str(tmp_path / "m.bmp")], True),
                          (["recommend", "fox", "--plot", str(tmp_path / "r")], False)):
        assert main([*argv, *nowhere]) == 2, argv
        err = capsys.readouterr().err
        assert "use one of" in err and ".png" in err and "Traceback" not in err
        assert (".json" in err) == numbers, err
    assert not list(tmp_path.glob("a.gif"))
    # matplotlib not installed: exit 2 with the install hint, no traceback
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["atlas", "--out", str(png)]) == 2
    err = capsys.readouterr().err
    assert "pip install" in err and "Traceback" not in err


def test_migrate_hides_the_database_password(pg_database: Any, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    url = pg_database().replace("postgres@", "postgres:s3cret-pw@")
    assert main(["migrate", "--database-url", url, "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "latest schema revision" in out and "s3cret-pw" not in out and "***" in out


def test_server_commands_answer_database_problems_in_one_line(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``migrate`` and ``serve`` on a database they cannot use printed a traceback of 270–540 lines (the CLI's
    promise is one line on stderr); library mode raised alembic's bare CommandError for a newer schema."""
    import sqlite3

    from atlas.errors import DatabaseUnavailable
    from fisher_atlas import Atlas

    down = "postgresql+psycopg://postgres:s3cret-pw@127.0.0.1:9/x"  # nothing listens on port 9
    notdb = tmp_path / "not-a-db" / "atlas.sqlite"
    notdb.parent.mkdir()
    notdb.write_bytes(b"this is not an SQLite file" * 100)
    for args in (["migrate", "--database-url", down], ["serve", "--database-url", down, "--port", "9"],
                 ["migrate", "--database-url", "nonsense://x"], ["migrate", "--data-dir", str(notdb.parent)]):
        assert main([*args, *([] if "--data-dir" in args else ["--data-dir", str(tmp_path / "d")])]) == 1, args
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert err.startswith("fisher-atlas: database_unavailable: the database at ") and "\n" not in err, err
        assert "s3cret-pw" not in captured.err + captured.out and "Traceback" not in err, err
    newer = tmp_path / "newer"
    assert main(["migrate", "--data-dir", str(newer)]) == 0
    capsys.readouterr()
    with sqlite3.connect(newer / "atlas.sqlite") as conn:  # a schema written by a later version
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    assert main(["migrate", "--data-dir", str(newer)]) == 1
    err = capsys.readouterr().err
    assert "written by a newer version: upgrade FisherAtlas" in err and "\n" not in err.strip(), err
    with pytest.raises(DatabaseUnavailable, match="newer version"):
        Atlas(newer, device="cpu")
    assert main(["tasks", "list", "--timeout", "0"]) == 2  # a usage error (it read as an unreachable server)


@pytest.mark.parametrize(("env", "said"), [
    ({"FISHER_ATLAS_QUEUE": "redis"}, "FISHER_ATLAS_QUEUE: Input should be 'inprocess' or 'celery' (got 'redis')"),
    ({"FISHER_ATLAS_RATE_LIMIT_PER_S": "abc"}, "FISHER_ATLAS_RATE_LIMIT_PER_S: Input should be a valid number"),
    ({"FISHER_ATLAS_REQUIRE_KEYS": "maybe"}, "FISHER_ATLAS_REQUIRE_KEYS: Input should be a valid boolean"),
    ({"FISHER_ATLAS_ALLOWED_ORIGINS": "https://ui.example"}, "FISHER_ATLAS_ALLOWED_ORIGINS must be JSON"),
    ({"FISHER_ATLAS_JOB_STALE_AFTER_S": "0"}, "FISHER_ATLAS_JOB_STALE_AFTER_S: Input should be greater than 0"),
])
def test_a_bad_setting_is_one_line_naming_its_variable(env: dict[str, str], said: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A bad FISHER_ATLAS_* value printed pydantic's traceback (~150 lines) naming the field, not the variable;
    a list setting that is not JSON said only 'error parsing value for field "allowed_origins"'."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for command in (["serve", "--port", "9"], ["migrate"]):
        assert main([*command, "--data-dir", str(tmp_path / "d")]) == 2, command
        err = capsys.readouterr().err.strip()
        assert err.startswith("fisher-atlas: invalid settings: ") and said in err and "\n" not in err, err
        assert "Traceback" not in err and not (tmp_path / "d").exists()


def test_two_processes_migrating_one_postgresql_database_at_once(pg_database: Any, tmp_path: Path) -> None:
    """A service and a worker started together migrate the same fresh database: the second failed with a
    duplicate ``alembic_version`` table (a threading lock serialised only one process's migrations)."""
    import subprocess

    url = pg_database()
    exe = Path(sys.executable).parent / "fisher-atlas"
    procs = [subprocess.Popen([str(exe), "migrate", "--database-url", url, "--data-dir", str(tmp_path / f"d{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert all("latest schema revision" in out for out in outs), outs


def test_routing_shows_and_changes_a_tasks_threshold(keyed: dict[str, Any], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FISHER_ATLAS_URL", keyed["url"])
    monkeypatch.setenv("FISHER_ATLAS_API_KEY", keyed["admin"])
    pairs = [("quick", "lazy"), ("brown", "old"), ("red", "small"), ("grey", "big"), ("young", "tired"),
             ("wild", "sleepy"), ("sly", "happy")]
    texts = [f"The {a} fox jumps over the {b} dog." for a, b in pairs]
    assert main(["add", "foxes", str(_jsonl(tmp_path / "f.jsonl", texts)), "--wait"]) == 0
    capsys.readouterr()
    assert main(["routing", "foxes", "--json"]) == 0
    before = _out(capsys)
    assert before["source"] == "calibrated" and before["false_reject_rate"] == 0.05
    assert main(["routing", "foxes", "--false-reject-rate", "0.3", "--json"]) == 0
    looser = _out(capsys)
    assert looser["false_reject_rate"] == 0.3 and looser["threshold"] > before["threshold"]
    assert main(["routing", "foxes", "--threshold", "0.5", "--no-template", "--json"]) == 0
    over = _out(capsys)
    assert over["source"] == "override" and over["threshold"] == 0.5 and over["template_test"] is False
    assert main(["routing", "foxes"]) == 0  # what an override leaves to a short prompt's length is said
    said = capsys.readouterr().out
    assert "moved by as much as the override moves the threshold of whole prompts" in said
    assert main(["routing", "foxes", "--clear"]) == 0
    text = capsys.readouterr().out
    assert "(calibrated)" in text and "false-reject rate 0.3" in text and "template test off" in text
    assert "novelty test off (7 sample vectors: 20 needed at half the task's false-reject rate" in text  # at 30 %
    # the vectors needed follow the task's rate (the line said "39 at the default 5 %" whatever the rate)
    for rate, said in (("0.05", "7 sample vectors: 39 needed"), ("0.02", "7 sample vectors: 99 needed"),
                       ("0.01", "it needs 199 sample vectors; a task keeps at most 128")):
        assert main(["routing", "foxes", "--false-reject-rate", rate]) == 0
        assert said in capsys.readouterr().out, rate
    assert main(["routing", "foxes", "--false-reject-rate", "0.3"]) == 0
    capsys.readouterr()
    short = before["short_prompt_tokens"]  # 7 whole views and their prefixes (half, quarter, eighth)
    assert before["length_views"] > before["calibration_scores"] == 7 and short > 2
    longest = math.ceil(short) - 1  # the counted positions of the longest prompt short for the task
    assert (f"prompt length: a prompt of up to {longest} token positions ({longest + 1} tokens) is held to the "
            "threshold of its length") in text and "moved by as much as the override" not in text
    assert main(["routing", "foxes", "--no-novelty", "--json"]) == 0  # the per-task switch
    assert _out(capsys)["novelty_test"] is False
    assert main(["routing", "foxes"]) == 0
    assert "novelty test off (switched off" in capsys.readouterr().out
    assert main(["routing", "foxes", "--novelty", "--json"]) == 0
    assert _out(capsys)["novelty_test"] is True
    assert main(["routing", "foxes", "--threshold", "0.5", "--clear"]) == 2  # one or the other
    assert main(["routing", "foxes", "--false-reject-rate", "0.9"]) == 1  # the service's 422, said plainly
    assert "false_reject_rate" in capsys.readouterr().err
    # a task too small to calibrate: its length line described a calibrated threshold it has not got, and a rate
    # set for it had no effect without a word (a review, 2026-12-07)
    assert main(["add", "rhymes", str(_jsonl(tmp_path / "r.jsonl", texts[:3])), "--wait"]) == 0
    capsys.readouterr()
    assert main(["routing", "rhymes", "--false-reject-rate", "0.2"]) == 0
    text = capsys.readouterr().out
    assert "(default); calibrated - at false-reject rate 0.2 from 3 held-out scores (too few to calibrate: 5" in text
    assert "prompt length: not calibrated (every prompt is held to the threshold above)" in text
    assert "when that is lower than the calibrated one" not in text
    # a task no job of which succeeded (pending, or failed: every sample too short to sketch): said so, not
    # "re-add to store them" and a novelty test "off for want of vectors"
    main(["add", "broken", str(_jsonl(tmp_path / "b.jsonl", ["x", "y"])), "--wait"])
    capsys.readouterr()
    assert main(["routing", "broken"]) == 0
    text = capsys.readouterr().out
    assert "broken (id" in text and "has status failed: it is not routed to until a job of it succeeds" in text
    assert "re-add to store them" not in text and "novelty test" not in text


def test_prestart_gives_up_at_once_on_a_role_or_database_that_does_not_exist(pg_database: Any) -> None:
    """docker/prestart.sh waits for the database; it waited 60 × 2 s on a wrong role too, which never heals."""
    import os
    import subprocess
    import time

    base = pg_database()  # a reachable server (and a throw-away database on it)
    for url in (base.replace("postgres@", "fa_no_such_role@"), base.rsplit("/", 1)[0] + "/fa_no_such_db"):
        t0 = time.monotonic()
        script = Path(__file__).resolve().parents[2] / "docker" / "prestart.sh"
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "FISHER_ATLAS_DATABASE_URL": url,
                                               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
        assert out.returncode == 1 and "the database refuses this URL" in out.stderr, out.stderr[-2000:]
        assert "waiting for the database" not in out.stderr and time.monotonic() - t0 < 30


def test_cli_fit_prints_each_threshold_before_and_after(serve: Any, tiny_lm: Any, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``fit --dry-run`` lists each task whose threshold it moves, from the threshold its prompts were held to
    (the API's ``previous``) to the new one, and stores nothing; ``--json`` gives the API's answer."""
    import httpx

    from tests.service.test_dashboard_edges_browser import CODE as CODE12
    from tests.service.test_dashboard_edges_browser import PROSE as PROSE12
    from tests.service.test_dashboard_fit_browser import _examples

    svc = serve(lm=tiny_lm)
    url = ["--url", svc.url]
    for name, texts in (("prose", PROSE12), ("code", CODE12)):
        assert main(["add", name, str(_jsonl(tmp_path / f"{name}.jsonl", texts)), "--wait", *url]) == 0
    examples = tmp_path / "labelled.jsonl"
    examples.write_text("".join(json.dumps(e) + "\n" for e in _examples()), encoding="utf-8")
    capsys.readouterr()
    assert main(["fit", str(examples), "--dry-run", "--json", *url]) == 0
    res = _out(capsys)
    assert res["thresholds"] and set(res["previous"]) == set(res["thresholds"]) and res["stored"] is False
    assert main(["fit", str(examples), "--dry-run", *url]) == 0
    text = capsys.readouterr().out
    assert "(dry run: nothing stored)" in text
    for name, thr in res["thresholds"].items():
        assert f"  {name}: threshold {res['previous'][name]:.4f} -> {thr:.4f}" in text, text
    for suffix, delimiter in ((".csv", ","), (".tsv", "\t")):  # a spreadsheet's export: the same examples
        sheet = tmp_path / f"labelled{suffix}"
        with sheet.open("w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, delimiter=delimiter)
            writer.writerow(["id", "Prompt", "label "])  # other columns ignored, header names trimmed and folded
            writer.writerows([i, e["prompt"], e["label"]] for i, e in enumerate(_examples()))
        assert main(["fit", str(sheet), "--dry-run", "--json", *url]) == 0
        assert _out(capsys)["thresholds"] == res["thresholds"], suffix
    sheet = tmp_path / "bad.csv"  # a label no task has: named by its line, as in a JSONL file
    sheet.write_text("prompt,label\na b c,none\n\nd e f,nosuch\n", encoding="utf-8")
    assert main(["fit", str(sheet), "--dry-run", *url]) == 1
    assert capsys.readouterr().err.strip() == f"fisher-atlas: {sheet}:4: 404 not_found: no task named 'nosuch'"
    for body, line, said in (("text,label\na,none\n", 1, "must name the columns 'prompt' and 'label'"),
                             ("prompt,label\na b c,none\nd e f,\n", 3, "no label"),
                             ("prompt,label\na b c,none\n\n  ,prose\n", 4, "the prompt is empty"),  # not "example 1"
                             ('prompt,label\n"a b c,none\n', 2, "not CSV")):
        sheet.write_text(body, encoding="utf-8")
        assert main(["fit", str(sheet), "--dry-run", *url]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"fisher-atlas: {sheet}:{line}: ") and said in err, (body, err)
    bom = tmp_path / "bom.jsonl"  # a BOM (Windows editors write one) is no text: the same examples
    bom.write_bytes(b"\xef\xbb\xbf" + examples.read_bytes())
    assert main(["fit", str(bom), "--dry-run", "--json", *url]) == 0
    assert _out(capsys)["thresholds"] == res["thresholds"]
    bad = tmp_path / "bad.jsonl"  # a null prompt was routed as the text "None"; a boolean label read as id 1
    for line in ('{"prompt": null, "label": "none"}', '{"prompt": "x y z", "label": true}', "[1, 2]", "{"):
        bad.write_text('{"prompt": "a b c", "label": "none"}\n\n' + line + "\n", encoding="utf-8")
        assert main(["fit", str(bad), "--dry-run", *url]) == 1  # a data error, as add's (it was 2, a usage error)
        assert capsys.readouterr().err.startswith(f"fisher-atlas: {bad}:3: "), line
    # a label no task has, or a prompt the service refuses: named by its line (it was "404 no task named …")
    bad.write_text('{"prompt": "a b c", "label": "none"}\n\n{"prompt": "d e f", "label": "nosuch"}\n',
                   encoding="utf-8")
    assert main(["fit", str(bad), "--dry-run", *url]) == 1
    assert capsys.readouterr().err.strip() == f"fisher-atlas: {bad}:3: 404 not_found: no task named 'nosuch'"
    bad.write_text('{"prompt": "a b c", "label": "none"}\n{"prompt": "   ", "label": "prose"}\n', encoding="utf-8")
    assert main(["fit", str(bad), "--dry-run", *url]) == 1
    assert capsys.readouterr().err.startswith(f"fisher-atlas: {bad}:2: 422 invalid_input: ")
    bad.write_text("\n \n", encoding="utf-8")  # no labelled prompt: said so (it was the REST body's path)
    assert main(["fit", str(bad), "--dry-run", *url]) == 1
    assert "no labelled prompts" in capsys.readouterr().err
    listed = httpx.get(f"{svc.url}/v1/tasks", params={"limit": 10}).json()["items"]
    for task in listed:  # nothing stored: every task still on its calibrated threshold
        assert httpx.get(f"{svc.url}/v1/tasks/{task['id']}/routing").json()["source"] == "calibrated"


CELL = st.characters(blacklist_characters="\r", blacklist_categories=("Cs",))
"""A spreadsheet cell's characters: any text UTF-8 encodes, but a lone carriage return (a text file's newline)."""


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.text(CELL, min_size=1).filter(str.strip),
                               st.text(CELL, min_size=1).filter(lambda t: t == t.strip() and bool(t))), max_size=8),
       tsv=st.booleans())
def test_labels_from_a_spreadsheet_read_back_as_written(tmp_path_factory: pytest.TempPathFactory,
                                                        rows: list[tuple[str, str]], tsv: bool) -> None:
    """Any prompts and labels a CSV / TSV writer quotes (commas, quotes, line breaks, tabs) read back as written,
    each with the line its row ends on."""
    from service.cli.queries import labelled_prompts

    sheet = tmp_path_factory.mktemp("labels") / ("labels.tsv" if tsv else "labels.csv")
    with sheet.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t" if tsv else ",", lineterminator="\n")
        writer.writerow(["prompt", "label"])
        writer.writerows(rows)
    got, lines = labelled_prompts(sheet)
    assert got == rows
    assert lines == sorted(lines) and len(set(lines)) == len(lines) and all(n >= 2 for n in lines)
