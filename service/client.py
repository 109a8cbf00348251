"""Typed Python client of the FisherAtlas REST API, sync (:class:`AtlasClient`) and async
(:class:`AsyncAtlasClient`), on httpx.

>>> from service.client import AtlasClient
>>> with AtlasClient("http://127.0.0.1:8000") as c:               # doctest: +SKIP
...     created = c.add_task("smiles", file="smiles.jsonl", wait=True)
...     c.route("CCO", k=3).matches[0].name
'smiles'

Every method returns the response model of :mod:`service.schemas`; every error response raises
:class:`AtlasClientError` with the service's ``status``, ``code``, ``message`` and ``detail``.
Both clients build their requests with the same :class:`_Call` descriptions, so they cannot drift.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from service.schemas import (
    AlignMatrixResponse,
    AlignResponse,
    AtlasResponse,
    Health,
    ImportResult,
    JobAccepted,
    JobOut,
    Readiness,
    RouteResponse,
    SourcesResponse,
    SpaceList,
    TaskCreated,
    TaskList,
    TaskOut,
)

DEFAULT_URL = "http://127.0.0.1:8000"
T = TypeVar("T", bound=BaseModel)
ProgressCallback = Callable[[JobOut], None]
FileArg = str | os.PathLike[str] | bytes | None


class AtlasClientError(Exception):
    """An error answered by the service (or a transport failure, with ``status`` 0).

    Attributes
    ----------
    status : int
        HTTP status (0 when the service could not be reached).
    code : str
        The service's error code, e.g. ``not_found``, ``queue_full``.
    message : str
        Human-readable explanation.
    detail : Any
        Structured detail, if any.
    """

    def __init__(self, status: int, code: str, message: str, detail: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail


@dataclass
class _Call(Generic[T]):
    """One HTTP request and the model its JSON answer parses into (``None``: raw bytes)."""

    method: str
    path: str
    model: type[T] | None
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    data: dict[str, str] | None = None
    files: dict[str, tuple[str, bytes, str]] | None = None

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"params": {k: v for k, v in self.params.items() if v is not None}}
        if self.json is not None:
            out["json"] = self.json
        if self.data is not None:
            out["data"] = self.data
        if self.files is not None:
            out["files"] = self.files
        return out


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        code, message, detail = body.get("code", "http_error"), body.get("message", resp.text), body.get("detail")
    except (ValueError, AttributeError):
        code, message, detail = "http_error", resp.text or resp.reason_phrase, None
    raise AtlasClientError(resp.status_code, str(code), str(message), detail)


def _parse(call: _Call[T], resp: httpx.Response) -> Any:
    _raise_for(resp)
    if call.model is None:
        return resp.content
    return call.model.model_validate(resp.json())


def _upload(
    file: FileArg, samples: Sequence[dict[str, str]] | None, filename: str | None
) -> tuple[dict[str, tuple[str, bytes, str]] | None, list[dict[str, str]] | None]:
    if (file is None) == (samples is None):
        raise ValueError("give exactly one of 'file' or 'samples'")
    if samples is not None:
        return None, [dict(s) for s in samples]
    if isinstance(file, bytes):
        return {"file": (filename or "upload.jsonl", file, "application/octet-stream")}, None
    path = Path(os.fspath(file))  # type: ignore[arg-type]
    return {"file": (filename or path.name, path.read_bytes(), "application/octet-stream")}, None


class _Calls:
    """Request descriptions of every endpoint (shared by both clients)."""

    @staticmethod
    def add_task(
        name: str, file: FileArg, samples: Sequence[dict[str, str]] | None, mode: str,
        metadata: dict[str, Any] | None, space: str | int | None, filename: str | None,
    ) -> _Call[TaskCreated]:
        files, records = _upload(file, samples, filename)
        if records is not None:
            body = {"name": name, "mode": mode, "metadata": metadata or {}, "samples": records}
            if space is not None:
                body["space"] = str(space)
            return _Call("POST", "/v1/tasks", TaskCreated, json=body)
        data = {"name": name, "mode": mode, "metadata": json.dumps(metadata or {})}
        if space is not None:
            data["space"] = str(space)
        return _Call("POST", "/v1/tasks", TaskCreated, data=data, files=files)

    @staticmethod
    def append(
        task_id: int, file: FileArg, samples: Sequence[dict[str, str]] | None, filename: str | None
    ) -> _Call[JobAccepted]:
        files, records = _upload(file, samples, filename)
        if records is not None:
            return _Call("POST", f"/v1/tasks/{task_id}/samples", JobAccepted, json={"samples": records})
        return _Call("POST", f"/v1/tasks/{task_id}/samples", JobAccepted, files=files)

    @staticmethod
    def list_tasks(
        space: str | int | None, name: str | None, name_prefix: str | None, status: str | None, offset: int, limit: int
    ) -> _Call[TaskList]:
        params = {"space": space, "name": name, "name_prefix": name_prefix, "status": status,
                  "offset": offset, "limit": limit}
        return _Call("GET", "/v1/tasks", TaskList, params=params)

    @staticmethod
    def route(
        prompt: str | Sequence[str], k: int, threshold: float | None, candidates: int | None, space: str | int | None
    ) -> _Call[RouteResponse]:
        body: dict[str, Any] = {"k": k}
        if isinstance(prompt, str):
            body["prompt"] = prompt
        else:
            body["prompts"] = list(prompt)
        if threshold is not None:
            body["threshold"] = threshold
        if candidates is not None:
            body["candidates"] = candidates
        if space is not None:
            body["space"] = str(space)
        return _Call("POST", "/v1/route", RouteResponse, json=body)


class _Base:
    def __init__(self, base_url: str | None, api_key: str | None) -> None:
        self.base_url = (base_url or os.environ.get("FISHER_ATLAS_URL") or DEFAULT_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("FISHER_ATLAS_API_KEY")

    def _headers(self) -> dict[str, str]:
        return {"X-API-Key": self.api_key} if self.api_key else {}


class _SSEParser:
    """Incremental parser of ``text/event-stream`` lines yielding the ``progress`` events' jobs."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> JobOut | None:
        if line.startswith("event:"):
            self.event = line[6:].strip()
        elif line.startswith("data:"):
            self.data.append(line[5:].lstrip())
        elif line == "":
            event, data = self.event, self.data
            self.event, self.data = "message", []
            if data and event == "progress":
                return JobOut.model_validate(json.loads("\n".join(data)))
        return None


def _sse_jobs(lines: Iterator[str]) -> Iterator[JobOut]:
    parser = _SSEParser()
    for line in lines:
        job = parser.feed(line)
        if job is not None:
            yield job


class _JobWatch:
    """State of ``wait_job`` (shared by the sync and async clients): progress stream, then polling."""

    def __init__(self, on_progress: ProgressCallback | None, timeout: float | None) -> None:
        self.on_progress = on_progress
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.last: JobOut | None = None

    @property
    def finished(self) -> bool:
        return self.last is not None and self.last.done

    def done(self, job: JobOut) -> bool:
        """Report ``job``; whether it has ended."""
        self.last = job
        if self.on_progress:
            self.on_progress(job)
        return job.done

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def stream_failed(self, exc: AtlasClientError) -> None:
        """An unreachable or missing progress stream falls back to polling; anything else is raised."""
        if exc.status not in (0, 404, 405):
            raise exc

    def polled(self, job: JobOut) -> bool:
        """Report a polled ``job``; whether it has ended (:class:`TimeoutError` when not, past the deadline)."""
        if self.done(job):
            return True
        if self.expired():
            raise TimeoutError(f"job {job.id} still {job.status} after {self.timeout} s")
        return False

    def result(self) -> JobOut:
        assert self.last is not None and self.last.done
        return self.last


class AtlasClient(_Base):
    """Synchronous client.

    Parameters
    ----------
    base_url
        Service URL (default ``$FISHER_ATLAS_URL`` or ``http://127.0.0.1:8000``).
    api_key
        Sent as ``X-API-Key`` (default ``$FISHER_ATLAS_API_KEY``).
    timeout
        Request timeout in seconds.
    transport
        Optional httpx transport (e.g. ``httpx.ASGITransport``).
    """

    def __init__(
        self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers(), timeout=timeout, transport=transport)

    def __enter__(self) -> AtlasClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _send(self, call: _Call[Any]) -> Any:
        try:
            resp = self._http.request(call.method, call.path, **call.kwargs())
        except httpx.TransportError as exc:
            raise AtlasClientError(0, "unreachable", f"{self.base_url}: {exc}") from exc
        return _parse(call, resp)

    # health ---------------------------------------------------------------------------------------
    def health(self) -> Health:
        """``GET /healthz``."""
        return self._send(_Call("GET", "/healthz", Health))

    def ready(self) -> Readiness:
        """``GET /readyz`` (answers 503 with the body when not ready: returned, not raised)."""
        resp = self._http.get("/readyz")
        if resp.status_code in (200, 503):
            return Readiness.model_validate(resp.json())
        _raise_for(resp)
        return Readiness.model_validate(resp.json())

    # tasks ----------------------------------------------------------------------------------------
    def add_task(
        self, name: str, file: FileArg = None, *, samples: Sequence[dict[str, str]] | None = None,
        mode: str = "text", metadata: dict[str, Any] | None = None, space: str | int | None = None,
        filename: str | None = None, wait: bool = False, on_progress: ProgressCallback | None = None,
        wait_timeout: float | None = None,
    ) -> TaskCreated:
        """``POST /v1/tasks`` from a file path / bytes (``file``) or records (``samples``).

        With ``wait=True`` the job is followed until it ends (``on_progress`` sees every update) and
        the returned object holds the final job and task.
        """
        created: TaskCreated = self._send(_Calls.add_task(name, file, samples, mode, metadata, space, filename))
        if not wait:
            return created
        job = self.wait_job(created.job.id, on_progress=on_progress, timeout=wait_timeout)
        return TaskCreated(task=self.get_task(created.task.id), job=job)

    def append(
        self, task_id: int, file: FileArg = None, *, samples: Sequence[dict[str, str]] | None = None,
        filename: str | None = None, wait: bool = False, on_progress: ProgressCallback | None = None,
        wait_timeout: float | None = None,
    ) -> JobOut:
        """``POST /v1/tasks/{id}/samples``; returns the job (final with ``wait=True``)."""
        accepted: JobAccepted = self._send(_Calls.append(task_id, file, samples, filename))
        if not wait:
            return accepted.job
        return self.wait_job(accepted.job.id, on_progress=on_progress, timeout=wait_timeout)

    def get_task(self, task_id: int) -> TaskOut:
        """``GET /v1/tasks/{id}``."""
        return self._send(_Call("GET", f"/v1/tasks/{task_id}", TaskOut))

    def list_tasks(
        self, *, space: str | int | None = None, name: str | None = None, name_prefix: str | None = None,
        status: str | None = None, offset: int = 0, limit: int = 50,
    ) -> TaskList:
        """``GET /v1/tasks`` with filters and pagination."""
        return self._send(_Calls.list_tasks(space, name, name_prefix, status, offset, limit))

    def find_task(self, name_or_id: str | int, *, space: str | int | None = None) -> TaskOut:
        """A task by exact name (in ``space``, default the service's) or by numeric id."""
        if isinstance(name_or_id, int):
            return self.get_task(name_or_id)
        found = self.list_tasks(space=space, name=name_or_id, limit=1).items
        if found:
            return found[0]
        if name_or_id.isascii() and name_or_id.isdigit():
            return self.get_task(int(name_or_id))
        raise AtlasClientError(404, "not_found", f"no task named {name_or_id!r}")

    def patch_task(self, task_id: int, metadata: dict[str, Any]) -> TaskOut:
        """``PATCH /v1/tasks/{id}``: merge ``metadata`` (``None`` values remove keys)."""
        return self._send(_Call("PATCH", f"/v1/tasks/{task_id}", TaskOut, json={"metadata": metadata}))

    def delete_task(self, task_id: int) -> None:
        """``DELETE /v1/tasks/{id}`` (removes it from the store and the index)."""
        self._send(_Call("DELETE", f"/v1/tasks/{task_id}", None))

    # jobs -----------------------------------------------------------------------------------------
    def get_job(self, job_id: int) -> JobOut:
        """``GET /v1/jobs/{id}``."""
        return self._send(_Call("GET", f"/v1/jobs/{job_id}", JobOut))

    def cancel_job(self, job_id: int) -> JobOut:
        """``POST /v1/jobs/{id}/cancel``."""
        return self._send(_Call("POST", f"/v1/jobs/{job_id}/cancel", JobOut))

    def job_events(self, job_id: int) -> Iterator[JobOut]:
        """Iterate the server-sent progress events of a job until it ends."""
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=httpx.Timeout(30.0, read=None)) as r:
                if r.status_code >= 400:
                    r.read()
                    _raise_for(r)
                yield from _sse_jobs(r.iter_lines())
        except httpx.TransportError as exc:
            raise AtlasClientError(0, "unreachable", f"{self.base_url}: {exc}") from exc

    def wait_job(
        self, job_id: int, *, on_progress: ProgressCallback | None = None, timeout: float | None = None,
        poll_interval: float = 0.5,
    ) -> JobOut:
        """Follow a job (progress stream, polling as fallback) until it ends; return its final state."""
        watch = _JobWatch(on_progress, timeout)
        try:
            for job in self.job_events(job_id):
                if watch.done(job) or watch.expired():
                    break
        except AtlasClientError as exc:
            watch.stream_failed(exc)
        while not watch.finished and not watch.polled(self.get_job(job_id)):
            time.sleep(poll_interval)
        return watch.result()

    # queries --------------------------------------------------------------------------------------
    def route(
        self, prompt: str | Sequence[str], *, k: int = 5, threshold: float | None = None,
        candidates: int | None = None, space: str | int | None = None,
    ) -> RouteResponse:
        """``POST /v1/route`` for one prompt (``str``) or a batch (a sequence)."""
        return self._send(_Calls.route(prompt, k, threshold, candidates, space))

    def sources(self, task_id: int, *, k: int = 5, candidates: int | None = None) -> SourcesResponse:
        """``GET /v1/tasks/{id}/sources``: recommended fine-tuning sources."""
        return self._send(
            _Call("GET", f"/v1/tasks/{task_id}/sources", SourcesResponse, params={"k": k, "candidates": candidates})
        )

    def align(self, a: int, b: int) -> AlignResponse:
        """``GET /v1/align?a=&b=``."""
        return self._send(_Call("GET", "/v1/align", AlignResponse, params={"a": a, "b": b}))

    def align_matrix(self, task_ids: Sequence[int]) -> AlignMatrixResponse:
        """``POST /v1/align/matrix``."""
        return self._send(_Call("POST", "/v1/align/matrix", AlignMatrixResponse, json={"task_ids": list(task_ids)}))

    def atlas(self, *, space: str | int | None = None) -> AtlasResponse:
        """``GET /v1/atlas``: the 2-D map of a space."""
        return self._send(_Call("GET", "/v1/atlas", AtlasResponse, params={"space": space}))

    # spaces ---------------------------------------------------------------------------------------
    def spaces(self) -> SpaceList:
        """``GET /v1/spaces``."""
        return self._send(_Call("GET", "/v1/spaces", SpaceList))

    def export_space(self, space: str | int | None = None, out: str | os.PathLike[str] | None = None) -> bytes:
        """``GET /v1/spaces/{id}/export`` (``default`` when ``space`` is None); optionally write ``out``."""
        blob: bytes = self._send(_Call("GET", f"/v1/spaces/{space if space is not None else 'default'}/export", None))
        if out is not None:
            Path(os.fspath(out)).write_bytes(blob)
        return blob

    def import_space(self, file: str | os.PathLike[str] | bytes, *, on_conflict: str = "fail") -> ImportResult:
        """``POST /v1/spaces/import`` of a file written by :meth:`export_space`."""
        data = file if isinstance(file, bytes) else Path(os.fspath(file)).read_bytes()
        call = _Call(
            "POST", "/v1/spaces/import", ImportResult, params={"on_conflict": on_conflict},
            files={"file": ("space.jsonl", data, "application/x-ndjson")},
        )
        return self._send(call)


class AsyncAtlasClient(_Base):
    """Asynchronous client: the same methods as :class:`AtlasClient`, as coroutines."""

    def __init__(
        self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None, limits: httpx.Limits | None = None,
    ) -> None:
        super().__init__(base_url, api_key)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers(), timeout=timeout, transport=transport,
            limits=limits or httpx.Limits(max_connections=100, max_keepalive_connections=100),
        )

    async def __aenter__(self) -> AsyncAtlasClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _send(self, call: _Call[Any]) -> Any:
        try:
            resp = await self._http.request(call.method, call.path, **call.kwargs())
        except httpx.TransportError as exc:
            raise AtlasClientError(0, "unreachable", f"{self.base_url}: {exc}") from exc
        return _parse(call, resp)

    async def health(self) -> Health:
        """``GET /healthz``."""
        return await self._send(_Call("GET", "/healthz", Health))

    async def add_task(
        self, name: str, file: FileArg = None, *, samples: Sequence[dict[str, str]] | None = None,
        mode: str = "text", metadata: dict[str, Any] | None = None, space: str | int | None = None,
        filename: str | None = None, wait: bool = False, on_progress: ProgressCallback | None = None,
        wait_timeout: float | None = None,
    ) -> TaskCreated:
        """See :meth:`AtlasClient.add_task`."""
        created: TaskCreated = await self._send(
            _Calls.add_task(name, file, samples, mode, metadata, space, filename)
        )
        if not wait:
            return created
        job = await self.wait_job(created.job.id, on_progress=on_progress, timeout=wait_timeout)
        return TaskCreated(task=await self.get_task(created.task.id), job=job)

    async def append(
        self, task_id: int, file: FileArg = None, *, samples: Sequence[dict[str, str]] | None = None,
        filename: str | None = None, wait: bool = False, on_progress: ProgressCallback | None = None,
        wait_timeout: float | None = None,
    ) -> JobOut:
        """See :meth:`AtlasClient.append`."""
        accepted: JobAccepted = await self._send(_Calls.append(task_id, file, samples, filename))
        if not wait:
            return accepted.job
        return await self.wait_job(accepted.job.id, on_progress=on_progress, timeout=wait_timeout)

    async def get_task(self, task_id: int) -> TaskOut:
        """``GET /v1/tasks/{id}``."""
        return await self._send(_Call("GET", f"/v1/tasks/{task_id}", TaskOut))

    async def list_tasks(
        self, *, space: str | int | None = None, name: str | None = None, name_prefix: str | None = None,
        status: str | None = None, offset: int = 0, limit: int = 50,
    ) -> TaskList:
        """``GET /v1/tasks``."""
        return await self._send(_Calls.list_tasks(space, name, name_prefix, status, offset, limit))

    async def patch_task(self, task_id: int, metadata: dict[str, Any]) -> TaskOut:
        """``PATCH /v1/tasks/{id}``."""
        return await self._send(_Call("PATCH", f"/v1/tasks/{task_id}", TaskOut, json={"metadata": metadata}))

    async def delete_task(self, task_id: int) -> None:
        """``DELETE /v1/tasks/{id}``."""
        await self._send(_Call("DELETE", f"/v1/tasks/{task_id}", None))

    async def get_job(self, job_id: int) -> JobOut:
        """``GET /v1/jobs/{id}``."""
        return await self._send(_Call("GET", f"/v1/jobs/{job_id}", JobOut))

    async def cancel_job(self, job_id: int) -> JobOut:
        """``POST /v1/jobs/{id}/cancel``."""
        return await self._send(_Call("POST", f"/v1/jobs/{job_id}/cancel", JobOut))

    async def job_events(self, job_id: int) -> AsyncIterator[JobOut]:
        """Iterate the server-sent progress events of a job until it ends."""
        try:
            async with self._http.stream(
                "GET", f"/v1/jobs/{job_id}/events", timeout=httpx.Timeout(30.0, read=None)
            ) as r:
                if r.status_code >= 400:
                    await r.aread()
                    _raise_for(r)
                parser = _SSEParser()
                async for line in r.aiter_lines():
                    job = parser.feed(line)
                    if job is not None:
                        yield job
        except httpx.TransportError as exc:
            raise AtlasClientError(0, "unreachable", f"{self.base_url}: {exc}") from exc

    async def wait_job(
        self, job_id: int, *, on_progress: ProgressCallback | None = None, timeout: float | None = None,
        poll_interval: float = 0.5,
    ) -> JobOut:
        """See :meth:`AtlasClient.wait_job`."""
        watch = _JobWatch(on_progress, timeout)
        try:
            async for job in self.job_events(job_id):
                if watch.done(job) or watch.expired():
                    break
        except AtlasClientError as exc:
            watch.stream_failed(exc)
        while not watch.finished and not watch.polled(await self.get_job(job_id)):
            await asyncio.sleep(poll_interval)
        return watch.result()

    async def route(
        self, prompt: str | Sequence[str], *, k: int = 5, threshold: float | None = None,
        candidates: int | None = None, space: str | int | None = None,
    ) -> RouteResponse:
        """``POST /v1/route``."""
        return await self._send(_Calls.route(prompt, k, threshold, candidates, space))

    async def sources(self, task_id: int, *, k: int = 5, candidates: int | None = None) -> SourcesResponse:
        """``GET /v1/tasks/{id}/sources``."""
        return await self._send(
            _Call("GET", f"/v1/tasks/{task_id}/sources", SourcesResponse, params={"k": k, "candidates": candidates})
        )

    async def align(self, a: int, b: int) -> AlignResponse:
        """``GET /v1/align``."""
        return await self._send(_Call("GET", "/v1/align", AlignResponse, params={"a": a, "b": b}))

    async def align_matrix(self, task_ids: Sequence[int]) -> AlignMatrixResponse:
        """``POST /v1/align/matrix``."""
        return await self._send(
            _Call("POST", "/v1/align/matrix", AlignMatrixResponse, json={"task_ids": list(task_ids)})
        )

    async def atlas(self, *, space: str | int | None = None) -> AtlasResponse:
        """``GET /v1/atlas``."""
        return await self._send(_Call("GET", "/v1/atlas", AtlasResponse, params={"space": space}))

    async def export_space(self, space: str | int | None = None) -> bytes:
        """``GET /v1/spaces/{id}/export``."""
        return await self._send(_Call("GET", f"/v1/spaces/{space if space is not None else 'default'}/export", None))

    async def import_space(self, file: bytes, *, on_conflict: str = "fail") -> ImportResult:
        """``POST /v1/spaces/import``."""
        call = _Call(
            "POST", "/v1/spaces/import", ImportResult, params={"on_conflict": on_conflict},
            files={"file": ("space.jsonl", file, "application/x-ndjson")},
        )
        return await self._send(call)
