"""Reading task uploads: multipart files or JSON bodies, with size limits enforced while streaming.

:class:`service.body_limit.BodyLimitMiddleware` caps every request body before it reaches these readers (413 on a
declared or counted size over the limit; nothing read into memory or onto disk). Parsing into samples uses
:func:`atlas.sample_io.read_samples` (streaming, stopping at the sample-count, sample-length and
decoded-byte limits) / :func:`atlas.samples.samples_from_records`; nothing is stored before the whole
upload is parsed and validated.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.types import Scope

from atlas.errors import AtlasError, InvalidInput, PayloadTooLarge
from atlas.json_bounds import (
    MAX_JSON_VALUES,
    json_array_length,
    json_token_count,
    upload_value_limit,
)
from atlas.sample_io import SampleLimits, loads_json, read_samples
from atlas.samples import (
    Sample,
    check_metadata,
    nested_keys,
    refuse_repeated_keys,
    samples_from_records,
    unique_keys_object,
)
from service.body_limit import LARGE_BODY_BYTES
from service.errors import DomainErrorInBody


class UnsupportedMediaType(AtlasError):
    """The request body has a content type this endpoint does not read (415)."""

    status_code = 415
    code = "unsupported_media_type"


@dataclass
class Upload:
    """A parsed upload request."""

    name: str | None = None
    mode: str = "text"
    space: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    raw: bytes | None = None
    filename: str | None = None
    records: list[dict[str, Any]] | None = None
    limits: SampleLimits = field(default_factory=SampleLimits)

    def samples(self, mode: str | None = None) -> list[Sample]:
        """Parse into samples for ``mode`` (default: the upload's own mode), within :attr:`limits`."""
        m = mode or self.mode
        if self.records is not None:
            if len(self.records) > self.limits.max_samples:
                raise PayloadTooLarge(f"{len(self.records)} samples exceed the limit of {self.limits.max_samples} "
                                      "per upload", {"samples": len(self.records),
                                                     "max_samples": self.limits.max_samples})
            return samples_from_records(list(self.records), m)  # type: ignore[arg-type]
        assert self.raw is not None
        return read_samples(self.raw, self.filename or "upload.txt", m, self.limits)  # type: ignore[arg-type]


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


MAX_FORM_TEXT = {"name": 1000, "mode": 100, "space": 300}
"""Longest value of each short form field, whitespace included (a name is refused past 300 characters once its
surrounding whitespace is stripped; metadata is bounded by :func:`atlas.samples.check_metadata`): a megabyte of
``space`` was echoed into messages and logs."""


def _field(form: Any, key: str) -> str | None:
    value = form.get(key)
    if value is None:
        return None
    if isinstance(value, UploadFile):
        raise InvalidInput(f"form field {key!r} must be a text field, not a file")
    text = str(value)
    most = MAX_FORM_TEXT.get(key)
    if most is not None and len(text) > most:
        raise InvalidInput(f"form field {key!r} has {len(text)} characters; at most {most}",
                           {"field": key, "max_chars": most})
    return text


async def read_upload(request: Request, *, max_upload_bytes: int, json_model: Any, with_task_fields: bool,
                      limits: SampleLimits | None = None) -> Upload:
    """Read a multipart (``file`` + form fields) or JSON (``samples``) upload.

    Parameters
    ----------
    json_model
        Pydantic model validating the JSON variant (``TaskCreate`` or ``SamplesAppend``).
    with_task_fields
        Whether ``name``/``mode``/``space``/``metadata`` are read (task creation).
    limits
        Sample limits (default: :class:`~atlas.sample_io.SampleLimits` with ``max_bytes=max_upload_bytes``).

    Raises
    ------
    InvalidInput, PayloadTooLarge, UnsupportedMediaType
    """
    lim = limits or SampleLimits(max_bytes=max_upload_bytes)
    up = await _read_any(request, max_upload_bytes, json_model, with_task_fields, lim)
    up.limits = lim
    return up


PRECOUNT_ABOVE_BYTES = 64 * 1024
"""JSON bodies larger than this have their samples counted (cheaply) before they are validated."""


class _TooManyJSONValues(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the JSON body holds more than {limit} values; no request of this route needs as many")


class BoundedJSONRequest(Request):
    """A request whose :meth:`json` refuses (413) a body holding more values than
    :data:`atlas.json_bounds.MAX_JSON_VALUES` before ``json.loads`` builds them (a 63 MB body of ``{}`` items took
    1.6 GB of memory), and (422) a body that repeats a key in one object (JSON keeps the last value: a repeated
    ``"prompts"`` or metadata key lost the first without a word)."""

    async def json(self) -> Any:
        """The parsed JSON body, after the bounded count of its values. A body over 1 MiB or of undeclared length
        (:func:`large_body`) is parsed holding one of the process's upload slots (:mod:`service.upload_slots`): a
        route or ``fit`` body may be up to ``max_upload_bytes`` and is held 2–4 times while it is parsed. FastAPI
        has read the body whole before (so a slow sender holds no slot, and the raw bodies of requests waiting for
        one are not bounded by the slots); the slot is given back before the answer is computed."""
        if not hasattr(self, "_json"):
            state = getattr(self.scope.get("app"), "state", None)
            container = getattr(state, "container", None)
            if container is not None and large_body(self.scope):
                try:
                    async with container.upload_slots.hold():
                        self._json = await self._parsed(getattr(state, "settings", None))
                except AtlasError as exc:  # FastAPI would make it "There was an error parsing the body"
                    raise DomainErrorInBody(exc) from None
            else:
                self._json = await self._parsed(getattr(state, "settings", None))
        return self._json

    async def _parsed(self, settings: Any) -> Any:
        body = await self.body()
        limit = MAX_JSON_VALUES + 2 * int(getattr(settings, "max_matrix_tasks", 0))
        # off the event loop when large: a body may be up to max_upload_bytes, and its count and parse are seconds
        return (await run_in_threadpool(_bounded_json, body, limit) if len(body) > PRECOUNT_ABOVE_BYTES
                else _bounded_json(body, limit))


def _bounded_json(body: bytes, limit: int) -> Any:
    """``body`` parsed, once its structural tokens are counted (413 past ``limit``) and with no repeated key (422)."""
    if len(body) > limit and json_token_count(body, limit) > limit:
        raise _TooManyJSONValues(limit)
    # UTF-8, as RFC 8259 says: the count reads UTF-8 bytes (json.loads decoded UTF-16 and UTF-32 too, past the count)
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):
        raise DomainErrorInBody(InvalidInput(f"the request body is not UTF-8 (it reads as {encoding}); JSON is sent "
                                             "as UTF-8", {"encoding": encoding}))
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DomainErrorInBody(InvalidInput(f"the request body is not UTF-8 (byte {exc.start}); JSON is sent as "
                                             "UTF-8", {"byte": exc.start})) from None
    try:
        return json.loads(text, object_pairs_hook=unique_keys_object)
    except InvalidInput as exc:  # FastAPI turns any other exception of the body's parse into a 400
        raise DomainErrorInBody(InvalidInput(f"the request body: {exc.message}", exc.detail)) from None


def large_body(scope: Scope) -> bool:
    """Whether a request's body is over :data:`LARGE_BODY_BYTES` or of undeclared length (chunked): up to
    ``max_upload_bytes``, held 2–4 times while parsed (:meth:`BoundedJSONRequest.json` parses it holding a slot)."""
    if scope.get("method") not in ("POST", "PUT", "PATCH"):
        return False
    headers = dict(scope.get("headers", []))
    declared = headers.get(b"content-length")
    if declared is None:
        return b"transfer-encoding" in headers
    try:
        return int(declared) > LARGE_BODY_BYTES
    except ValueError:
        return True


class BoundedJSONRoute(APIRoute):
    """``APIRoute`` whose endpoints parse JSON bodies through :class:`BoundedJSONRequest` (same OpenAPI), and refuse
    (415) a body of another or no declared type where the endpoint reads JSON (a form-encoded ``curl -d`` answered
    422 "Input should be a valid dictionary", as if the JSON were wrong)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, given the request as a :class:`BoundedJSONRequest`."""
        handler = super().get_route_handler()
        reads_json = self.body_field is not None

        async def bounded(request: Request) -> Response:
            if reads_json:
                ctype = _content_type(request)
                if ctype != "application/json" and not ctype.endswith("+json"):  # FastAPI reads no other as JSON
                    said = f"unsupported content type {ctype!r}" if ctype else "no content type"
                    raise UnsupportedMediaType(f"{said}: send the body as JSON (Content-Type: application/json)",
                                               {"content_type": ctype})
            return await handler(BoundedJSONRequest(request.scope, request.receive))

        return bounded


async def _read_any(request: Request, max_upload_bytes: int, json_model: Any, with_task_fields: bool,
                    limits: SampleLimits) -> Upload:
    ctype = _content_type(request)
    if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        return await _read_multipart(request, max_upload_bytes, with_task_fields)
    if ctype in ("application/json", "") or ctype.endswith("+json"):
        body = (await request.body()).removeprefix(b"\xef\xbb\xbf")  # a BOM is no JSON (read so by the other routes)
        if not body:
            raise InvalidInput("the request body is empty: send multipart/form-data with a file, or JSON")
        # the bounded count, pydantic's parse and the repeated-key check are linear, but 64 MB of them held the event
        # loop (every other request) for seconds: a large body is read off it
        model = (await run_in_threadpool(_json_upload, body, json_model, limits) if len(body) > PRECOUNT_ABOVE_BYTES
                 else _json_upload(body, json_model, limits))
        up = Upload(records=[s.model_dump(exclude_none=True) for s in model.samples])
        if with_task_fields:
            up.name, up.mode, up.space = model.name, model.mode, model.space
            up.metadata = check_metadata(model.metadata)
        return up
    raise UnsupportedMediaType(
        f"unsupported content type {ctype!r}: send multipart/form-data (file) or application/json (samples)"
    )


def _json_upload(body: bytes, json_model: Any, limits: SampleLimits) -> Any:
    """A JSON upload body validated as ``json_model``: its samples counted first (413 past ``max_samples``, before
    pydantic builds them), parsed by pydantic, and refused where it repeats a key (:func:`_refuse_repeated_keys`)."""
    bound = upload_value_limit(limits.max_samples)  # samples and their task's fields
    too_many = len(body) > PRECOUNT_ABOVE_BYTES and json_array_length(
        body, "samples", limits.max_samples, max_tokens=bound) > limits.max_samples
    if too_many:
        raise PayloadTooLarge(f"the request body holds more than {limits.max_samples} samples",
                              {"max_samples": limits.max_samples})
    try:  # pydantic's own JSON parser: no Python dict tree, nesting bounded (422, never RecursionError)
        model = json_model.model_validate_json(body)
    except ValidationError as exc:
        if any(e.get("type") == "json_invalid" for e in exc.errors(include_url=False)):
            raise InvalidInput(f"the request body is not valid JSON: {exc.errors()[0].get('msg', '')}",
                               {"error": str(exc.errors()[0].get("ctx", {}).get("error", ""))[:200]}) from None
        raise RequestValidationError(
            [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_url=False)]
        ) from None
    _refuse_repeated_keys(body, _keys_given(model))
    return model


def _keys_given(model: Any) -> int:
    """The keys of the objects of a validated upload body (pydantic's fields set, the metadata's keys at every
    depth): each key of the body that was not repeated."""
    return (len(model.model_fields_set) + sum(len(s.model_fields_set) for s in model.samples)
            + nested_keys(getattr(model, "metadata", None)))


def _refuse_repeated_keys(body: bytes, keys_given: int) -> None:
    """Refuse (422) an upload body that repeats a key in one object, as :class:`BoundedJSONRequest` does for other
    bodies: pydantic's parser keeps the last value (``{"text": "a", "text": "b"}`` was stored as ``"b"``)."""
    try:
        refuse_repeated_keys(body, keys_given)
    except InvalidInput as exc:
        raise InvalidInput(f"the request body: {exc.message}", exc.detail) from None


class _Utf8MultiPartParser(MultiPartParser):
    """Starlette's multipart parser with every text field UTF-8 or refused. It decoded a field that is not UTF-8 as
    Latin-1 (``bad\\xff\\xfename`` stored as ``badÿþname``), and a ``charset`` of the body's type as that charset (a
    UTF-8 ``naïve`` under ``charset=latin-1`` stored as ``naÃ¯ve``), where a JSON body or a file of the same bytes
    is refused (an API fuzz, 2026-12-07)."""

    def on_part_end(self) -> None:
        if self._current_part.file is None:
            try:
                bytes(self._current_part.data).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MultiPartException(f"form field {self._current_part.field_name!r} is not valid UTF-8 (byte "
                                         f"{exc.start})") from None
        super().on_part_end()


def _check_form_charset(request: Request) -> None:
    """Refuse a multipart body whose type names a charset other than UTF-8 (its fields are read as UTF-8)."""
    import codecs

    from python_multipart.multipart import parse_options_header

    charset = parse_options_header(request.headers.get("content-type", ""))[1].get(b"charset")
    if charset is None:
        return
    name = charset.decode("latin-1")
    try:
        utf8 = codecs.lookup(name).name == "utf-8"
    except LookupError:
        utf8 = False
    if not utf8:
        raise InvalidInput(f"a multipart body's fields are read as UTF-8: charset={name!r} is not taken (send UTF-8 "
                           "and leave the charset out, or name utf-8)", {"charset": name[:40]})


async def _read_multipart(request: Request, max_upload_bytes: int, with_task_fields: bool) -> Upload:
    _check_form_charset(request)
    try:
        form = await _Utf8MultiPartParser(request.headers, request.stream(), max_files=1, max_fields=32).parse()
    except MultiPartException as exc:
        raise InvalidInput(f"malformed multipart body: {exc.message}") from None
    except StarletteHTTPException as exc:
        if exc.status_code == 413:
            raise
        raise InvalidInput(f"malformed multipart body: {exc.detail}") from None
    except (ValueError, KeyError, AssertionError) as exc:
        raise InvalidInput(f"malformed multipart body: {exc}") from None
    try:
        _check_form_fields(form, TASK_FORM_FIELDS if with_task_fields else APPEND_FORM_FIELDS)
        file = form.get("file")
        if not isinstance(file, UploadFile):
            raise InvalidInput("the multipart body needs a 'file' part holding the samples")
        if file.size is not None and file.size > max_upload_bytes:
            raise PayloadTooLarge(
                f"the file has {file.size} bytes; the upload limit is {max_upload_bytes}",
                {"bytes": file.size, "max_upload_bytes": max_upload_bytes},
            )
        raw = await file.read(max_upload_bytes + 1)
        if len(raw) > max_upload_bytes:
            raise PayloadTooLarge(f"the file exceeds the upload limit of {max_upload_bytes} bytes",
                                  {"max_upload_bytes": max_upload_bytes})
        up = Upload(raw=raw, filename=file.filename or "upload.txt")
        if with_task_fields:
            name = _field(form, "name")
            if name is None or not name.strip():
                raise InvalidInput("form field 'name' is required")
            if len(name) > 300:
                raise InvalidInput("a task name must have 1 to 300 characters")
            mode = _field(form, "mode") or "text"
            if mode not in ("text", "completion"):
                raise InvalidInput("form field 'mode' must be 'text' or 'completion'", {"mode": mode})
            meta_text = _field(form, "metadata")
            metadata: dict[str, Any] = {}
            if meta_text and meta_text.strip():
                metadata = check_metadata(loads_json(meta_text, "form field 'metadata'"), where="form field 'metadata'")
            up.name, up.mode, up.space, up.metadata = name, mode, _field(form, "space") or None, metadata
        return up
    finally:
        await form.close()


TASK_FORM_FIELDS = ("file", "name", "mode", "space", "metadata")
APPEND_FORM_FIELDS = ("file",)


def _check_form_fields(form: Any, allowed: tuple[str, ...]) -> None:
    """Refuse a multipart field the route does not read, or one given twice: a typo ("metdata") lost the user's
    metadata without a word, and of two "name" fields the last one silently won (a JSON body's unknown key is a 422
    already)."""
    counts = Counter(key for key, _ in form.multi_items())
    unknown = sorted(k for k in counts if k not in allowed)
    if unknown:
        raise InvalidInput(f"unknown form field(s) {', '.join(map(repr, unknown))}: this upload takes "
                           f"{', '.join(map(repr, allowed))}", {"fields": unknown, "allowed": list(allowed)})
    twice = sorted(k for k, n in counts.items() if n > 1)
    if twice:
        raise InvalidInput(f"form field(s) {', '.join(map(repr, twice))} given more than once", {"fields": twice})


TASK_FORM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["file", "name"],
    "properties": {
        "file": {"type": "string", "format": "binary",
                 "description": "JSONL/JSON ({\"text\"} or {\"prompt\",\"completion\"} per record), CSV or TSV "
                                "(same columns), Parquet, or plain text (one sample per line); any of them gzipped "
                                "(.gz). The extension decides."},
        "name": {"type": "string", "minLength": 1, "maxLength": 300, "example": "smiles"},
        "mode": {"type": "string", "enum": ["text", "completion"], "default": "text"},
        "space": {"type": "string", "description": "Space id or name (default: the loaded model's)."},
        "metadata": {"type": "string", "description": "Task metadata as a JSON object.",
                     "example": "{\"domain\": \"chemistry\"}"},
    },
}

APPEND_FORM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["file"],
    "properties": {"file": TASK_FORM_SCHEMA["properties"]["file"]},
}

IMPORT_FORM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["file"],
    "properties": {"file": {"type": "string", "format": "binary",
                            "description": "A file written by GET /v1/spaces/{space}/export."}},
}
