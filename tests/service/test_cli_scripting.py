"""The CLI in scripts and pipelines (a review as a terminal user, 2026-12-07); each case failed before its fix.

* ``export`` replaced a FIFO, a symbolic link or ``/dev/stdout`` with a regular file (``rename`` over it), wrote a
  file named ``-``, and named its temporary file in errors.
* Another server at ``--url`` (a 200 that is not FisherAtlas JSON) was a traceback; an HTML error page was printed
  whole; a port past 65535 was a traceback.
* Every failure exited 1: a script could not tell "the service refused this" from "try again later" or "the job
  failed".
* ``--metadata`` kept the last of a repeated key (the service refuses it); ``tasks show`` printed metadata as a
  Python ``repr``; ``tasks delete``'s question wrote a space into stdout (a ``--json`` pipe).
* ``keys list --local`` with a mistyped ``--data-dir`` made an empty store there and said "no API keys".
* A task named ``3`` hid task 3 from every command taking a name or an id; a new name of digits alone is refused.
* ``route`` took one prompt a process (1.1 s each); ``--file`` routes a file's prompts 64 a request.
* Ctrl-C during ``--wait`` exited without saying that the job goes on.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from service.cli import main

PROSE = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs.",
         "The brown fox and the dog are friends.", "The fox jumps over the fence by the road."]
CODE = ["def add(a, b):\n    return a + b\n", "def sub(a, b):\n    return a - b\n",
        "for i in range(3):\n    print(i)\n", "while True:\n    break\n"]


def _env() -> dict[str, str]:
    """The environment of a ``fisher-atlas`` process of the tests: this checkout importable."""
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def _jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def _tasks(export: bytes) -> list[bytes]:
    """An export's task lines (its header holds the time it was written)."""
    lines = export.splitlines()
    assert lines[0].startswith(b'{"format"') and lines[-1].startswith(b'{"trailer"')
    return lines[1:-1]


@pytest.fixture
def other_server(fake_http: Any) -> Any:
    """A real HTTP server that is not FisherAtlas, one answer for every path: ``start(status, body, ctype) -> url``."""
    return lambda status, body, ctype: fake_http(default=(status, {"content-type": ctype}, body))


def test_exit_statuses_and_one_line_errors_from_servers_that_are_not_the_service(
        other_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    page = b"<!DOCTYPE HTML>\n<html>\n<head><title>Error</title></head>\n<body>\n<h1>Not Found</h1>\n</body>\n</html>\n"
    cases = [(other_server(200, b"<html><body>welcome</body></html>", "text/html"), 3, "not a FisherAtlas answer"),
             (other_server(200, b'{"ok": true}', "application/json"), 3, "not a FisherAtlas answer"),
             (other_server(404, page, "text/html"), 3, "404 http_error: Not Found (text/html"),
             (other_server(502, b"Bad Gateway", "text/plain"), 3, "502 http_error: Bad Gateway"),
             (other_server(413, b"<html>413 Request Entity Too Large</html>", "text/html"), 1, "413 http_error"),
             ("http://127.0.0.1:99999", 2, "port 99999 is not a port"),
             ("127.0.0.1:8000", 2, "give it as http://HOST:PORT"),
             ("http://127.0.0.1:9", 3, "127.0.0.1:9")]
    for url, status, says in cases:
        for argv in (["tasks", "list"], ["route", "a prompt"]):
            assert main([*argv, "--url", url, "--timeout", "10"]) == status, (url, argv)
            err = capsys.readouterr().err
            assert says in err and "Traceback" not in err and "<html" not in err.lower(), err
            assert len(err.strip().splitlines()) <= 2, err  # the message, and a hint for an unreachable service
    html = other_server(200, b"<html><body>welcome</body></html>", "text/html")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"not-an-export-{os.getpid()}.jsonl"
    assert main(["export", str(out), "--url", html]) == 3  # another server's page is not saved as an export
    assert "not a FisherAtlas answer" in capsys.readouterr().err and not out.exists()


def test_scripting_a_served_store(serve: Any, tiny_lm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    svc = serve(lm=tiny_lm)
    url = ["--url", svc.url]
    prose = _jsonl(tmp_path / "prose.jsonl", PROSE)
    assert main(["add", "dup", str(prose), "--metadata", '{"a": 1, "a": 2}', *url]) == 2
    assert "'a' is given more than once" in capsys.readouterr().err
    assert main(["add", "3", str(prose), *url]) == 1  # it would read as task id 3 (`tasks delete 3` found it)
    assert "digits alone reads as a task id" in capsys.readouterr().err
    assert main(["add", "prose", str(prose), "--metadata", '{"owner": "José", "tags": ["a", null, true]}',
                 "--wait", *url]) == 0
    assert main(["add", "code", str(_jsonl(tmp_path / "code.jsonl", CODE)), "--wait", *url]) == 0
    capsys.readouterr()
    assert main(["tasks", "show", "prose", *url]) == 0
    assert 'metadata {"owner": "José", "tags": ["a", null, true]}' in capsys.readouterr().out

    # route --file: a prompt a line (blank lines skipped, line numbers kept), JSON lines, stdin
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{p}\n" for p in [*PROSE, "", "The dog and the fox.", "def f(x): return x"]))
    lines_of = [i for i, line in enumerate(prompts.read_text().split("\n"), start=1) if line.strip()]
    assert main(["route", "--file", str(prompts), *url]) == 0
    out = capsys.readouterr()
    said = out.out.splitlines()
    assert [int(s.split(":")[1]) for s in said] == lines_of and all(": answer: " in s or ": none: " in s
                                                                   for s in said), said
    assert f"routed {len(lines_of)} prompts" in out.err
    assert main(["route", "--file", str(prompts), "--json", *url]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in rows] == lines_of and all("matches" in r and "none" in r for r in rows)
    labelled = tmp_path / "labels.jsonl"
    labelled.write_text("".join(json.dumps({"prompt": p, "label": "prose"}) + "\n" for p in PROSE * 20))
    assert main(["route", "-f", str(labelled), "--json", *url]) == 0  # 80 prompts: two requests
    assert [json.loads(line)["line"] for line in capsys.readouterr().out.splitlines()] == list(range(1, 81))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"The lazy dog\n")))
    assert main(["route", "-f", "-", *url]) == 0
    assert capsys.readouterr().out.startswith("-:1: ")
    first_six = b"".join(labelled.read_bytes().splitlines(keepends=True)[:6])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(first_six)))
    assert main(["route", "-f", "-", "--json", *url]) == 0  # JSON lines on stdin, told by the first line
    assert {json.loads(line)["line"] for line in capsys.readouterr().out.splitlines()} == {1, 2, 3, 4, 5, 6}
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"prompt": "The lazy dog"}\n{"prompt": "a", "prompt": "b"}\n')
    assert main(["route", "-f", str(twice), *url]) == 1
    assert f"{twice}:2: expected a JSON object with 'prompt'" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"  # an empty prompt is named by its line (the 422's loc), not by a message's words
    empty.write_text('{"prompt": "The lazy dog"}\n\n{"prompt": ""}\n')
    assert main(["route", "-f", str(empty), *url]) == 1
    assert f"{empty}:3: 422 invalid_input: the prompt is empty" in capsys.readouterr().err
    long = tmp_path / "long.txt"
    long.write_text("a short one\n" + "word " * 5000 + "\n")
    assert main(["route", "--file", str(long), *url]) == 1
    assert f"{long}:2: 413" in capsys.readouterr().err
    assert main(["route", "x", "--file", str(long), *url]) == 2
    assert main(["route", "", *url]) == 1
    assert "the prompt is empty" in capsys.readouterr().err

    # export: through a symbolic link (kept), into a FIFO, to stdout; errors name the path given
    real = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    assert main(["export", str(link), *url]) == 0
    assert link.is_symlink() and real.read_bytes().startswith(b'{"format"')
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["export", str(fifo), *url]) == 0
    reader.join(30)
    assert not reader.is_alive()
    assert fifo.is_fifo() and got and _tasks(got[0]) == _tasks(real.read_bytes())
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO()))
    assert main(["export", "-", *url]) == 0
    assert _tasks(sys.stdout.buffer.getvalue()) == _tasks(real.read_bytes())  # type: ignore[attr-defined]
    monkeypatch.undo()
    assert not (Path.cwd() / "-").exists()
    for target, says in ((tmp_path, "is a directory"), (tmp_path / "nodir" / "x.jsonl", "no such")):
        assert main(["export", str(target), *url]) == 1
        err = capsys.readouterr().err
        assert str(target.parent if "nodir" in str(target) else target) in err and ".partial" not in err, err
        assert says in err.lower(), err

    # /dev/stdout sent to a file by the shell is written in place (swapped for a new file, the lines around were lost)
    env = _env()
    shell = tmp_path / "shell.out"
    export = f'"{sys.executable}" -m service.cli export /dev/stdout --url {svc.url}'
    subprocess.run(["bash", "-c", f'{{ echo head; {export}; echo tail; }} > "{shell}"'], env=env, check=True,
                   timeout=120)
    lines = shell.read_bytes().splitlines()
    assert lines[0] == b"head" and lines[-1] == b"tail" and _tasks(b"\n".join(lines[1:-1])) == _tasks(real.read_bytes())

    # delete's question goes to stderr: stdout holds the JSON alone
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"y\n")))
    assert main(["tasks", "delete", "code", "--json", *url]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["deleted"] and "delete task" in out.err


def test_an_export_never_opens_stdin_for_writing(tmp_path: Path) -> None:
    """``/dev/stdin`` named as the export's file emptied the file redirected into stdin, before any request."""
    from service.client import AtlasClient, InvalidInput

    with AtlasClient("http://127.0.0.1:9") as cl:
        for name in ("/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"):
            with pytest.raises(InvalidInput, match="standard input, not an output"):
                cl.download_export(name)


def test_keys_list_local_does_not_make_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    typo = tmp_path / "typo-dir"
    assert main(["keys", "list", "--local", "--data-dir", str(typo)]) == 1
    assert main(["keys", "revoke", "--local", "1", "--data-dir", str(typo)]) == 1
    assert "no store at" in capsys.readouterr().err and not typo.exists()
    assert main(["keys", "create", "--local", "--name", "root", "--scopes", "admin", "--data-dir", str(typo)]) == 0
    assert main(["keys", "list", "--local", "--data-dir", str(typo)]) == 0
    assert "root" in capsys.readouterr().out


def _add_waiting(svc: Any, tmp_path: Path, name: str, *more: str) -> subprocess.Popen[bytes]:
    """``fisher-atlas add NAME … --wait [MORE]`` in a process of its own, once it follows its queued job's progress
    stream (the service runs no job: ``start_runner`` off)."""
    env = _env()
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "add", name, str(_jsonl(tmp_path / f"{name}.jsonl",
                             PROSE)), "--wait", "--url", svc.url, *more], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 60
    while svc.container.event_streams.open == 0:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc


def test_ctrl_c_during_wait_says_the_job_goes_on(serve: Any, tiny_lm: Any, tmp_path: Path) -> None:
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})  # no runner: the job waits in the queue
    import httpx

    proc = _add_waiting(svc, tmp_path, "waits")
    with httpx.Client(base_url=svc.url, timeout=10) as http:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        job = http.get("/v1/jobs").json()["items"][0]
    assert proc.returncode == 130, err
    assert f"job {job['id']} goes on in the service" in err.decode() and job["status"] == "queued", err
    # with --json, the ids a script may cancel are on stdout (it had nothing but a sentence on stderr)
    proc = _add_waiting(svc, tmp_path, "waits-json", "--json")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    said = json.loads(out)
    assert said["interrupted"] is True and said["task"]["name"] == "waits-json" and said["job"]["status"] == "queued"


def test_a_wait_in_a_log_says_how_far_and_ends_at_its_timeout(serve: Any, tiny_lm: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Where stderr is not a terminal (a CI log) the progress bar drew nothing until the job ended, and ``--wait``
    had no limit of its own (a scripting review, 2026-12-07)."""
    from service.cli import common

    svc = serve(lm=tiny_lm, overrides={"start_runner": False})  # no runner: the job stays queued
    monkeypatch.setattr(common, "PLAIN_PROGRESS_S", 0.5)
    t0 = time.monotonic()
    assert main(["add", "slow", str(_jsonl(tmp_path / "slow.jsonl", PROSE)), "--wait", "--wait-timeout", "2",
                 "--url", svc.url]) == 3
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    # plain lines, in a log, though the queued job sends no update (from a timer)
    assert err.count("slow: job 1 queued: 0/") >= 2, err
    assert "still runs after --wait-timeout 2 s" in err and "jobs wait 1" in err, err
    # with --json, what was created is on stdout (a script may cancel it); a job that is not there is a 404
    assert main(["add", "slower", str(_jsonl(tmp_path / "slower.jsonl", CODE)), "--wait", "--wait-timeout", "0.5",
                 "--json", "--url", svc.url]) == 3
    said = json.loads(capsys.readouterr().out)
    assert said["timed_out"] is True and said["task"]["name"] == "slower" and said["job"]["id"] == 2
    assert main(["jobs", "wait", "999", "--url", svc.url]) == 1
    assert "404 not_found" in capsys.readouterr().err


def test_a_task_deleted_during_add_wait_is_said_so(serve: Any, tiny_lm: Any, tmp_path: Path) -> None:
    """Another client deletes the task ``add --wait`` follows: the CLI said "404 not_found: job N does not exist"
    (a multi-replica review, 2026-12-07); it says the task was deleted and nothing was added, exit 4."""
    svc = serve(lm=tiny_lm, overrides={"start_runner": False})  # no runner: the job waits in the queue
    import httpx

    proc = _add_waiting(svc, tmp_path, "deleted")
    with httpx.Client(base_url=svc.url, timeout=10) as http:
        task = http.get("/v1/tasks").json()["items"][0]
        assert http.delete(f"/v1/tasks/{task['id']}").status_code == 204
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    said = err.decode()
    assert "the task was deleted while job" in said and "nothing was added" in said and "404" not in said, said


def _cli(args: list[str], stdin: bytes = b"", shell: str | None = None) -> subprocess.CompletedProcess[bytes]:
    """``fisher-atlas ARGS`` in a process of its own (or a shell pipeline of ``$FA`` commands), with ``stdin``."""
    env = _env()
    fa = f"{shlex.quote(sys.executable)} -m service.cli"
    cmd = ["bash", "-c", shell.replace("$FA", fa)] if shell is not None else [sys.executable, "-m", "service.cli",
                                                                             *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=180)


def test_pipelines_read_standard_input_and_keep_going(serve: Any, tiny_lm: Any, tmp_path: Path) -> None:
    """A review as a scripting user (2026-12-07), each failing before its fix: ``export - | import /dev/stdin`` was a
    300-line traceback ("Too much data for declared Content-Length": a pipe has no length) and ``import -``, ``add -``,
    ``append -`` and ``fit -`` said "no such file: -"; one short line of a ``route --file`` stopped the run (every
    later line unanswered); a ``.jsonl`` file that began with a byte-order mark was refused; JSON lines without a
    prompt on stdin were routed as their JSON text, exit 0; ``fit`` read a CSV row with an unquoted comma as a cut
    prompt, and a repeated JSON key as its last value."""
    import httpx

    svc = serve(lm=tiny_lm)
    url = ["--url", svc.url]
    jsonl = "".join(json.dumps({"text": t}) + "\n" for t in PROSE).encode()
    # add and append from stdin: JSON lines with --format, plain text without it
    r = _cli(["add", "prose", "-", "--format", "jsonl", "--wait", "--json", *url], stdin=jsonl)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["task"]["n_samples"] == len(PROSE)
    r = _cli(["add", "wrong", "-", *url], stdin=jsonl)  # would store each line's JSON syntax as a text
    assert r.returncode == 2 and b"pass --format jsonl" in r.stderr, r.stderr
    r = _cli(["add", "wrong", "-", *url], stdin=json.dumps([{"text": t} for t in PROSE], indent=2).encode())
    assert r.returncode == 2 and b"--format json" in r.stderr, r.stderr
    r = _cli(["add", "code", "-", "--wait", *url], stdin="\n".join(CODE).encode())
    assert r.returncode == 0, r.stderr
    r = _cli(["append", "prose", "-", "--format", "csv", "--wait", *url],
             stdin=b'text\n"The fox, the dog."\nA dog barks at night.\n')
    assert r.returncode == 0, r.stderr
    prose = httpx.get(f"{svc.url}/v1/tasks", params={"name": "prose"}).json()["items"][0]
    assert prose["n_samples"] == len(PROSE) + 2
    r = _cli(["add", "bad-format", "-", "--format", "xlsx", *url], stdin=jsonl)
    assert r.returncode == 2 and b"--format 'xlsx'" in r.stderr, r.stderr

    # route --file: a refused line is named and the others are answered; exit 1 at the end
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{p}\n" for p in [PROSE[0], "", "x", PROSE[1], "word " * 5000, PROSE[2]]))
    r = _cli(["route", "--file", str(prompts), "--json", *url])
    assert r.returncode == 1, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["line"] for row in rows if "matches" in row] == [1, 4, 6], rows
    assert sorted((row["line"], row["error"]["status"]) for row in rows if "error" in row) == [(3, 422), (5, 413)]
    assert b"refused" in r.stderr
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": PROSE[0]}).encode() + b"\n")
    assert _cli(["route", "-f", str(bom), *url]).returncode == 0
    r = _cli(["route", "-f", "-", *url], stdin=jsonl)  # {"text"} lines: not prompts
    assert r.returncode == 1 and b"-:1: expected a JSON object with 'prompt'" in r.stderr, r.stderr

    # fit from stdin; a CSV row with more fields than its header, a repeated key: refused, naming the line
    labels = "".join(json.dumps({"prompt": p, "label": "prose"}) + "\n" for p in PROSE).encode()
    r = _cli(["fit", "-", "--dry-run", "--json", *url], stdin=labels)
    assert r.returncode == 0 and "accuracy_after" in json.loads(r.stdout), r.stderr
    r = _cli(["fit", "-", "--format", "csv", "--dry-run", *url], stdin=b"prompt,label\nThe fox, the dog,prose\n")
    assert r.returncode == 1 and b"-:2: the row has more columns than the header" in r.stderr, r.stderr
    r = _cli(["fit", "-", "--dry-run", *url], stdin=b'{"prompt": "The fox", "label": "prose", "label": "none"}\n')
    assert r.returncode == 1 and b"-:1: key 'label' is given more than once" in r.stderr, r.stderr

    # export | import through pipes, into a second service: the same tasks
    other = serve(lm=tiny_lm)
    for target in ("/dev/stdin", "-"):
        r = _cli([], shell=f'$FA export - --url {svc.url} | $FA import {target} --on-conflict skip --json '
                           f'--url {other.url}')
        assert r.returncode == 0, r.stderr[-2000:]
        said = json.loads(r.stdout)
        assert said["imported"] + len(said["skipped"]) == 2, said
    names = {t["name"]: t["n_samples"] for t in httpx.get(f"{other.url}/v1/tasks").json()["items"]}
    assert names == {t["name"]: t["n_samples"] for t in httpx.get(f"{svc.url}/v1/tasks").json()["items"]}
    assert names["prose"] == len(PROSE) + 2


def test_waits_timeouts_pipes_and_files_as_scripts_need_them(serve: Any, tiny_lm: Any, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The rest of the scripting review (2026-12-07), each failing before its fix: a service that accepts and never
    answers got "is the service running there? Start it" (it is: raise --timeout); ``| head`` exited 1; ``export``
    made a file mode 0600 whatever the umask or the file's mode; a ``.gz`` export was neither written gzipped nor
    imported ("not a FisherAtlas space export header"); ``--metadata '{"a": NaN}'`` exited 1, not 2 (a usage error);
    ``jobs list`` had no ``--offset`` and an interrupted ``--wait`` no way back (``jobs wait``)."""
    import socket

    import httpx

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections wait in the backlog: connected, never answered
    try:
        assert main(["tasks", "list", "--url", f"http://127.0.0.1:{silent.getsockname()[1]}", "--timeout", "0.5"]) == 3
    finally:
        silent.close()
    err = capsys.readouterr().err
    assert "did not answer in time: raise --timeout" in err and "Start it with" not in err, err

    svc = serve(lm=tiny_lm)
    url = ["--url", svc.url]
    assert main(["add", "meta", str(_jsonl(tmp_path / "m.jsonl", PROSE)), "--metadata", '{"a": NaN}', *url]) == 2
    assert "NaN is not a JSON value" in capsys.readouterr().err
    # where the JSON breaks is said, as the service says it (the message ended "starting at")
    assert main(["add", "meta", str(_jsonl(tmp_path / "m.jsonl", PROSE)), "--metadata", '{"描述": "未闭合}', *url]) == 2
    assert "Unterminated string starting at (column 8)" in capsys.readouterr().err
    assert main(["add", "prose", str(_jsonl(tmp_path / "p.jsonl", PROSE)), "--wait", *url]) == 0
    capsys.readouterr()
    created = []
    for i in range(3):
        assert main(["add", f"t{i}", str(_jsonl(tmp_path / f"t{i}.jsonl", CODE)), "--json", *url]) == 0
        created.append(json.loads(capsys.readouterr().out))
    assert main(["jobs", "wait", str(created[-1]["job"]["id"]), "--json", *url]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "succeeded"
    assert main(["jobs", "list", "--limit", "2", "--offset", "2", "--json", *url]) == 0
    page = json.loads(capsys.readouterr().out)
    assert page["offset"] == 2 and len(page["items"]) == 2 and page["total"] == 4

    # export: the mode an open() would give (an existing file keeps its own); .gz gzipped, and imported as it is
    kept = tmp_path / "kept.jsonl"
    kept.write_text("old")
    kept.chmod(0o664)
    assert main(["export", str(kept), *url]) == 0
    assert kept.stat().st_mode & 0o777 == 0o664
    old_mask = os.umask(0o027)
    try:
        assert main(["export", str(tmp_path / "new.jsonl"), *url]) == 0
    finally:
        os.umask(old_mask)
    assert (tmp_path / "new.jsonl").stat().st_mode & 0o777 == 0o640
    packed = tmp_path / "space.jsonl.gz"
    capsys.readouterr()
    assert main(["export", str(packed), "--json", *url]) == 0
    assert json.loads(capsys.readouterr().out)["bytes"] == packed.stat().st_size  # the file's, not the export's
    assert packed.read_bytes()[:2] == b"\x1f\x8b" and _tasks(gzip.decompress(packed.read_bytes())) == _tasks(
        kept.read_bytes())
    other = serve(lm=tiny_lm)
    capsys.readouterr()
    assert main(["import", str(packed), "--json", "--url", other.url]) == 0
    assert json.loads(capsys.readouterr().out)["imported"] == 4
    from service.client import AtlasClient

    with AtlasClient(other.url) as cl:  # gzipped bytes, as a library caller hands them
        assert len(cl.import_space(packed.read_bytes(), on_conflict="skip").skipped) == 4
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[:-20])
    assert main(["import", str(cut), "--url", other.url]) == 1
    assert "gzipped but cannot be decompressed" in capsys.readouterr().err
    assert len(httpx.get(f"{other.url}/v1/tasks").json()["items"]) == 4

    # a reader that goes away: quietly, 141
    r = _cli([], shell=f"$FA tasks list --url {svc.url}; $FA export - --url {svc.url} | head -c 10 > /dev/null; "
                       "echo ${PIPESTATUS[0]}")
    assert r.stdout.splitlines()[-1] == b"141" and b"Traceback" not in r.stderr and b"Broken pipe" not in r.stderr, r
