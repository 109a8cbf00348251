"""``route``'s answers as text, and ``route --file``: every prompt of a file (or stdin) routed in batches, one answer a
line as each batch returns."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import typer

from service.cli.common import client, fail, terminal_safe

ROUTE_BATCH = 64
"""Prompts of a file sent in one request (the API's most a request)."""
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonlines")



EMPTY_SPACE = ("none: the space has no ready task to route to (add one first; tasks made with another model are in "
               "that model's space — `tasks list --json` gives each task's space_id: route there with --space)")
"""What a route answer without matches says: its space holds no ready task (a store opened with another model
serves an empty space of its own, and "add one first" alone misled)."""

def answer_line(res: Any) -> str:
    """``answer: NAME (confidence …; score … ≥ threshold …)`` for a route answer that names a task."""
    best = res.matches[0]
    conf = f"confidence {res.confidence:.2f}; " if res.confidence is not None else ""
    short = ", the threshold of a prompt of its length: shorter than the task's samples" if best.length_matched else ""
    return f"answer: {best.name} ({conf}score {best.score:.4f} >= threshold {res.threshold:.4f}{short})"


def none_reason(res: Any) -> str:
    """Why a route answer is ``none``: the server's sentence naming the deciding task (``rejected_by``), else the
    flags of an older server."""
    if res.rejected_by is not None:
        return str(res.rejected_by.message)
    return ("the prompt lacks the answered task's template" if res.template_rejects else
            "the task nearest to the prompt rejects it" if res.nearest_rejects else
            f"the answered task's score is below its threshold {res.threshold:g}")


def read_prompts(file: Path) -> Iterator[tuple[int, str]]:
    """``(line number, prompt)`` of a prompt file: one prompt a line (lines end at ``"\\n"`` only; a ``"\\r"`` before
    it is dropped), or JSON lines of objects with ``"prompt"`` (other fields ignored, so a ``fit`` labels file routes
    as it is); blank lines skipped. ``-`` reads stdin: JSON lines when its first non-blank line is an object with
    ``"prompt"``, else a prompt a line; a file is JSON lines by its suffix (:data:`JSONL_SUFFIXES`)."""
    stdin = str(file) == "-"
    stream: BinaryIO = sys.stdin.buffer if stdin else file.open("rb")
    jsonl: bool | None = None if stdin else file.suffix.lower() in JSONL_SUFFIXES
    try:
        for lineno, raw in enumerate(stream, start=1):
            try:
                line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
            except UnicodeDecodeError as exc:
                raise fail(f"{file}:{lineno}: not valid UTF-8 (byte {exc.start} of the line)") from None
            if lineno == 1:  # a byte-order mark is no text (a .jsonl file that began with one was refused)
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            if jsonl is None:  # stdin's first prompt line decides; an object without a prompt is a mistake, as in a
                jsonl = _is_object(line)  # .jsonl file (it routed each line's JSON text, exit 0)
            if not jsonl:
                yield lineno, line
                continue
            prompt = _prompt_of(line)
            if prompt is None:
                raise fail(f"{file}:{lineno}: expected a JSON object with 'prompt' (a string), given once")
            yield lineno, prompt
    finally:
        if not stdin:
            stream.close()


def _is_object(line: str) -> bool:
    """Whether ``line`` is a JSON object."""
    if not line.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def _prompt_of(line: str) -> str | None:
    """The ``"prompt"`` of a JSON-lines line, or ``None`` when it is not an object with one string ``"prompt"`` (a
    repeated one is refused, as the service refuses repeated keys: which prompt was meant cannot be told)."""
    from atlas.errors import InvalidInput
    from atlas.samples import unique_keys_object

    try:
        record = json.loads(line, object_pairs_hook=unique_keys_object)
    except (ValueError, InvalidInput, RecursionError):
        return None
    prompt = record.get("prompt") if isinstance(record, dict) else None
    return prompt if isinstance(prompt, str) else None


def refused_prompt(detail: Any) -> int | None:
    """The index of the prompt a refused batch names in its error's structured detail: ``{"prompt": i}`` (a domain
    error) or a request-validation error located at ``["body", "prompts", i]``; ``None`` when it names none."""
    if isinstance(detail, dict):
        at = detail.get("prompt")
        return at if isinstance(at, int) and not isinstance(at, bool) else None
    first = detail[0] if isinstance(detail, list) and detail and isinstance(detail[0], dict) else {}
    loc = first.get("loc")
    if isinstance(loc, list) and len(loc) == 3 and loc[:2] == ["body", "prompts"] and type(loc[2]) is int:
        return loc[2]
    return None


def route_file(file: Path, k: int, threshold: float | None, candidates: int | None, url: str | None,
               api_key: str | None, space: str | None, timeout: float, as_json: bool) -> None:
    """Route the prompts of ``file`` in batches of :data:`ROUTE_BATCH`, each answer printed as its batch is answered
    (``file:line: answer …`` / ``none: …``; ``as_json``: a JSON object a line, with its ``line``). A prompt the
    service refuses (too short, too long) is reported by its line — on stderr, or with ``as_json`` as a line
    ``{"line", "error": {"status", "code", "message"}}`` — and the rest of its batch is routed (one bad line of a
    large file lost every answer after its batch); a count on stderr at the end, and exit 1 when any was refused."""
    from service.client import AtlasClientError

    counts = {"answered": 0, "none": 0, "refused": 0}

    def answer(cl: Any, batch: list[tuple[int, str]]) -> None:
        while batch:
            try:
                res = cl.route([p for _, p in batch], k=k, threshold=threshold, candidates=candidates, space=space)
                break
            except AtlasClientError as exc:
                at = refused_prompt(exc.detail)
                if at is None or not 0 <= at < len(batch):
                    raise
                said = re.sub(r"^(invalid request: body\.prompts\.\d+: |prompt \d+: )", "", exc.message)
                message = re.sub(r"\bprompt \d+ ", "the prompt ", said)
                counts["refused"] += 1
                lineno = batch[at][0]
                if as_json:
                    print(json.dumps({"line": lineno, "error": {"status": exc.status, "code": exc.code,
                                                                "message": message}}), flush=True)
                else:
                    print(terminal_safe(f"fisher-atlas: {file}:{lineno}: {exc.status} {exc.code}: {message}"),
                          file=sys.stderr, flush=True)
                batch = batch[:at] + batch[at + 1:]
        else:
            return
        for (lineno, _), r in zip(batch, res.results, strict=True):
            counts["none" if r.none else "answered"] += 1
            if as_json:
                print(json.dumps({"line": lineno, **r.model_dump(mode="json")}), flush=True)
                continue
            said = (answer_line(r) if r.matches and not r.none else f"none: {none_reason(r)}" if r.matches
                    else EMPTY_SPACE)
            print(terminal_safe(f"{file}:{lineno}: {said}" + (" (truncated)" if r.truncated else "")), flush=True)

    with client(url, api_key, timeout) as cl:
        batch: list[tuple[int, str]] = []
        for item in read_prompts(file):
            batch.append(item)
            if len(batch) == ROUTE_BATCH:
                answer(cl, batch)
                batch = []
        if batch:
            answer(cl, batch)
    routed = counts["answered"] + counts["none"]
    refused = f"; {counts['refused']} refused (named above)" if counts["refused"] else ""
    print(f"fisher-atlas: routed {routed} prompts: {counts['answered']} answered, {counts['none']} none{refused}",
          file=sys.stderr)
    if counts["refused"]:
        raise typer.Exit(1)
