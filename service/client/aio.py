"""The client, defined once: :class:`AsyncAtlasClient` (the sync :class:`~service.client.AtlasClient` runs
these same coroutines on a private event loop).

Reads (GETs and the read-only POSTs) are retried with tenacity on connection errors, 429, 502, 503 and 504,
honouring ``Retry-After``; so are ``add_task`` and ``append``, which carry an ``Idempotency-Key`` (a fresh one per
call unless given; the service answers a repeat with the first request's task and job), while other writes are never
retried. Job progress is followed over server-sent events (httpx-sse), with polling as the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx
from httpx_sse import aconnect_sse

from atlas.route_fit import FIT_EXAMPLE_FORM, fit_examples
from service.client import calls
from service.client.calls import Call, FileArg, JobWatch, ProgressCallback, SampleArg, id_list, path_id
from service.client.errors import (
    AtlasClientError,
    ClientClosed,
    CreatedButNotDone,
    InvalidInput,
    Unavailable,
    Unreachable,
)
from service.client.exports import import_source, write_export
from service.client.retry import send_with_retries
from service.schemas import (
    AlignMatrixResponse,
    AlignResponse,
    AtlasResponse,
    Health,
    ImportResult,
    JobList,
    JobOut,
    Readiness,
    SourcesResponse,
    SpaceList,
    SpaceOut,
    TaskCreated,
    TaskList,
    TaskOut,
)
from service.schemas_keys import CurrentKey, KeyCreated, KeyList
from service.schemas_routing import FitResponse, RouteResponse, RoutingInfo

FINAL_POLL_S = 5.0
"""Time a ``wait_job`` poll past its deadline still has to answer (it says whether the job has ended)."""
STREAM_READ_TIMEOUT_S = 60.0
"""Longest silence of a progress stream before it counts as lost (the service pings every 15 s)."""


class AsyncAtlasClient:
    """Typed client of the FisherAtlas REST API (asyncio).

    Parameters
    ----------
    base_url
        Service URL (default ``$FISHER_ATLAS_URL`` or ``http://127.0.0.1:8000``).
    api_key
        Sent as ``X-API-Key`` (default ``$FISHER_ATLAS_API_KEY``).
    timeout
        Seconds each network operation may take (connect, each read: httpx's timeout; default
        ``$FISHER_ATLAS_TIMEOUT`` or 60); ``wait_job`` has its own.
    retries
        Attempts of a read, or of a write with an idempotency key (``add_task`` and ``append`` send one unless told
        not to), on connection errors, 429, 502, 503 and 504 (1: no retry).
    transport, limits
        Optional httpx transport (e.g. ``httpx.ASGITransport``) and pool limits.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float | None = None,
                 retries: int = 3, transport: httpx.AsyncBaseTransport | None = None,
                 limits: httpx.Limits | None = None) -> None:
        self.base_url = (base_url or os.environ.get("FISHER_ATLAS_URL") or calls.DEFAULT_URL).rstrip("/")
        calls.check_url(self.base_url)
        self.api_key = api_key if api_key is not None else os.environ.get("FISHER_ATLAS_API_KEY")
        if self.api_key is not None and not (self.api_key.isascii() and self.api_key.isprintable()
                                             and self.api_key.strip() == self.api_key):
            raise InvalidInput(0, "invalid_api_key", "the API key holds whitespace or characters no header can carry "
                               "(a key read from a file with its line break?)")
        self.retries = max(1, retries)
        headers = {"X-API-Key": self.api_key} if self.api_key else {}
        self._pool_settings: dict[str, Any] = dict(
            base_url=self.base_url, headers=headers, timeout=calls.resolve_timeout(timeout), transport=transport,
            limits=limits or httpx.Limits(max_connections=100, max_keepalive_connections=100))
        self._http = httpx.AsyncClient(**self._pool_settings)
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self._ended = False

    def _pool(self) -> httpx.AsyncClient:
        """The connection pool, for the running event loop. A client used again after the loop it last ran on has
        ended (``asyncio.run`` a notebook cell, each its own loop) gets a fresh pool: the old one's connections ended
        with their loop, and reusing them raised a bare ``RuntimeError: Event loop is closed``. Used from a second
        loop while the first still runs (another thread), it refuses with an :class:`AtlasClientError` saying so. A
        ``transport`` given to the client is the caller's to make per loop (its connections are reused as they are).
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        if self._http_loop is not None and self._http_loop is not loop:
            if self._http_loop.is_running():  # a loop stopped but not closed has ended as well
                raise AtlasClientError(0, "wrong_event_loop", "this AsyncAtlasClient is in use on another event loop "
                                       "that still runs: make one client per event loop (or use the blocking "
                                       "AtlasClient, which runs its own)")
            self._http = httpx.AsyncClient(**self._pool_settings)
        self._http_loop = loop
        return self._http

    async def __aenter__(self) -> AsyncAtlasClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool: on the loop it last ran on when that loop still runs in another thread; once
        that loop has ended its connections ended with it, and the client is only marked closed."""
        self._ended = True
        old = self._http_loop
        if old is None or old is asyncio.get_running_loop():
            await self._http.aclose()
        elif old.is_running():
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._http.aclose(), old))

    def _unreachable(self, exc: httpx.RequestError) -> AtlasClientError:
        """The client's error for a failed request: :class:`Unreachable` for a transport failure (code ``timed_out``
        when connected and no answer came in time; a read timeout's text is empty: its type is named),
        ``unexpected_answer`` for an answer httpx could not read (a body that is not the encoding it claims, endless
        redirects); secrets in the URL masked."""
        from atlas.redaction import redact_secrets

        said = redact_secrets(f"{self.base_url}: {str(exc) or type(exc).__name__}")
        if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):  # connected: the service is there, and slow
            return Unreachable(0, "timed_out", f"{said} (no answer within the client's timeout)")
        if isinstance(exc, httpx.TransportError):
            return Unreachable(0, "unreachable", said)
        return AtlasClientError(0, "unexpected_answer", f"{said} (not an answer the client can read)")

    def _check_open(self) -> None:
        if self._ended or self._http.is_closed:  # a closed client's calls: say so, not httpx's RuntimeError
            raise ClientClosed(0, "client_closed", "the client is closed (close() or its with block); make a new one")

    async def _once(self, call: Call[Any]) -> Any:
        self._check_open()
        try:
            resp = await self._pool().request(call.method, call.path, **call.kwargs())
        except httpx.RequestError as exc:
            raise self._unreachable(exc) from exc
        except (ValueError, TypeError) as exc:  # NaN or a set in a JSON body: the caller's input, said as such
            why = ("a number in it is NaN or infinite (give finite numbers: a threshold is in [-1, 1], a "
                   "false-reject rate in (0, 0.5])" if "Out of range float" in str(exc) else str(exc))
            raise InvalidInput(0, "invalid_input", f"the request cannot be sent as JSON: {why}") from None
        return calls.parse(call, resp)

    async def _send(self, call: Call[Any]) -> Any:
        try:
            return await send_with_retries(self._once, call, self.retries)
        finally:
            call.close()  # a path's upload, streamed from the file it opened

    async def health(self) -> Health:
        """``GET /healthz``."""
        return await self._send(Call("GET", "/healthz", Health))

    async def ready(self) -> Readiness:
        """``GET /readyz`` (a 503 carries the same body: returned, not raised)."""
        self._check_open()
        try:
            resp = await self._pool().get("/readyz")
        except httpx.RequestError as exc:
            raise self._unreachable(exc) from exc
        if resp.status_code not in (200, 503):
            calls.raise_for(resp)
        return calls.decode(Call("GET", "/readyz", Readiness), resp)

    # -- tasks -------------------------------------------------------------------------------------

    async def add_task(self, name: str, file: FileArg = None, *, samples: Iterable[SampleArg] | None = None,
                       mode: str = "text", metadata: dict[str, Any] | None = None, space: str | int | None = None,
                       filename: str | None = None, wait: bool = False, on_progress: ProgressCallback | None = None,
                       wait_timeout: float | None = None, idempotency_key: str | None = None) -> TaskCreated:
        """``POST /v1/tasks`` from a file path / bytes (``file``) or records (``samples``); with ``wait``
        the job is followed until it ends (``on_progress`` sees every update). The call carries an
        ``Idempotency-Key`` (``idempotency_key``, else a fresh one; ``""`` sends none), so it is sent again safely —
        this client does so on a failed connection, 429, 502, 503 and 504, as for a read: the service answers the
        first one's task and job. Give your own key to make your own retries of the call safe too."""
        created: TaskCreated = await self._send(calls.add_task(name, file, samples, mode, metadata, space, filename,
                                                               idempotency_key))
        if not wait:
            return created
        try:
            job = await self.wait_job(created.job.id, on_progress=on_progress, timeout=wait_timeout)
        except TimeoutError as exc:  # the created task was lost with the wait (the message named the job alone)
            raise CreatedButNotDone(f"task {created.task.id} ({created.task.name!r}) was created; {exc}",
                                    created) from exc
        return TaskCreated(task=await self.get_task(created.task.id), job=job)

    async def append(self, task_id: int, file: FileArg = None, *, samples: Iterable[SampleArg] | None = None,
                     filename: str | None = None, wait: bool = False, on_progress: ProgressCallback | None = None,
                     wait_timeout: float | None = None, idempotency_key: str | None = None) -> JobOut:
        """``POST /v1/tasks/{id}/samples``; the job (final with ``wait``). The call carries an ``Idempotency-Key``
        (``idempotency_key``, else a fresh one; ``""`` sends none), so it is sent again safely (this client does so
        on a failed connection, 429, 502, 503 and 504): the samples are appended once."""
        accepted = await self._send(calls.append(task_id, file, samples, filename, idempotency_key))
        if not wait:
            return accepted.job  # type: ignore[no-any-return]
        return await self.wait_job(accepted.job.id, on_progress=on_progress, timeout=wait_timeout)

    async def get_task(self, task_id: int) -> TaskOut:
        """``GET /v1/tasks/{id}``."""
        return await self._send(Call("GET", f"/v1/tasks/{path_id(task_id, 'task id')}", TaskOut))

    async def list_tasks(self, *, space: str | int | None = None, name: str | None = None,
                         name_prefix: str | None = None, status: str | None = None, offset: int = 0,
                         limit: int = 50, ids: Sequence[int] | None = None) -> TaskList:
        """``GET /v1/tasks`` with filters (``ids``: only these tasks, at most 1,000; ``[]``: none) and pagination."""
        if ids is not None and not (ids := [int(i) for i in ids]):  # httpx sends no parameter for []: every task
            return TaskList(items=[], total=0, offset=offset, limit=limit)
        params = {"space": space, "name": name, "name_prefix": name_prefix, "status": status, "offset": offset,
                  "limit": limit, "id": ids}
        return await self._send(Call("GET", "/v1/tasks", TaskList, params=params))

    async def find_task(self, name_or_id: str | int, *, space: str | int | None = None) -> TaskOut:
        """A task by exact name (in ``space``, default the service's) or by numeric id (of ``space`` when given: an
        id of another space is not found, as a name of another space is not)."""
        from service.client.errors import NotFound

        if isinstance(name_or_id, str):
            found = (await self.list_tasks(space=space, name=name_or_id, limit=1)).items
            if found:
                return found[0]
            if not (name_or_id.isascii() and name_or_id.isdigit()):
                raise NotFound(404, "not_found", f"no task named {name_or_id!r}")
        task = await self.get_task(int(name_or_id))
        if space is not None and not any(t.id == task.id for t in
                                         (await self.list_tasks(space=space, name=task.name, limit=1)).items):
            raise NotFound(404, "not_found", f"task {task.id} is not in space {space!r}")
        return task

    async def patch_task(self, task_id: int, metadata: dict[str, Any] | None = None, *, name: str | None = None
                         ) -> TaskOut:
        """``PATCH /v1/tasks/{id}``: rename the task (``name``) and/or merge ``metadata`` (``None`` removes a key)."""
        body = {k: v for k, v in (("name", name), ("metadata", metadata)) if v is not None}
        return await self._send(Call("PATCH", f"/v1/tasks/{path_id(task_id, 'task id')}", TaskOut, json=body))

    async def delete_task(self, task_id: int) -> None:
        """``DELETE /v1/tasks/{id}``."""
        await self._send(Call("DELETE", f"/v1/tasks/{path_id(task_id, 'task id')}", None))

    # -- jobs --------------------------------------------------------------------------------------

    async def get_job(self, job_id: int) -> JobOut:
        """``GET /v1/jobs/{id}``."""
        return await self._send(Call("GET", f"/v1/jobs/{path_id(job_id, 'job id')}", JobOut))

    async def list_jobs(self, *, task_id: int | None = None, status: str | None = None,
                        space: str | int | None = None, offset: int = 0, limit: int = 50) -> JobList:
        """``GET /v1/jobs``, newest first (``space``: id or name; default every space)."""
        params = {"task_id": task_id, "status": status, "space": space, "offset": offset, "limit": limit}
        return await self._send(Call("GET", "/v1/jobs", JobList, params=params))

    async def cancel_job(self, job_id: int) -> JobOut:
        """``POST /v1/jobs/{id}/cancel``."""
        return await self._send(Call("POST", f"/v1/jobs/{path_id(job_id, 'job id')}/cancel", JobOut))

    async def job_events(self, job_id: int) -> AsyncIterator[JobOut]:
        """The job's server-sent ``progress`` events until it ends (a stream silent for ``STREAM_READ_TIMEOUT_S``,
        four of the service's keep-alive pings, is :class:`Unreachable`: a hung service held it forever)."""
        self._check_open()
        try:
            async with aconnect_sse(self._pool(), "GET", f"/v1/jobs/{path_id(job_id, 'job id')}/events",
                                    timeout=httpx.Timeout(30.0, read=STREAM_READ_TIMEOUT_S)) as source:
                if source.response.status_code >= 400:
                    await source.response.aread()
                    calls.raise_for(source.response)
                async for event in source.aiter_sse():
                    if event.event == "progress":
                        try:
                            job = JobOut.model_validate_json(event.data)
                        except ValueError:  # pydantic's ValidationError: another server, or another version
                            raise calls.unexpected(source.response, "a progress event is not a job") from None
                        yield job
        except httpx.RequestError as exc:
            raise self._unreachable(exc) from exc

    async def wait_job(self, job_id: int, *, on_progress: ProgressCallback | None = None,
                       timeout: float | None = None, poll_interval: float = 0.5) -> JobOut:
        """Follow a job (progress stream, polling as fallback) until it ends; its final state."""
        watch = JobWatch(on_progress, timeout)
        try:  # a quiet stream (keep-alive pings only) must not outlast the deadline
            async with asyncio.timeout(watch.remaining()):
                async for job in self.job_events(job_id):
                    if watch.done(job) or watch.expired():
                        break
        except TimeoutError:
            pass  # the poll below reports the job, and raises TimeoutError unless it has ended
        except AtlasClientError as exc:
            watch.stream_failed(exc)
        while not watch.finished:
            try:  # each poll within the deadline too (its retries took three request timeouts past it), the one past
                # it given FINAL_POLL_S (a timeout of 0 reported a finished job as still running)
                remaining = watch.remaining()
                async with asyncio.timeout(None if remaining is None else max(remaining, FINAL_POLL_S)):
                    job = await self.get_job(job_id)
            except TimeoutError:
                raise TimeoutError(f"job {job_id}: still running when the {timeout} s wait ended (the service did "
                                   "not answer in time)") from None
            except (Unreachable, Unavailable) as exc:  # a restarting replica: the job goes on meanwhile
                watch.lost(exc, job_id)
                await asyncio.sleep(poll_interval)
                continue
            if watch.polled(job):
                break
            await asyncio.sleep(poll_interval)
        return watch.result()

    # -- queries -----------------------------------------------------------------------------------

    async def route(self, prompt: str | Sequence[str], *, k: int = 5, threshold: float | None = None,
                    candidates: int | None = None, space: str | int | None = None) -> RouteResponse:
        """``POST /v1/route`` for one prompt (``str``) or a batch (a sequence): for a batch, ``.results[i]`` answers
        ``prompt[i]`` (the top-level fields answer the first prompt; the library's ``Atlas.route`` of a list returns
        the list of answers itself)."""
        return await self._send(calls.route(prompt, k, threshold, candidates, space))

    async def fit(self, examples: Sequence[tuple[str, str | int] | Mapping[str, Any]], *,
                  space: str | int | None = None, dry_run: bool = False) -> FitResponse:
        """``POST /v1/route/fit``: tune route thresholds from ``(prompt, label)`` pairs or ``{"prompt", "label"}``
        mappings (the labels file's lines; label: a task name, a task id, or ``"none"``). An example of neither form
        raises :class:`InvalidInput` before anything is sent."""
        try:
            pairs, bad = fit_examples(examples)
        except TypeError as exc:
            raise InvalidInput(0, "invalid_input", str(exc)) from None
        if bad is not None:
            raise InvalidInput(0, "invalid_input", f"example {bad}: {FIT_EXAMPLE_FORM}", {"example": bad})
        body: dict[str, Any] = {"examples": [{"prompt": p, "label": lab} for p, lab in pairs], "dry_run": dry_run}
        if space is not None:
            body["space"] = str(space)
        return await self._send(Call("POST", "/v1/route/fit", FitResponse, json=body))

    async def routing(self, task_id: int) -> RoutingInfo:
        """``GET /v1/tasks/{id}/routing``: the task's effective route threshold and its calibration."""
        return await self._send(Call("GET", f"/v1/tasks/{path_id(task_id, 'task id')}/routing", RoutingInfo))

    async def set_threshold(self, task_id: int, threshold: float | None) -> RoutingInfo:
        """``PATCH /v1/tasks/{id}/routing``: override the task's route threshold (``None`` clears it)."""
        if threshold is not None:
            threshold = calls.real_number(threshold, "a threshold")
        return await self.patch_routing(task_id, threshold=threshold)

    async def patch_routing(self, task_id: int, **fields: Any) -> RoutingInfo:
        """``PATCH /v1/tasks/{id}/routing`` with any of ``threshold`` (``None`` clears the override),
        ``false_reject_rate``, ``template`` and ``novelty``; fields not given are left as they are."""
        path = f"/v1/tasks/{path_id(task_id, 'task id')}/routing"
        return await self._send(Call("PATCH", path, RoutingInfo, json=fields))

    async def set_false_reject_rate(self, task_id: int, rate: float) -> RoutingInfo:
        """``PATCH /v1/tasks/{id}/routing``: re-calibrate the task's route threshold at another false-reject rate
        (the share of its own prompts answered "none"; default 0.05)."""
        return await self.patch_routing(task_id, false_reject_rate=calls.real_number(rate, "a false-reject rate"))

    async def set_template_test(self, task_id: int, enabled: bool) -> RoutingInfo:
        """``PATCH /v1/tasks/{id}/routing``: turn the task's template test on or off (docs/SCORES.md)."""
        return await self.patch_routing(task_id, template=bool(enabled))

    async def set_novelty_test(self, task_id: int, enabled: bool) -> RoutingInfo:
        """``PATCH /v1/tasks/{id}/routing``: turn the task's novelty test on or off (docs/SCORES.md)."""
        return await self.patch_routing(task_id, novelty=bool(enabled))

    async def sources(self, task_id: int, *, k: int = 5, candidates: int | None = None) -> SourcesResponse:
        """``GET /v1/tasks/{id}/sources``: recommended fine-tuning sources."""
        return await self._send(Call("GET", f"/v1/tasks/{path_id(task_id, 'task id')}/sources", SourcesResponse,
                                     params={"k": k, "candidates": candidates}))

    async def align(self, a: int, b: int) -> AlignResponse:
        """``GET /v1/align?a=&b=`` (``a`` and ``b`` task ids, checked before sending as a path's are)."""
        return await self._send(Call("GET", "/v1/align", AlignResponse,
                                     params={"a": path_id(a, "task id"), "b": path_id(b, "task id")}))

    async def align_matrix(self, task_ids: Sequence[int]) -> AlignMatrixResponse:
        """``POST /v1/align/matrix`` (``task_ids`` a sequence of task ids, in the matrix's order, checked before
        sending: a set or a mapping has no order to keep)."""
        return await self._send(Call("POST", "/v1/align/matrix", AlignMatrixResponse,
                                     json={"task_ids": id_list(task_ids, "task id")}))

    async def atlas(self, *, space: str | int | None = None) -> AtlasResponse:
        """``GET /v1/atlas``: the 2-D map of a space."""
        return await self._send(Call("GET", "/v1/atlas", AtlasResponse, params={"space": space}))

    # -- spaces ------------------------------------------------------------------------------------

    async def spaces(self) -> SpaceList:
        """``GET /v1/spaces``."""
        return await self._send(Call("GET", "/v1/spaces", SpaceList))

    async def get_space(self, space: str | int = "default") -> SpaceOut:
        """``GET /v1/spaces/{id}``."""
        return await self._send(Call("GET", f"/v1/spaces/{quote(str(space), safe='')}", SpaceOut))

    async def export_space(self, space: str | int | None = None, out: str | os.PathLike[str] | None = None) -> bytes:
        """``GET /v1/spaces/{id}/export`` (``default`` when ``space`` is None); optionally written to ``out``."""
        if out is None and (isinstance(space, os.PathLike) or (
                isinstance(space, str) and space.lower().endswith((".jsonl", ".json", ".gz", ".ndjson")))):
            raise TypeError(f"export_space(space=None, out=None): {str(space)!r} looks like a file; the first "
                            f"argument is the space (id or name): write the export with out={str(space)!r}")
        ref = quote(str(space if space is not None else "default"), safe="")  # a model name may hold slashes
        blob: bytes = await self._send(Call("GET", f"/v1/spaces/{ref}/export", None))
        try:  # another server's page at the URL, say, or a body cut off
            check = calls.ExportCheck()
            check.feed(blob)
            check.finish()
        except ValueError as exc:
            raise AtlasClientError(200, "unexpected_answer", f"GET /v1/spaces/{ref}/export: not a whole export: "
                                   f"{exc}") from None
        if out is not None:
            Path(os.fspath(out)).write_bytes(blob)
        return blob

    async def download_export(self, out: str | os.PathLike[str] | BinaryIO, space: str | int | None = None) -> int:
        """``GET /v1/spaces/{id}/export`` streamed into ``out``; returns the export's bytes (before a ``.gz`` path's
        compression). Unlike :meth:`export_space`, the export is never held in memory (an export may be as large as
        the service's ``max_import_bytes``, 1 GiB by default).

        ``out`` is a path or a writable binary file, written as :func:`service.client.exports.write_export` says (a
        path whole or not at all; ``/dev/stdout`` and descriptors in place; ``*.gz`` gzipped). An answer that is not
        a whole export
        (another server at the URL, a body cut off: ``calls.ExportCheck``) is :class:`AtlasClientError`
        ``unexpected_answer``; a path written through a temporary file is then left as it was
        (:func:`service.client.exports.write_export`)."""
        self._check_open()
        ref = quote(str(space if space is not None else "default"), safe="")
        return await write_export(out, lambda stream: self._stream_export(ref, stream))

    async def _stream_export(self, ref: str, stream: BinaryIO) -> int:
        """Write the export of space ``ref`` into ``stream`` as it arrives, once its first bytes show it is one;
        the bytes written."""
        written = 0
        check = calls.ExportCheck()
        try:
            async with self._pool().stream("GET", f"/v1/spaces/{ref}/export") as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    calls.raise_for(resp)
                try:
                    async for chunk in resp.aiter_bytes():
                        check.feed(chunk)
                        written += stream.write(chunk)
                    check.finish()
                except ValueError as exc:
                    raise calls.unexpected(resp, f"not a whole export: {exc}") from None
        except httpx.RequestError as exc:
            raise self._unreachable(exc) from exc
        stream.flush()
        return written

    async def import_space(self, file: str | os.PathLike[str] | bytes | BinaryIO, *,
                           on_conflict: str = "fail") -> ImportResult:
        """``POST /v1/spaces/import`` of a file written by :meth:`export_space` (a path is streamed from disk, not
        read into memory: an export may be up to the service's ``max_import_bytes``, 1 GiB by default); a pipe, an
        open binary stream or a gzipped export as :func:`service.client.exports.import_source` sends it."""
        with contextlib.ExitStack() as stack:  # a pipe copied, a gzipped export decompressed: off the event loop
            data = await asyncio.to_thread(stack.enter_context, import_source(file))
            return await self._import(data, on_conflict)

    async def _import(self, data: bytes | BinaryIO, on_conflict: str) -> ImportResult:
        return await self._send(Call("POST", "/v1/spaces/import", ImportResult, params={"on_conflict": on_conflict},
                                     files={"file": ("space.jsonl", data, "application/x-ndjson")}))

    # -- keys ---------------------------------------------------------------------------------------

    async def current_key(self) -> CurrentKey:
        """``GET /v1/keys/current`` (any key): the calling key's ``key_id``, ``name`` and ``scopes`` (``key_id``
        null and every scope when the service asks no key)."""
        return await self._send(Call("GET", "/v1/keys/current", CurrentKey))

    async def create_key(self, name: str, scopes: Sequence[str] | str = ("read",)) -> KeyCreated:
        """``POST /v1/keys`` (admin): the new key, its plaintext shown this once (``scopes``: a list, or one string
        ``"read,write"`` as the CLI takes it; ``"read"`` was sent as four scopes, one a letter)."""
        wanted = [w.strip() for w in scopes.split(",") if w.strip()] if isinstance(scopes, str) else list(scopes)
        return await self._send(Call("POST", "/v1/keys", KeyCreated, json={"name": name, "scopes": wanted}))

    async def list_keys(self, *, include_revoked: bool = False) -> KeyList:
        """``GET /v1/keys`` (admin): the active keys (and revoked ones with ``include_revoked``), never their
        plaintext."""
        params = {"include_revoked": "true"} if include_revoked else {}
        return await self._send(Call("GET", "/v1/keys", KeyList, params=params))

    async def revoke_key(self, key_id: int) -> None:
        """``DELETE /v1/keys/{id}`` (admin)."""
        await self._send(Call("DELETE", f"/v1/keys/{path_id(key_id, 'key id')}", None))
