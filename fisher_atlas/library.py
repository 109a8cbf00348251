"""Library mode: :class:`Atlas` opens a data directory in-process (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, overload

from pydantic import ValidationError

from atlas import analysis
from atlas.errors import AtlasError, InvalidInput, ModelUnavailable, NotFound, PayloadTooLarge
from atlas.repository import check_mode
from atlas.route_fit import FIT_EXAMPLE_FORM, fit_examples, prompt_batch
from atlas.sample_io import SampleLimits, parse_upload
from atlas.samples import Sample, record_to_sample
from atlas.services.jobs import is_final
from atlas.services.thresholds import FitResult
from atlas.settings import Settings
from atlas.vocabulary import MATRIX_DEFAULT_TASKS, JobStatus, TaskStatus
from service.container import Container
from service.schemas import MAX_ID, JobOut, TaskOut
from service.schemas_routing import RoutingInfo
from service.views import job_out, task_out
from workers.extraction_results import sample_notes

log = logging.getLogger(__name__)

SampleLike = str | dict[str, Any] | Sample


class AtlasClosed(AtlasError):
    """The :class:`Atlas` was closed (503 in HTTP terms: the store is not open)."""

    status_code = 503
    code = "closed"


def _is_file(path: str | Path) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long for the OS, a NUL: not a file
        return False


def _samples(samples: str | Path | Iterable[SampleLike], mode: str, limits: SampleLimits) -> list[Sample]:
    """Samples from a file path (JSONL, CSV, Parquet, text) or from texts / dicts / ``Sample``s, validated for
    ``mode`` as an upload is (:class:`InvalidInput` naming the sample, as REST answers 422); a file within the
    service's ``limits``, as an upload."""
    check_mode(mode)
    if (isinstance(samples, bytes | bytearray | Mapping | set | frozenset)
            or not isinstance(samples, str | Path | Iterable)):  # a dict was read by its keys, a set in no order
        raise InvalidInput(f"samples are a file path or a list of texts, dicts or Samples, not "
                           f"{type(samples).__name__}")
    if isinstance(samples, str | Path):
        if not _is_file(samples):
            raise InvalidInput(f"no such file: {str(samples)[:200]!r} (give a file path, or a list of samples)")
        path = Path(samples)
        size = path.stat().st_size
        if size > limits.max_bytes:  # before reading it: a file of gigabytes was read whole, then refused
            raise PayloadTooLarge(f"{path.name} has {size} bytes; the upload limit is {limits.max_bytes} (setting "
                                  "max_upload_bytes)", {"bytes": size, "max_upload_bytes": limits.max_bytes})
        return parse_upload(path.read_bytes(), path.name, mode, limits)  # type: ignore[arg-type]
    out = []
    for i, s in enumerate(samples):
        if isinstance(s, Sample):
            record: object = s.model_dump(exclude_none=True)
        elif isinstance(s, str):
            record = {"text": s}
        else:
            record = s
        out.append(record_to_sample(record, mode, f"sample {i}"))  # type: ignore[arg-type]
    return out


class Atlas:
    """A FisherAtlas store opened in this process.

    Parameters
    ----------
    path : str or Path
        The data directory (SQLite file and FAISS files), the same one ``fisher-atlas serve --data-dir``
        uses.
    require_model : bool, default True
        Raise :class:`~atlas.errors.ModelUnavailable` at once when the model cannot be loaded. ``False`` opens the
        store anyway, to list, align, recommend, plot, export or import without a model (an offline machine, a
        copied data directory); adding, appending and routing then raise it, saying why.
    **settings
        Any :class:`atlas.settings.Settings` field (``model``, ``sketch_dim``, ``device``, ...); the
        environment's ``FISHER_ATLAS_*`` variables apply too.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, path: str | Path = "./fisher-atlas-data", *, require_model: bool = True,
                 **settings: Any) -> None:
        if "data_dir" in settings:
            raise InvalidInput("pass the data directory as the first argument, Atlas(path), not data_dir=")
        unknown = sorted(set(settings) - set(Settings.model_fields))
        if unknown:  # Settings ignores extra fields: a misspelt one would silently keep its default
            raise InvalidInput(f"unknown setting(s) {unknown}; see atlas.settings.Settings", {"unknown": unknown})
        if Path(path).exists() and not Path(path).is_dir():  # FileExistsError once the data directory was made
            raise InvalidInput(f"{path} is a file, not a data directory: pass a directory (made if absent)")
        try:
            self.settings = Settings(data_dir=Path(path), **settings)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            raise InvalidInput(f"invalid setting {where}: {first.get('msg', '')}", {"setting": where}) from None
        self._limits = SampleLimits.from_settings(self.settings)  # what a file may hold, as an upload
        self._closed = False
        self._container = container = Container(self.settings).start()
        # an Atlas dropped unclosed (re-run in a notebook) kept its threads, files and ~50 MB for good: closed when
        # collected, with a ResourceWarning as an unclosed file gives
        self._finalizer = weakref.finalize(self, _close_unclosed, container, str(self.settings.data_dir))
        if require_model and container.lm is None and self.settings.resolved_prompt_service() == "inprocess":
            self.close()  # every add and route would fail: said now, with the reason
            raise ModelUnavailable(f"the model {self.settings.model!r} cannot be loaded: "
                                   f"{container.model_error or 'unknown reason'}", {"model": self.settings.model})

    @property
    def _c(self) -> Container:
        if self._closed:  # its runner is stopped: a job queued now would never run (add() waited forever)
            raise AtlasClosed("this Atlas is closed; open a new Atlas(path)")
        return self._container

    def __enter__(self) -> Atlas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish running jobs' current batch, persist the index and close the store (once; later calls of
        any method raise :class:`AtlasClosed`)."""
        if not self._closed:
            self._closed = True
            self._finalizer.detach()
            self._container.stop()

    # -- tasks -----------------------------------------------------------------------------------

    def add(self, name: str, samples: str | Path | Iterable[SampleLike], *, mode: str = "text",
            metadata: dict[str, Any] | None = None, wait: bool = True,
            progress: bool | Callable[[JobOut], None] | None = True) -> TaskOut:
        """Add a task from a file or samples; with ``wait`` (default) return once its signature is stored.

        ``progress``: ``True`` shows a progress bar (rich, on stderr when it is a terminal), ``False`` none, or a
        callable receiving the job (as the client's ``JobOut``) as it runs.
        """
        _check_name(name)
        _check_progress(progress)
        task, job = self._c.tasks.create(name, mode, metadata, _samples(samples, mode, self._limits))
        if wait:
            self._wait(job.id, progress, f"add {name}")
            task = self._c.tasks.get(task.id)
        return task_out(task)

    def append(self, name: str, samples: str | Path | Iterable[SampleLike], *, wait: bool = True,
               progress: bool | Callable[[JobOut], None] | None = True) -> TaskOut:
        """Append samples to a task (its mode applies); with ``wait``, return once merged."""
        _check_progress(progress)
        task_id, mode = self._find(name)
        job = self._c.tasks.append(task_id, _samples(samples, mode, self._limits))
        if wait:
            self._wait(job.id, progress, f"append {name}")
        return task_out(self._c.tasks.get(task_id))

    def task(self, name: str) -> TaskOut:
        """A task by name (the fields the REST API and the client give: ``id``, ``name``, ``mode``, ``status``,
        ``metadata``, counts, times)."""
        return task_out(self._task_row(name))

    def _task_row(self, name: str) -> Any:
        _check_name(name)
        return self._c.tasks.find(name)

    def _find(self, name: str) -> tuple[int, str]:
        """A task's id and mode by name."""
        row = self._task_row(name)
        return int(row.id), str(row.mode)

    def tasks(self) -> list[TaskOut]:
        """Every task, oldest first."""
        return [task_out(t) for t in self._all_tasks()]

    def _all_tasks(self, bound: int | None = None, **filters: Any) -> list[Any]:
        """Tasks matching ``filters`` (:meth:`TaskService.page`'s), oldest first, at most ``bound``: read in pages
        of at most 1,000 (the page limit)."""
        out: list[Any] = []
        while bound is None or len(out) < bound:
            page = self._c.tasks.page(offset=len(out), limit=1000 if bound is None else min(1000, bound - len(out)),
                                      **filters)
            out.extend(page.items)
            if len(out) >= page.total or not page.items:
                break
        return out

    def delete(self, name: str) -> None:
        """Delete a task."""
        self._c.tasks.delete(self._find(name)[0])

    def update(self, name: str, *, metadata: dict[str, Any] | None = None, rename: str | None = None) -> TaskOut:
        """Rename the task ``name`` (``rename``: unique in its space) and/or merge ``metadata`` into its metadata (a
        ``None`` value removes a key), as ``PATCH /v1/tasks/{id}``; no model run."""
        if metadata is None and rename is None:
            raise InvalidInput("give metadata, rename or both")
        if rename is not None:
            _check_name(rename)
        return task_out(self._c.tasks.patch(self._find(name)[0], metadata, name=rename))

    # -- jobs ----------------------------------------------------------------------------------------

    def jobs(self, name: str | None = None, *, status: str | None = None, limit: int = 50) -> list[JobOut]:
        """Jobs, newest first: of the task ``name`` or of every task, of one ``status`` (``queued``, ``running``,
        ``succeeded``, ``failed``, ``cancelled``) or any, at most ``limit`` (1..1000) — as ``GET /v1/jobs``.

        With ``add(..., wait=False)``, ``jobs(name)[0]`` is the task's job just queued.
        """
        task_id = self._find(name)[0] if name is not None else None
        page = self._c.jobs.page(task_id=task_id, status=status, limit=limit)
        return [job_out(j) for j in page.items]

    def job(self, job_id: int) -> JobOut:
        """One job: its status, progress, result and error (:class:`~atlas.errors.NotFound` if it does not
        exist)."""
        return job_out(self._c.jobs.get(_check_job_id(job_id)))

    def wait(self, job_id: int, *, progress: bool | Callable[[JobOut], None] | None = True) -> JobOut:
        """Wait for a job to end and return it; raise :class:`~atlas.errors.AtlasError` if it did not succeed
        (failed or cancelled), as ``add`` and ``append`` do. ``progress`` as in :meth:`add`."""
        _check_progress(progress)
        return job_out(self._wait(_check_job_id(job_id), progress, f"job {job_id}"))

    def cancel(self, job_id: int) -> JobOut:
        """Cancel a job: a queued one at once, a running one at its next batch (it keeps nothing half-written); a
        finished job is returned unchanged."""
        return job_out(self._c.jobs.cancel(_check_job_id(job_id)))

    def _wait(self, job_id: int, progress: bool | Callable[[JobOut], None] | None, label: str) -> Any:
        """Poll a job until it ends (with a progress bar or callback); return its row, or raise if it did not
        succeed."""
        bar = None
        if progress is True:
            from rich.console import Console
            from rich.progress import Progress

            # on stderr, and only on a terminal: a script's stdout (its JSON, say) gets no blank lines from it
            console = Console(stderr=True)
            bar = Progress(transient=True, console=console, disable=not console.is_terminal)
            bar.start()
            tid = bar.add_task(label, total=None)
        try:
            while True:
                job = self._c.jobs.get(job_id)
                p = job.progress or {}
                if callable(progress):
                    progress(job_out(job))
                elif bar is not None and p.get("phase") == "routing":  # after the samples: the routed prompts
                    bar.update(tid, description=f"{label}: routing prompts", completed=int(p.get("routing_done", 0)),
                               total=int(p.get("routing_total", 0) or 0) or None)
                elif bar is not None:
                    bar.update(tid, completed=int(p.get("samples_done", 0) or 0),
                               total=int(p.get("samples_total", 0) or 0) or None)
                if is_final(job.status):
                    break
                time.sleep(0.1)
        finally:
            if bar is not None:
                bar.stop()
        if job.status != JobStatus.SUCCEEDED:
            raise AtlasError(f"job {job.id} ended {job.status}: {job.error or ''}".strip(), {"job_id": job.id})
        notes = sample_notes(job.result)
        if notes:  # samples left out or cut are no error, but must not pass unseen
            log.warning("%s: %s", label, "; ".join(notes))
        return job

    # -- queries ---------------------------------------------------------------------------------

    @overload  # a str is a Sequence[str] too: the first overload wins for it
    def route(self, prompts: str, *, k: int = 5,  # type: ignore[overload-overlap]
              threshold: float | None = None) -> analysis.RouteAnswer: ...

    @overload
    def route(self, prompts: Sequence[str], *, k: int = 5, threshold: float | None = None
              ) -> list[analysis.RouteAnswer]: ...

    def route(self, prompts: str | Sequence[str], *, k: int = 5, threshold: float | None = None
              ) -> analysis.RouteAnswer | list[analysis.RouteAnswer]:
        """Route one prompt (an answer) or several (a list of answers, in the prompts' order)."""
        if isinstance(prompts, set | frozenset | Mapping):  # no order to give the answers back in
            raise InvalidInput(f"route takes a prompt or a list of prompts, not a {type(prompts).__name__} (its "
                               "answers could not be matched to the prompts)")
        try:
            texts = [prompts] if isinstance(prompts, str) else prompt_batch(prompts)
        except TypeError as exc:
            raise InvalidInput(str(exc)) from None
        answers: list[analysis.RouteAnswer] = _run(self._c.queries.route(texts, k=k, threshold=threshold))[0]
        return answers[0] if isinstance(prompts, str) else answers

    def fit(self, examples: Sequence[tuple[str, str | int] | Mapping[str, Any]], *, dry_run: bool = False
            ) -> FitResult:
        """Tune the route thresholds from labelled prompts, ``(prompt, task name or "none")`` pairs or
        ``{"prompt", "label"}`` mappings (the labels file's lines; the ``POST /v1/route/fit`` semantics,
        docs/SCORES.md "fit"); ``dry_run`` only reports them."""
        try:
            pairs, bad = fit_examples(examples)
        except TypeError as exc:
            raise InvalidInput(str(exc)) from None
        if bad is not None:
            raise InvalidInput(f"example {bad}: {FIT_EXAMPLE_FORM}", {"example": bad})
        result: FitResult = _run(self._c.thresholds.fit(pairs, dry_run=dry_run))
        return result

    def routing(self, name: str) -> RoutingInfo:
        """A task's effective route threshold and its source, calibration, template and novelty state
        (``GET /v1/tasks/{id}/routing``, the client's ``RoutingInfo``)."""
        return RoutingInfo(**self._c.thresholds.info(self._find(name)[0]))

    def set_threshold(self, name: str, threshold: float | None) -> RoutingInfo:
        """Override a task's route threshold (``None`` clears the override); returns :meth:`routing`."""
        return RoutingInfo(**self._c.thresholds.patch(self._find(name)[0], threshold=threshold))

    def set_false_reject_rate(self, name: str, rate: float) -> RoutingInfo:
        """Re-calibrate a task's route threshold so that at most ``rate`` of its own prompts are answered "none"
        (default 0.05; from its stored held-out scores; later appends keep it); returns :meth:`routing`."""
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise InvalidInput("a false-reject rate is a number", {"false_reject_rate": str(rate)[:40]})
        return RoutingInfo(**self._c.thresholds.patch(self._find(name)[0], false_reject_rate=float(rate)))

    def set_template_test(self, name: str, enabled: bool) -> RoutingInfo:
        """Turn a task's template test on or off (docs/SCORES.md "Open set: template test"); returns :meth:`routing`."""
        _check_switch(enabled, "enabled")
        return RoutingInfo(**self._c.thresholds.patch(self._find(name)[0], template=enabled))

    def set_novelty_test(self, name: str, enabled: bool) -> RoutingInfo:
        """Turn a task's novelty test on or off (docs/SCORES.md "Open set: novelty test"); returns :meth:`routing`."""
        _check_switch(enabled, "enabled")
        return RoutingInfo(**self._c.thresholds.patch(self._find(name)[0], novelty=enabled))

    def recommend(self, name: str, *, k: int = 5) -> list[analysis.Source]:
        """Fine-tuning sources for a target task, best first."""
        _, sources, _ = self._c.queries.sources(self._find(name)[0], k=k)
        return sources

    def align(self, a: str, b: str) -> analysis.Factors:
        """Fisher alignment of two tasks with its factors."""
        return self._c.queries.align(self._find(a)[0], self._find(b)[0])[2]

    def matrix(self, names: Sequence[str] | None = None, *, space: str | int = "default") -> analysis.Matrices:
        """Alignment matrices of the named tasks (default: the first ready tasks by id of ``space`` — an id or model
        name, default the loaded model's — up to :data:`atlas.vocabulary.MATRIX_DEFAULT_TASKS` as the CLI's
        ``matrix`` and the dashboard take; tasks of other spaces cannot be compared with them)."""
        if isinstance(names, str):  # iterated by characters: "no task named 's'"
            raise InvalidInput("matrix takes a list of task names, not one string")
        if names is not None:  # one name is a 1 x 1 matrix, as the REST API answers; none is refused there
            ids = [self._find(n)[0] for n in names]
        else:
            top = min(MATRIX_DEFAULT_TASKS, int(self.settings.max_matrix_tasks))
            ids = [t.id for t in self._all_tasks(top, space_ref=str(space), status=TaskStatus.READY)]
        return self._c.queries.matrix(ids)

    def atlas(self, *, space: str | int | None = None) -> analysis.AtlasMap:
        """The 2-D map of ``space`` (an id or model name; default the loaded model's: only it could be mapped, an
        imported space of another model not at all) — an even subset of its ready tasks above ``max_matrix_tasks``:
        ``extra`` holds ``space_id``, ``total`` and ``sampled``, as the REST answer does."""
        space_row, amap, total, sampled = self._c.queries.atlas(None if space is None else str(space))
        amap.extra.update(space_id=int(space_row.id), total=int(total), sampled=bool(sampled))
        return amap

    def export(self, path: str | Path) -> Path:
        """Write the default space as JSON lines (the format of ``GET /v1/spaces/{id}/export``), gzipped when the
        path ends in ``.gz`` (as the CLI's export; it wrote plain text under that name)."""
        path = Path(path)
        if path.is_dir() or not path.parent.is_dir():
            raise InvalidInput(f"cannot write {str(path)[:200]!r}: give a file path in an existing directory")
        _, lines = self._c.spaces.export_lines(None)
        with path.open("wb") as raw, contextlib.ExitStack() as stack:
            f: BinaryIO | gzip.GzipFile = raw
            if path.name.lower().endswith(".gz"):
                f = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="wb", filename="", mtime=0))
            for line in lines:
                f.write(line)
        return path

    def import_(self, path: str | Path, *, on_conflict: str = "fail") -> int:
        """Restore an export (all or nothing); returns the number of tasks imported. A space this atlas's model cannot
        sketch in (another model or sketch dimension) is imported with a :class:`UserWarning` saying so: its tasks
        are aligned and recommended, but prompts do not route to them here."""
        if not _is_file(path):
            raise InvalidInput(f"no such file: {str(path)[:200]!r}")
        with Path(path).open("rb") as file:  # a gzipped export as it is
            space_id, imported, _ = self._c.spaces.import_file(file, on_conflict=on_conflict,
                                                               max_bytes=self._c.settings.max_import_bytes)
        note = self._c.unserved_reason(space_id)
        if note is not None:
            warnings.warn(note, UserWarning, stacklevel=2)
        return imported


def _check_name(name: object) -> None:
    if not isinstance(name, str):  # an id: AttributeError "'int' object has no attribute 'strip'"
        raise InvalidInput(f"a task is named by its name (a string), not {type(name).__name__} {name!r:.40}")


def _check_job_id(job_id: object) -> int:
    """A job id as an ``int`` (a bool, float or string is refused: ``job("3")`` would find no job, ``True`` job 1)."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise InvalidInput(f"a job id is an int, not a {type(job_id).__name__}")
    if not 1 <= job_id <= MAX_ID:  # past SQLite's 64-bit integers an OverflowError, not "no such job"
        raise NotFound(f"job {job_id} does not exist", {"job_id": job_id})
    return job_id


def _check_progress(progress: object) -> None:
    if not (progress is None or isinstance(progress, bool) or callable(progress)):  # "yes": no bar, no word
        raise InvalidInput(f"progress is True, False (or None) or a callable receiving the job, not {progress!r:.40}")


def _check_switch(value: object, what: str) -> None:
    if not isinstance(value, bool):  # bool("false") is True: the test went on
        raise InvalidInput(f"{what} is True or False, not {value!r:.40}", {what: str(value)[:40]})


def _close_unclosed(container: Container, where: str) -> None:
    """An :class:`Atlas` collected unclosed: warn as an unclosed file does, and close its container — on a thread
    of its own unless this is the main thread (a collection can run on any thread, the container's own included,
    which would then wait on itself)."""
    warnings.warn(f"unclosed Atlas({where!r}): call close() or use it in a with block", ResourceWarning,
                  stacklevel=2)
    if threading.current_thread() is threading.main_thread():
        container.stop()
    else:
        threading.Thread(target=container.stop, name="atlas-close", daemon=True).start()


def _run(coro: Any) -> Any:
    """Run a coroutine to completion from sync code (also inside a running loop, e.g. a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
