"""Options, output and progress shared by the ``fisher-atlas`` commands."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from atlas.samples import is_control_char
from service.schemas import JobOut

Url = Annotated[str | None, typer.Option("--url", envvar="FISHER_ATLAS_URL",
                                         help="Service URL (default http://127.0.0.1:8000).")]
ApiKey = Annotated[str | None, typer.Option("--api-key", envvar="FISHER_ATLAS_API_KEY", help="API key.")]
Space = Annotated[str | None, typer.Option("--space", envvar="FISHER_ATLAS_SPACE",
                                           help="Space id or model name (default: the service's).")]
ListSpace = Annotated[str | None, typer.Option("--space", envvar="FISHER_ATLAS_SPACE",
                                               help="Only this space, by id or model name (default: every space).")]
Timeout = Annotated[float, typer.Option("--timeout", envvar="FISHER_ATLAS_TIMEOUT", min=0.1,
                                         help="Timeout of one request, s (a read that times out or meets a busy "
                                              "service is tried up to 3 times, waiting as it says, at most 30 s).")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DataDir = Annotated[str | None, typer.Option(
    "--data-dir", envvar="FISHER_ATLAS_DATA_DIR",
    help="SQLite and FAISS files (uploads are stored in the database; large ones spool to TMPDIR while read).")]
DatabaseUrl = Annotated[str | None, typer.Option("--database-url", envvar="FISHER_ATLAS_DATABASE_URL",
                                                 help="SQLAlchemy URL, e.g. postgresql+psycopg://...")]
Model = Annotated[str | None, typer.Option("--model", envvar="FISHER_ATLAS_MODEL",
                                           help="'bundled', a hub name or a local directory.")]


FileFormat = Annotated[str | None, typer.Option(
    "--format", help="The file's format when its name does not say it, as a suffix: jsonl, json, csv, tsv, parquet "
                     "or txt, optionally gzipped (jsonl.gz); needed to read JSON lines or CSV from stdin (-).")]


def format_option(fmt: str | None, known: list[str], *, gz: bool = False) -> str | None:
    """A ``--format`` value as a suffix without its dot (``".JSONL"`` is ``jsonl``), one of ``known`` (each optionally
    ``.gz`` with ``gz``); a usage error (exit 2) otherwise."""
    if fmt is None:
        return None
    name = fmt.strip().lower().lstrip(".")
    if (name.removesuffix(".gz") if gz else name) not in known:
        raise fail(f"--format {fmt!r}: one of {', '.join(known)}" + (" (each optionally .gz)" if gz else ""), 2)
    return name


def sample_file(file: Path, fmt: str | None) -> tuple[Path | bytes, str | None]:
    """What ``add``/``append`` upload and under which name: ``file``, or standard input's bytes for ``-``; named
    ``<name>.<fmt>`` with ``--format`` (the service reads a file by its suffix). Standard input without ``--format``
    is plain text, one sample a line, and refused (exit 2) when its first line is JSON, as the service refuses such a
    file without a suffix (:func:`atlas.file_formats.check_plain_text`)."""
    from atlas.file_formats import FILE_FORMATS

    fmt = format_option(fmt, [k[1:] for k in FILE_FORMATS if k], gz=True)
    if str(file) != "-":
        return file, None if fmt is None else f"{file.name}.{fmt}"
    data = sys.stdin.buffer.read()
    if fmt is None:
        from atlas.errors import InvalidInput
        from atlas.file_formats import check_plain_text

        first = next((line for line in data[:1 << 16].splitlines() if line.strip()), b"")
        try:
            check_plain_text("stdin", first.decode("utf-8-sig", errors="replace"))
        except InvalidInput:
            raise fail("standard input starts with JSON: pass --format jsonl (one object a line) or --format json (a "
                       "document), or --format txt to take each line as a text", 2) from None
    return data, f"stdin.{fmt or 'txt'}"


def client(url: str | None, api_key: str | None, timeout: float = 120.0) -> Any:
    """A blocking client of the service."""
    from service.client import AtlasClient

    return AtlasClient(url, api_key=api_key, timeout=timeout)


def write_key() -> str:
    """A fresh ``Idempotency-Key`` for one command's write: the client may then resend it on a failed connection,
    429 or 503 (the service answers a repeat with the first one's task and job), and a command never adds twice."""
    return f"cli-{uuid.uuid4().hex}"


def emit(as_json: bool, payload: Any, text: str) -> None:
    """Print ``payload`` as JSON (``--json``) or ``text``."""
    if as_json:
        data = payload.model_dump(mode="json") if hasattr(payload, "model_dump") else payload
        print(json.dumps(data, indent=2))
    else:
        print(terminal_safe(text))


def terminal_safe(text: str) -> str:
    """``text`` with every control character but newline and tab, and every bidirectional override, written as a
    ``\\uXXXX`` escape: names and metadata stored before control characters were refused, or served by another
    server, cannot move the cursor, clear the screen or retitle the terminal."""
    return "".join(f"\\u{ord(c):04x}" if c not in "\n\t" and is_control_char(c) else c for c in text)


EXIT_REFUSED = 1
"""The service refused the request (a 4xx: bad input, not found, a conflict, a key), or a local file is wrong."""
EXIT_USAGE = 2
"""A command line the CLI cannot run (options, their values)."""
EXIT_UNAVAILABLE = 3
"""The service could not answer: unreachable, busy (429, 503), failing (5xx), or not a FisherAtlas service; the same
command may work later."""
EXIT_JOB_FAILED = 4
"""A job followed with ``--wait`` ended failed or cancelled."""


def exit_status(exc: Any) -> int:
    """The exit status of a client error (:class:`service.client.AtlasClientError`): :data:`EXIT_USAGE` for a URL
    that is none, :data:`EXIT_UNAVAILABLE` for what may pass by itself or is not the service answering, else
    :data:`EXIT_REFUSED`."""
    from service.client import RateLimited, Unavailable, Unreachable

    if exc.code == "invalid_url":
        return EXIT_USAGE
    retry_later = isinstance(exc, Unreachable | Unavailable | RateLimited) or exc.status >= 500
    # an answer without the service's body: another server at the URL (exit 3), unless a proxy's refusal of the
    # request itself (a key, its size)
    proxy_refusal = exc.code == "http_error" and exc.status in (401, 403, 413)
    not_the_service = exc.code == "unexpected_answer" or (exc.code == "http_error" and not proxy_refusal)
    return EXIT_UNAVAILABLE if retry_later or not_the_service else EXIT_REFUSED


def confirm(question: str) -> bool:
    """Ask ``question`` on stderr and read the answer from stdin (click's prompt wrote a space to stdout, into a
    ``--json`` pipe); ``typer.Abort`` when stdin has no answer."""
    print(terminal_safe(question) + " [y/N]: ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not answer:
        print(file=sys.stderr)
        raise typer.Abort()
    return answer.strip().lower() in ("y", "yes")


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one line on stderr and return the exit to raise."""
    print(terminal_safe(f"fisher-atlas: {message}"), file=sys.stderr)
    return typer.Exit(code)


def json_object(text: str | None, flag: str) -> dict[str, Any] | None:
    """Parse a ``--flag '{...}'`` JSON object."""
    if not text:
        return None
    from atlas.errors import InvalidInput
    from atlas.samples import unique_keys_object

    def no_constant(name: str) -> None:  # NaN and Infinity are not JSON (the service refused them: exit 1, not 2)
        raise json.JSONDecodeError(f"{name} is not a JSON value", text, text.find(name))

    try:  # as the service: a repeated key is refused
        value = json.loads(text, object_pairs_hook=unique_keys_object, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if "\n" in text else f"column {exc.colno}"
        raise fail(f"{flag} is not valid JSON: {exc.msg} ({at})", 2) from None
    except InvalidInput as exc:
        raise fail(f"{flag}: {exc.message}", 2) from None
    if not isinstance(value, dict):
        raise fail(f"{flag} must be a JSON object", 2)
    from atlas.samples import check_metadata

    try:  # here, as the service would (its refusal named "form field 'metadata'", a field the user never typed)
        return check_metadata(value, where=flag)
    except InvalidInput as exc:
        raise fail(f"422 invalid_input: {exc.message}") from None


def sample_notes(job: JobOut) -> str:
    """``"; 2 of 40 samples skipped (too_short: 2); 1 cut to 512 tokens"`` for a succeeded job that left samples
    out or cut them, else ``""``."""
    return "".join(f"; {n}" for n in (job.result.notes if job.result is not None else []))


def progress_console() -> Any:
    """A rich console on stderr for progress: live on a terminal (rich detects it), else one final line wide enough
    that no column is cut (rich lays a non-terminal out at 80 columns, which cut ``400/400`` to ``40…``)."""
    from rich.console import Console

    console = Console(stderr=True)
    return console if console.is_terminal else Console(stderr=True, width=max(console.width, 200))


PLAIN_PROGRESS_S = 30.0
"""Seconds between the plain progress lines of a job followed where stderr is not a terminal (a CI log): rich draws
nothing there until the end, and a silent log of minutes is killed by some CI systems."""

WaitTimeout = Annotated[float | None, typer.Option(
    "--wait-timeout", min=0.0, help="Stop following the job after this many seconds (exit 3; the job goes on).")]


def follow(cl: Any, job_id: int, label: str, *, quiet: bool = False, timeout: float | None = None,
           interrupted: Any = None) -> JobOut:
    """Follow a job to its end with a progress bar on stderr: samples, tokens streamed through the model,
    tokens/s and the ETA (rich; where stderr is not a terminal, a plain line every :data:`PLAIN_PROGRESS_S`, from a
    timer: a job quiet in its queue sends no update). ``label`` names what is followed ("prose", "job 7"). Past
    ``timeout`` seconds: exit 3, the job going on. Interrupted (Ctrl-C) or timed out with ``quiet`` (``--json``):
    ``interrupted`` (a JSON-able value: what was created) printed on stdout with ``"interrupted": true`` or
    ``"timed_out": true`` (a script reads the ids it may cancel, not a sentence)."""
    import threading

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from service.client.errors import NotFound

    console = progress_console()
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
               TextColumn("samples · {task.fields[tokens]:,} tokens · {task.fields[rate]}"))
    last: list[str] = []
    stop = threading.Event()

    def plain_lines() -> None:
        while not stop.wait(PLAIN_PROGRESS_S):
            if last:
                print(last[-1], file=sys.stderr, flush=True)

    with Progress(*columns, console=console, disable=quiet, transient=False) as bar:
        tid = bar.add_task(label, total=None, tokens=0, rate="- tok/s")
        t0 = time.monotonic()

        def update(job: JobOut) -> None:
            p = job.progress  # tokens streamed through the model (prompts included), as the job reports
            eta = f" · ETA {p.eta_s:,.0f} s" if p.eta_s is not None and not job.done else ""
            routing = f" · routing prompts {p.routing_done:,}/{p.routing_total:,}" if p.phase == "routing" else ""
            rate = f"{p.tokens_streamed_per_s:,.0f} tok/s · {p.samples_per_s:,.1f} samples/s{routing}{eta}"
            bar.update(tid, completed=p.samples_done, total=p.samples_total or None, tokens=p.tokens_streamed,
                       rate=rate)
            last.append(terminal_safe(f"{_job_label(label, job.id)} {job.status}: {p.samples_done:,}/"
                                      f"{p.samples_total or '?'} samples · {p.tokens_streamed:,} tokens · {rate}"))
            del last[:-1]

        if not quiet and not console.is_terminal:
            threading.Thread(target=plain_lines, name="plain-progress", daemon=True).start()
        try:
            job = cl.wait_job(job_id, on_progress=update, timeout=timeout)
        except NotFound:  # the task was deleted while its job ran: the job went with it ("404: job N does not exist")
            bar.stop()
            raise fail(f"{label}: the task was deleted while job {job_id} ran (the job went with it): nothing was "
                       "added", EXIT_JOB_FAILED) from None
        except TimeoutError:
            bar.stop()
            if quiet and interrupted is not None:
                print(json.dumps({**interrupted, "timed_out": True}, indent=2), flush=True)
            raise fail(f"{_job_label(label, job_id)} still runs after --wait-timeout {timeout:g} s: it goes on in "
                       f"the service (`fisher-atlas jobs wait {job_id}` follows it again)", EXIT_UNAVAILABLE) from None
        except KeyboardInterrupt:
            bar.stop()
            print(f"\nfisher-atlas: interrupted: job {job_id} goes on in the service (`fisher-atlas jobs wait "
                  f"{job_id}` follows it again, `fisher-atlas jobs cancel {job_id}` stops it)", file=sys.stderr)
            if quiet and interrupted is not None:
                print(json.dumps({**interrupted, "interrupted": True}, indent=2), flush=True)
            raise
        finally:
            stop.set()
        update(job)
    if not quiet:
        # the job's own run time (the wait's, for a job that ended before it began, said "in 0.0 s": a parity review)
        took = ((job.finished_at - job.started_at).total_seconds() if job.finished_at and job.started_at
                else time.monotonic() - t0)
        console.print(f"{_job_label(label, job.id)} {job.status} in {took:.1f} s"
                      + (f": {job.error}" if job.error else ""))
    return job


def _job_label(label: str, job_id: int) -> str:
    """``"prose: job 7"``, or ``"job 7"`` where the label is the job itself (it said "job 7: job 7 failed")."""
    return f"job {job_id}" if label == f"job {job_id}" else f"{label}: job {job_id}"
