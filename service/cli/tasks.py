"""Task, job and space commands: ``add``, ``append``, ``tasks list|show|update|delete``, ``jobs list|show|wait|cancel``,
``spaces list|show``."""

from __future__ import annotations

import json as jsonlib
from pathlib import Path
from typing import Annotated

import typer

from atlas.vocabulary import JobStatus, Mode, TaskStatus
from service.cli.common import (
    EXIT_JOB_FAILED,
    ApiKey,
    FileFormat,
    Json,
    ListSpace,
    Space,
    Timeout,
    Url,
    WaitTimeout,
    client,
    confirm,
    emit,
    fail,
    follow,
    json_object,
    sample_file,
    sample_notes,
    write_key,
)

app = typer.Typer()
tasks_app = typer.Typer(help="List, show, update and delete tasks.", no_args_is_help=True)
spaces_app = typer.Typer(help="List and show spaces (a model and sketch; --space takes an id or model name).",
                         no_args_is_help=True)
jobs_app = typer.Typer(help="List, show, follow and cancel jobs.", no_args_is_help=True)

FileArg = Annotated[Path, typer.Argument(help="JSONL, JSON, CSV, TSV, Parquet or plain text (one sample per line); "
                                              "gzipped too (.gz); - reads standard input (see --format).")]


@app.command()
def add(name: str, file: FileArg,
        mode: Annotated[Mode, typer.Option(help="text: every next token counts; completion: only completions.")]
        = Mode.TEXT,
        metadata: Annotated[str | None, typer.Option(help="Task metadata as a JSON object.")] = None,
        wait: Annotated[bool, typer.Option("--wait", help="Show progress until the job ends.")] = False,
        wait_timeout: WaitTimeout = None, file_format: FileFormat = None,
        url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
        json: Json = False) -> None:
    """Add a task from a file and (with --wait) follow its job to the end."""
    meta = json_object(metadata, "--metadata")
    upload, filename = sample_file(file, file_format)
    with client(url, api_key, timeout) as cl:
        created = cl.add_task(name, upload, mode=mode.value, metadata=meta, space=space, filename=filename,
                              idempotency_key=write_key())
        if not wait:
            emit(json, created, f"task {created.task.id} ({created.task.name}) created; job {created.job.id} "
                 f"{created.job.status}")
            return
        job = follow(cl, created.job.id, name, quiet=json, timeout=wait_timeout,
                     interrupted=created.model_dump(mode="json"))
        task = cl.get_task(created.task.id)
    emit(json, {"task": task.model_dump(mode="json"), "job": job.model_dump(mode="json")},
         f"task {task.id} ({task.name}): {task.status}, {task.n_samples} samples, {task.n_tokens} tokens; "
         f"job {job.id} {job.status}" + (f": {job.error}" if job.error else "") + sample_notes(job))
    if job.status != JobStatus.SUCCEEDED:
        raise typer.Exit(EXIT_JOB_FAILED)


@app.command()
def append(name: str, file: FileArg,
           wait: Annotated[bool, typer.Option("--wait", help="Show progress until the job ends.")] = False,
           wait_timeout: WaitTimeout = None, file_format: FileFormat = None,
           url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
           json: Json = False) -> None:
    """Append samples from a file to an existing task (the task's mode applies)."""
    upload, filename = sample_file(file, file_format)
    with client(url, api_key, timeout) as cl:
        task = cl.find_task(name, space=space)
        job = cl.append(task.id, upload, filename=filename, idempotency_key=write_key())
        if wait:
            job = follow(cl, job.id, name, quiet=json, timeout=wait_timeout,
                         interrupted={"job": job.model_dump(mode="json")})
    emit(json, job, f"job {job.id} ({job.kind} to task {task.id}, {task.name}): {job.status}"
         + (f": {job.error}" if job.error else "") + sample_notes(job))
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        raise typer.Exit(EXIT_JOB_FAILED)


@tasks_app.command("list")
def tasks_list(name_prefix: Annotated[str | None, typer.Option(help="Names starting with this.")] = None,
               status: Annotated[TaskStatus | None, typer.Option(help="Only this status.")] = None,
               limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
               offset: Annotated[int, typer.Option(min=0)] = 0,
               url: Url = None, api_key: ApiKey = None, space: ListSpace = None, timeout: Timeout = 120.0,
               json: Json = False) -> None:
    """List tasks, oldest first (of every space unless --space)."""
    with client(url, api_key, timeout) as cl:
        page = cl.list_tasks(space=space, name_prefix=name_prefix, status=status.value if status else None,
                             offset=offset, limit=limit)
    spaces = len({t.space_id for t in page.items}) > 1  # a space column where the page mixes spaces
    lines = [f"{'id':>6}  " + (f"{'space':>5}  " if spaces else "") + f"{'status':<8}  {'mode':<10}  {'samples':>8}  "
             f"{'tokens':>9}  name"]
    lines += [f"{t.id:>6}  " + (f"{t.space_id:>5}  " if spaces else "") + f"{t.status:<8}  {t.mode:<10}  "
              f"{t.n_samples:>8}  {t.n_tokens:>9}  {t.name}" for t in page.items]
    lines.append(f"{len(page.items)} of {page.total} tasks")
    emit(json, page, "\n".join(lines))


@tasks_app.command("show")
def tasks_show(name: str, url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
               json: Json = False) -> None:
    """Show one task (by name or id)."""
    with client(url, api_key, timeout) as cl:
        t = cl.find_task(name, space=space)
    emit(json, t, f"task {t.id} ({t.name}) in space {t.space_id}: {t.status}, mode {t.mode}, {t.n_samples} samples, "
         f"{t.n_tokens} tokens, version {t.version}; metadata {jsonlib.dumps(t.metadata, ensure_ascii=False)}")


@tasks_app.command("update")
def tasks_update(name: str,
                 metadata: Annotated[str | None, typer.Option(help="A JSON object merged into the task's metadata; a "
                                                                    "key set to null is removed.")] = None,
                 rename: Annotated[str | None, typer.Option("--rename", help="A new name for the task (unique in its "
                                                                              "space).")] = None,
                 url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
                 json: Json = False) -> None:
    """Rename a task or update its metadata (no model run): only REST and the client could update metadata, so a typo
    of ``add --metadata`` meant a new task (a parity review, 2026-12-07), and no surface could rename."""
    if metadata is None and rename is None:
        raise fail("give --metadata, --rename or both", 2)
    meta = json_object(metadata, "--metadata") if metadata is not None else None
    if metadata is not None and meta is None:
        raise fail("--metadata is a JSON object, such as '{\"owner\": \"me\"}' (a key set to null is removed)", 2)
    with client(url, api_key, timeout) as cl:
        t = cl.patch_task(cl.find_task(name, space=space).id, meta, name=rename)
    emit(json, t, f"task {t.id} ({t.name}): metadata {jsonlib.dumps(t.metadata, ensure_ascii=False)}")


@tasks_app.command("delete")
def tasks_delete(name: str, yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
                 url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
                 json: Json = False) -> None:
    """Delete a task (store and index)."""
    with client(url, api_key, timeout) as cl:
        t = cl.find_task(name, space=space)
        if not yes and not confirm(f"delete task {t.id} ({t.name})?"):
            raise fail("not deleted")
        cl.delete_task(t.id)
    emit(json, {"deleted": t.id}, f"deleted task {t.id} ({t.name})")


@jobs_app.command("list")
def jobs_list(task: Annotated[str | None, typer.Option(help="Only jobs of this task (name or id).")] = None,
              status: Annotated[JobStatus | None, typer.Option(help="Only this status.")] = None,
              limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
              offset: Annotated[int, typer.Option(min=0)] = 0, url: Url = None, api_key: ApiKey = None,
              space: ListSpace = None, timeout: Timeout = 120.0, json: Json = False) -> None:
    """List jobs, newest first (of every space unless --space; --task names a task of that space, default the
    service's)."""
    with client(url, api_key, timeout) as cl:
        task_id = cl.find_task(task, space=space).id if task is not None else None
        page = cl.list_jobs(task_id=task_id, status=status.value if status else None, space=space, limit=limit,
                            offset=offset)
    lines = [f"{'id':>6}  {'kind':<7}  {'status':<10}  {'task':>6}  progress"]
    lines += [f"{j.id:>6}  {j.kind:<7}  {j.status:<10}  {j.task_id or '-':>6}  "
              f"{j.progress.samples_done}/{j.progress.samples_total} samples, {j.progress.tokens:,} tokens"
              for j in page.items]
    lines.append(f"{len(page.items)} of {page.total} jobs")
    emit(json, page, "\n".join(lines))


@jobs_app.command("show")
def jobs_show(job_id: int, url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0,
              json: Json = False) -> None:
    """Show one job."""
    with client(url, api_key, timeout) as cl:
        j = cl.get_job(job_id)
    p = j.progress
    emit(json, j, f"job {j.id} ({j.kind}, task {j.task_id}): {j.status}; {p.samples_done}/{p.samples_total} "
         f"samples, {p.tokens_streamed:,} tokens streamed ({p.tokens_streamed_per_s:,.0f} tok/s), {p.tokens:,} "
         f"counted; attempts {j.attempts}"
         + (f"; error: {j.error}" if j.error else "") + sample_notes(j))


@jobs_app.command("wait")
def jobs_wait(job_id: int, wait_timeout: WaitTimeout = None, url: Url = None, api_key: ApiKey = None,
              timeout: Timeout = 120.0, json: Json = False) -> None:
    """Follow a job to its end (one whose --wait was interrupted, or added without it); exit 4 when it failed or was
    cancelled."""
    with client(url, api_key, timeout) as cl:
        first = cl.get_job(job_id)  # a job that does not exist is a 404 (exit 1), not "deleted while it ran"
        job = follow(cl, job_id, f"job {job_id}", quiet=json, timeout=wait_timeout,
                     interrupted={"job": first.model_dump(mode="json")})
    emit(json, job, f"job {job.id} ({job.kind}, task {job.task_id}): {job.status}"
         + (f": {job.error}" if job.error else "") + sample_notes(job))
    if job.status != JobStatus.SUCCEEDED:
        raise typer.Exit(EXIT_JOB_FAILED)


@jobs_app.command("cancel")
def jobs_cancel(job_id: int, url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0,
                json: Json = False) -> None:
    """Cancel a queued job, or ask a running one to stop at its next batch."""
    with client(url, api_key, timeout) as cl:
        j = cl.cancel_job(job_id)
    ended = j.status in ("succeeded", "failed", "cancelled") and not j.cancel_requested
    emit(json, j, f"job {j.id}: {j.status}" + (" (cancel requested)" if j.cancel_requested else "")
         + (" (it had already ended: nothing to cancel)" if ended and j.status != "cancelled" else ""))


@spaces_app.command("list")
def spaces_list(url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0, json: Json = False) -> None:
    """List the spaces: what ``--space`` takes (nothing in the CLI listed them: a parity review, 2026-12-07)."""
    with client(url, api_key, timeout) as cl:
        found = cl.spaces()
    lines = [f"{'id':>4}  {'tasks':>6}  {'m':>6}  model"]
    lines += [f"{s.id:>4}  {s.n_tasks or 0:>6}  {s.m:>6}  {s.model_name}" + ("  (default)" if s.default else "")
              for s in found.items]
    emit(json, found, "\n".join(lines))


@spaces_app.command("show")
def spaces_show(space: Annotated[str, typer.Argument(help="Space id or model name (default: the service's).")]
                = "default", url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0,
                json: Json = False) -> None:
    """Show one space: its model, fingerprints and sketch."""
    with client(url, api_key, timeout) as cl:
        s = cl.get_space(space)
    emit(json, s, f"space {s.id}{' (default)' if s.default else ''}: model {s.model_name} ({s.model_fingerprint}), "
         f"d {s.d}, K {s.K}, sketch m {s.m}, seed {s.seed}; {s.n_tasks or 0} tasks")
