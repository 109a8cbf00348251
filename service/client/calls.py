"""Request descriptions and response parsing shared by the async and sync clients."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar, cast

import httpx
from pydantic import BaseModel, ValidationError

from atlas.route_fit import prompt_batch
from service.client.errors import AtlasClientError, InvalidInput, error_for
from service.schemas import JobAccepted, JobOut, TaskCreated
from service.schemas_routing import RouteResponse

DEFAULT_URL = "http://127.0.0.1:8000"
T = TypeVar("T", bound=BaseModel)
ProgressCallback = Callable[[JobOut], None]
FileArg = str | os.PathLike[str] | bytes | BinaryIO | None
FilePart = tuple[str, bytes | BinaryIO, str]
"""A multipart file part: its name, its content (bytes, or a binary file streamed by httpx) and content type."""
IDEMPOTENT_POSTS = ("/v1/route", "/v1/align/matrix")
"""POST endpoints that only read: retried like GETs."""


@dataclass
class Call(Generic[T]):
    """One HTTP request and the model its JSON answer parses into (``None``: raw bytes)."""

    method: str
    path: str
    model: type[T] | None
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    data: dict[str, str] | None = None
    files: dict[str, FilePart] | None = None
    as_json: bool = False
    """Without a model: return the decoded JSON instead of the raw bytes."""
    headers: dict[str, str] | None = None
    opened: list[BinaryIO] = field(default_factory=list)
    """Files this call opened (a path's upload, streamed; httpx reads a file part from its start at each sending,
    a retry's too): closed by :meth:`close`."""

    def close(self) -> None:
        """Close the files this call opened (a caller's own file stays open)."""
        for f in self.opened:
            f.close()
        self.opened.clear()

    @property
    def idempotent(self) -> bool:
        """Safe to retry: a read, or a write carrying an ``Idempotency-Key`` (the service answers a repeat with the
        first request's task and job, and stores its samples once)."""
        return (self.method in ("GET", "HEAD") or (self.method == "POST" and self.path in IDEMPOTENT_POSTS)
                or "Idempotency-Key" in (self.headers or {}))

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``httpx.AsyncClient.request``."""
        out: dict[str, Any] = {"params": {k: v for k, v in self.params.items() if v is not None}}
        for key in ("json", "data", "files", "headers"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def real_number(value: object, what: str) -> float:
    """``value`` as a float when it is a real number (not a bool or a string: ``True`` was sent as a threshold of 1.0,
    refusing every prompt), else :class:`InvalidInput` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInput(0, "invalid_input", f"{what} is a number, not {type(value).__name__}")
    return float(value)


DEFAULT_TIMEOUT_S = 60.0
"""Seconds a network operation of the client may take when neither ``timeout`` nor ``$FISHER_ATLAS_TIMEOUT`` says."""


def resolve_timeout(timeout: float | None) -> float:
    """``timeout``, else ``$FISHER_ATLAS_TIMEOUT`` (the CLI's variable: a shell that sets it for the CLI sets it for a
    script's client too), else :data:`DEFAULT_TIMEOUT_S`; refused (``invalid_input``) unless a positive number."""
    source = "timeout" if timeout is not None else "FISHER_ATLAS_TIMEOUT"
    raw: object = timeout if timeout is not None else os.environ.get("FISHER_ATLAS_TIMEOUT", DEFAULT_TIMEOUT_S)
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidInput(0, "invalid_input", f"{source} must be a positive number of seconds, not {raw!r}")
    return value


def check_url(url: str) -> None:
    """Refuse (:class:`InvalidInput`, code ``invalid_url``) a service URL that is not ``http://`` or ``https://`` with
    a host, or that names no possible port (a port past 65535 reached the socket's ``connect`` and raised
    ``OverflowError``, a traceback)."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise InvalidInput(0, "invalid_url", f"{url}: not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidInput(0, "invalid_url", f"{url}: not a service URL: give it as http://HOST:PORT (or https://)")
    if port is not None and not 0 < port < 65536:
        raise InvalidInput(0, "invalid_url", f"{url}: port {port} is not a port (1 to 65535)")


def _not_ours(resp: httpx.Response) -> str:
    """What an answer that is not the service's JSON was, in one line: its content type and size, and the start of
    a plain-text body (a proxy's "Bad Gateway"), never a whole HTML page."""
    ctype = resp.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    text = " ".join(resp.text.split())
    snippet = f": {text[:120]}{'…' if len(text) > 120 else ''}" if text and ctype == "text/plain" else ""
    return f"{resp.reason_phrase or 'answer'} ({ctype}, {len(resp.content):,} bytes){snippet}"


NOT_THE_SERVICE = "not the service's answer: another server at this URL, or a proxy in front of the service"


def raise_for(resp: httpx.Response) -> None:
    """Raise the typed error of an error answer (an answer without the service's JSON error body: code
    ``http_error``, said in one line)."""
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        code, message, detail = body.get("code", "http_error"), body.get("message", resp.text), body.get("detail")
    except (ValueError, AttributeError):
        code, message, detail = "http_error", f"{_not_ours(resp)} from {resp.url} ({NOT_THE_SERVICE})", None
    retry = resp.headers.get("Retry-After")
    retry_after = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
    raise error_for(resp.status_code, str(code), str(message), detail, retry_after)


def parse(call: Call[T], resp: httpx.Response) -> Any:
    """The answer as ``call.model`` (raw bytes when it has none); an answer that is not the one this call expects
    (another server at the URL) is :class:`AtlasClientError` ``unexpected_answer``, not a decoder's traceback."""
    raise_for(resp)
    return decode(call, resp)


def decode(call: Call[T], resp: httpx.Response) -> Any:
    """:func:`parse` of an answer whose status was already judged."""
    if call.model is None and not call.as_json:
        if call.method == "DELETE" and resp.status_code != 204:  # the service's delete answers 204, no content
            raise unexpected(resp, f"{_not_ours(resp)}, {NOT_THE_SERVICE}")
        return resp.content
    try:
        if call.model is None:
            return resp.json() if resp.content else None
        return call.model.model_validate(resp.json())
    except ValidationError as exc:  # JSON of another shape: another server, or another version of this one
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "the answer"
        raise unexpected(resp, f"{where}: {first.get('msg', '')} (another server, or another version of the "
                               "service)") from None
    except ValueError:  # not JSON
        raise unexpected(resp, f"{_not_ours(resp)}, {NOT_THE_SERVICE}") from None


def unexpected(resp: httpx.Response, why: str) -> AtlasClientError:
    """The error of a successful answer this client cannot read (code ``unexpected_answer``)."""
    return AtlasClientError(resp.status_code, "unexpected_answer",
                            f"{resp.request.method} {resp.url}: not a FisherAtlas answer: {why}")


EXPORT_START = b'{"format"'
"""How every export begins (its header line): what the client checks before writing one."""


class ExportCheck:
    """An export checked as it streams (:meth:`feed` each chunk, then :meth:`finish`): it begins as an export's header
    and ends in a trailer whose task count and SHA-256 match the lines before it. An empty answer, another server's
    page after a ``{``, and a body cut off by a dropped connection were each written out as an export. Raises
    ``ValueError`` saying what is wrong; holds one line at a time."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.start = b""
        self.pending = b""  # the unfinished line
        self.held = b""  # the last whole line, not hashed yet: the trailer, if nothing follows it
        self.lines = 0  # whole lines hashed

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the answer (before they are written anywhere)."""
        if len(self.start) < len(EXPORT_START):
            self.start += chunk[:len(EXPORT_START) - len(self.start)]
            if not EXPORT_START.startswith(self.start):
                raise ValueError("its first bytes are not an export's header")
        data = self.pending + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self.pending = data
            return
        whole, self.pending = data[:cut + 1], data[cut + 1:]
        last = whole.rfind(b"\n", 0, len(whole) - 1) + 1
        self.digest.update(self.held)
        self.digest.update(whole[:last])
        self.lines += (1 if self.held else 0) + whole.count(b"\n", 0, last)
        self.held = whole[last:]

    def finish(self) -> None:
        """Check the end: a trailer counting the task lines, with their SHA-256 (``ValueError`` otherwise)."""
        if len(self.start) < len(EXPORT_START):
            raise ValueError("it is not an export (too short)")
        try:
            trailer = json.loads(self.held + self.pending)
        except ValueError:
            trailer = None
        if not isinstance(trailer, dict) or trailer.get("trailer") is not True:
            raise ValueError("it ends without an export's trailer (cut off?)")
        if trailer.get("n_tasks") != self.lines - 1 or trailer.get("sha256") != self.digest.hexdigest():
            raise ValueError("its trailer does not match its lines (cut off or altered)")


SampleArg = str | Mapping[str, str]
"""One sample of ``add_task``/``append``: a text, or a ``{"text"}`` / ``{"prompt", "completion"}`` mapping."""


def upload(file: FileArg, samples: Iterable[SampleArg] | None, filename: str | None
           ) -> tuple[dict[str, FilePart] | None, list[dict[str, str]] | None, list[BinaryIO]]:
    """Multipart file part or JSON records of an upload (exactly one of ``file`` / ``samples``); a text sample
    becomes ``{"text": ...}`` as in the library (a list of texts raised "dictionary update sequence element #0
    has length 1"); samples may come from any iterable (a generator was refused). A path is opened and streamed
    (its bytes were read whole into memory: ~200 MB of client for a 50 MB file), as is a binary file given open
    (a raw ``TypeError`` before), whole from its start. The third value: the file this opened (a path's), which the
    call closes (:meth:`Call.close`); a caller's open file stays open."""
    if (file is None) == (samples is None):
        raise ValueError("give exactly one of 'file' or 'samples'")
    if samples is not None:
        if isinstance(samples, str | bytes | Mapping) or not isinstance(samples, Iterable):
            raise TypeError(f"samples are an iterable of texts or dicts, not {type(samples).__name__}")
        return None, [_record(s, i) for i, s in enumerate(samples)], []
    if isinstance(file, bytes):
        return {"file": (filename or "upload.jsonl", file, "application/octet-stream")}, None, []
    assert file is not None
    if hasattr(file, "read"):
        name = filename or Path(str(getattr(file, "name", "upload.jsonl"))).name
        stream = cast(BinaryIO, file)
        if not _regular(stream):  # a pipe or stdin: httpx would declare its fstat size, 0 (read whole, as before)
            return {"file": (name, stream.read(), "application/octet-stream")}, None, []
        return {"file": (name, stream, "application/octet-stream")}, None, []
    path = Path(os.fspath(cast("str | os.PathLike[str]", file)))
    if not path.is_file():  # a named pipe, /dev/stdin, a process substitution: read whole, as before
        return {"file": (filename or path.name, path.read_bytes(), "application/octet-stream")}, None, []
    opened = path.open("rb")
    return {"file": (filename or path.name, opened, "application/octet-stream")}, None, [opened]


def _regular(stream: BinaryIO) -> bool:
    """Whether an open file can be streamed by httpx: seekable, and a regular file when it has a descriptor (httpx
    sends ``fstat``'s size as the part's length)."""
    import stat

    if not getattr(stream, "seekable", lambda: False)():
        return False
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # no descriptor (BytesIO): its length is read by seeking
        return True


def _record(sample: SampleArg, i: int) -> dict[str, str]:
    if isinstance(sample, str):
        return {"text": sample}
    if isinstance(sample, Mapping):  # the fields a sample has; others ignored, as a file's and the library's are
        return {k: sample[k] for k in ("text", "prompt", "completion") if k in sample}
    raise TypeError(f"sample {i} is a {type(sample).__name__}; give a text or a {{'text'}} / "
                    "{'prompt', 'completion'} dict")


def idempotency(key: str | None) -> dict[str, str] | None:
    """The ``Idempotency-Key`` header of a write: ``key``, a fresh one when ``None`` (so the write is retried safely
    when its answer is lost: a cut connection after the service stored the task raised ``Unreachable``, and the
    caller's retry met a 409 or appended twice), none when ``""``."""
    if key == "":
        return None
    if key is not None and not (isinstance(key, str) and key.isascii() and key.isprintable()):
        # an HTTP header carries printable ASCII: a non-ASCII key failed as "the request cannot be sent as JSON"
        raise InvalidInput(0, "invalid_input", f"the idempotency key must be printable ASCII, not {key!r:.60}")
    return {"Idempotency-Key": key if key is not None else f"client-{uuid.uuid4()}"}


def add_task(name: str, file: FileArg, samples: Iterable[SampleArg] | None, mode: str,
             metadata: dict[str, Any] | None, space: str | int | None, filename: str | None,
             idempotency_key: str | None = None) -> Call[Any]:
    """``POST /v1/tasks`` as JSON records or a multipart upload."""
    if file is not None:  # the form's fields first: a file is opened only for a call that is sent (and closed)
        try:
            data = {"name": name, "mode": mode, "metadata": json.dumps(metadata or {}, allow_nan=False)}
        except (TypeError, ValueError) as exc:  # a set, NaN: what the JSON body's path says too
            raise InvalidInput(0, "invalid_input", f"the metadata cannot be sent as JSON: {exc}") from None
        if space is not None:
            data["space"] = str(space)
    files, records, opened = upload(file, samples, filename)
    headers = idempotency(idempotency_key)
    if records is not None:
        body: dict[str, Any] = {"name": name, "mode": mode, "metadata": metadata or {}, "samples": records}
        if space is not None:
            body["space"] = str(space)
        return Call("POST", "/v1/tasks", TaskCreated, json=body, headers=headers)
    return Call("POST", "/v1/tasks", TaskCreated, data=data, files=files, headers=headers, opened=opened)


def path_id(value: object, what: str = "id") -> int:
    """``value`` as the integer id a URL path takes (``InvalidInput`` for anything else: ``"1/../2"`` reached task 2
    once httpx had collapsed the dot segments, and a delete would have removed another task than the one named)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):  # a NumPy integer too
        return int(value)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    hint = " (a task's numeric id; find one by name with find_task)" if what == "task id" else ""
    raise InvalidInput(0, "invalid_input", f"a {what} must be an integer, not {value!r}{hint}")


def id_list(values: object, what: str = "id") -> list[int]:
    """``values`` as a list of integer ids (each as :func:`path_id` takes it), in their order; ``InvalidInput`` for a
    string, a set or a mapping (no order to keep: a matrix's rows follow the ids' order) or anything not iterable."""
    refused = InvalidInput(0, "invalid_input", f"{what}s must be a list or tuple of integers, not {values!r}")
    if isinstance(values, str | bytes | Mapping | AbstractSet):
        raise refused
    try:
        items = list(cast(Iterable[object], values))
    except TypeError:
        raise refused from None
    return [path_id(v, what) for v in items]


def append(task_id: int, file: FileArg, samples: Iterable[SampleArg] | None, filename: str | None,
           idempotency_key: str | None = None) -> Call[Any]:
    """``POST /v1/tasks/{id}/samples``."""
    path = f"/v1/tasks/{path_id(task_id, 'task id')}/samples"  # (checked before a file is opened)
    files, records, opened = upload(file, samples, filename)
    headers = idempotency(idempotency_key)
    if records is not None:
        return Call("POST", path, JobAccepted, json={"samples": records}, headers=headers)
    return Call("POST", path, JobAccepted, files=files, headers=headers, opened=opened)


def route(prompt: str | Sequence[str], k: int, threshold: float | None, candidates: int | None,
          space: str | int | None) -> Call[Any]:
    """``POST /v1/route`` for one prompt or a batch (``InvalidInput`` before sending for anything else)."""
    body: dict[str, Any] = {"k": k}
    if isinstance(prompt, str):
        body["prompt"] = prompt
    else:
        try:
            body["prompts"] = prompt_batch(prompt)
        except TypeError as exc:
            raise InvalidInput(0, "invalid_input", str(exc)) from None
    for key, value in (("threshold", threshold), ("candidates", candidates)):
        if value is not None:
            body[key] = value
    if space is not None:
        body["space"] = str(space)
    return Call("POST", "/v1/route", RouteResponse, json=body)


WAIT_OUTAGE_S = 120.0
"""How long ``wait_job`` keeps polling a service it cannot reach (a replica restarting, a rolling deploy)."""


class JobWatch:
    """State of ``wait_job``: progress stream first, polling as the fallback, an optional deadline."""

    def __init__(self, on_progress: ProgressCallback | None, timeout: float | None) -> None:
        self.on_progress = on_progress
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.last: JobOut | None = None
        self.lost_since: float | None = None

    def lost(self, exc: AtlasClientError, job_id: int) -> None:
        """A poll found the service unreachable or unavailable: return to poll again, or re-raise ``exc`` naming
        the job once ``WAIT_OUTAGE_S`` or the deadline has passed (the job may well be running still)."""
        now = time.monotonic()
        self.lost_since = self.lost_since or now
        if now - self.lost_since > WAIT_OUTAGE_S or self.expired():
            raise type(exc)(exc.status, exc.code, f"{exc.message} (gave up waiting for job {job_id}, which may "
                            f"still run: GET /v1/jobs/{job_id})", exc.detail, exc.retry_after) from exc

    @property
    def finished(self) -> bool:
        """Whether the last report was final."""
        return self.last is not None and self.last.done

    def done(self, job: JobOut) -> bool:
        """Report ``job``; whether it has ended."""
        self.last = job
        if self.on_progress:
            self.on_progress(job)
        return job.done

    def remaining(self) -> float | None:
        """Seconds to the deadline (0 past it; ``None``: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def expired(self) -> bool:
        """Past the deadline."""
        return self.deadline is not None and time.monotonic() > self.deadline

    def stream_failed(self, exc: AtlasClientError) -> None:
        """An unreachable or missing progress stream, or one refused for the moment (429: too many open streams
        of this key or service; 502, 503, 504: the service or a proxy busy or restarting, which polling rides out
        for ``WAIT_OUTAGE_S``), falls back to polling; anything else is raised."""
        if exc.status not in (0, 404, 405, 429, 502, 503, 504):
            raise exc

    def polled(self, job: JobOut) -> bool:
        """Report a polled ``job``; whether it has ended (:class:`TimeoutError` past the deadline)."""
        self.lost_since = None
        if self.done(job):
            return True
        if self.expired():
            raise TimeoutError(f"job {job.id} still {job.status} after {self.timeout} s")
        return False

    def result(self) -> JobOut:
        """The final job."""
        assert self.last is not None and self.last.done
        return self.last
