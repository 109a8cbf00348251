"""Query commands: ``route``, ``fit``, ``routing``, ``recommend``, ``align``, ``matrix``, ``atlas``, ``export``,
``import``."""

from __future__ import annotations

import io
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from atlas.route_calibration import MIN_CALIBRATION
from atlas.vocabulary import MATRIX_DEFAULT_TASKS
from service.cli.common import ApiKey, Json, Space, Timeout, Url, client, emit, fail, format_option, terminal_safe
from service.cli.route_file import EMPTY_SPACE, answer_line, none_reason, route_file

app = typer.Typer()


def _check_out(out: Path, *, numbers: bool) -> None:
    """Refuse a file name the command cannot write, before any request (exit 2): a figure's suffix, or ``.json``
    where the command writes its numbers (``numbers``)."""
    from service import plots

    try:
        plots.check_suffix(out, (".json",) if numbers else ())
    except plots.PlotError as exc:
        raise fail(str(exc), 2) from None


def _default_out(out: Path | None, default: str, json: bool) -> Path | None:
    """The figure file of ``matrix``/``atlas``: ``out``, checked; else ``default``, or none with ``--json`` (it wrote
    ``matrix.png`` into the working directory beside the JSON on stdout, over any file of that name)."""
    if out is None and json:
        return None
    out = out if out is not None else Path(default)
    _check_out(out, numbers=True)
    return out


def _write_out(out: Path | None, res: Any, kind: str, title: str) -> None:
    """Write ``res`` to ``out``: its numbers for ``.json``, else the figure; nothing when ``out`` is ``None``."""
    if out is None:
        return
    if out.suffix.lower() == ".json":
        out.write_text(res.model_dump_json(indent=2))
    else:
        _plot(kind, res, out, title)


def _plot(kind: str, body: Any, out: Path, title: str) -> Path:
    from service import plots

    try:
        data = body.model_dump(mode="json") if hasattr(body, "model_dump") else body
        return getattr(plots, f"save_{kind}")(data, out, title=title)  # type: ignore[no-any-return]
    except (plots.PlotError, plots.PlotsUnavailable) as exc:
        raise fail(str(exc), 2) from None


@app.command()
def route(prompt: Annotated[str | None, typer.Argument(help="The prompt (or --file).")] = None,
          file: Annotated[Path | None, typer.Option(
              "--file", "-f", help="Route every prompt of a file: one a line, or JSON lines with 'prompt' (.jsonl); "
                                   "'-' reads stdin. One answer a line, as each batch of 64 is answered (--json: one "
                                   "JSON object a line, with its 'line').")] = None,
          k: Annotated[int, typer.Option("-k", min=1, max=100)] = 5,
          threshold: Annotated[float | None, typer.Option(help="Open-set threshold, -1 to 1 (default: each "
                                                                "task's own).")] = None,
          candidates: Annotated[int | None, typer.Option(min=1, max=4096, help="FAISS candidates re-ranked exactly "
                                                         "(default max(k, 32)).")] = None,
          url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
          json: Json = False) -> None:
    """Route a prompt, or every prompt of a file, to the nearest stored tasks ("none" below the threshold)."""
    from service.client import AtlasClientError

    if (prompt is None) == (file is None):
        raise fail("give one prompt, or --file with a prompt a line", 2)
    if file is not None:
        route_file(file, k, threshold, candidates, url, api_key, space, timeout, json)
        return
    if not prompt:
        raise fail("the prompt is empty")
    try:
        with client(url, api_key, timeout) as cl:
            res = cl.route(prompt, k=k, threshold=threshold, candidates=candidates, space=space)
    except AtlasClientError as exc:  # one prompt: the API's "prompt 0" names no place in anything the user gave
        message = re.sub(r"^prompt 0(: | )", lambda m: "" if m.group(1) == ": " else "the prompt ", exc.message)
        if message == exc.message:
            raise
        raise fail(f"{exc.status} {exc.code}: {message}") from None
    ranked = any(m.rank_score is not None for m in res.matches)  # what orders the matches
    lexical = any(m.lexical is not None for m in res.matches)  # fused with rank_score (docs/SCORES.md)
    lines = [f"{'rank':>4}  {'score':>8}  {'faiss':>7}  {'act':>6}  {'err':>6}  " + ("ranking  " if ranked else "")
             + ("lexical  " if lexical else "") + "task"]
    for i, m in enumerate(res.matches, start=1):
        rank = f"{m.rank_score:7.4f}  " if ranked and m.rank_score is not None else ""
        lex = f"{m.lexical:7.4f}  " if lexical and m.lexical is not None else ""
        lines.append(f"{i:>4}  {m.score:8.4f}  {m.faiss_score:7.4f}  {m.activation:6.3f}  {m.error:6.3f}  {rank}{lex}"
                     f"{m.name} (id {m.task_id})")
    if not res.matches:
        lines = [EMPTY_SPACE]
    elif res.none:
        lines.append(f"none: {none_reason(res)}")
    else:
        lines.append(answer_line(res))
    if getattr(res, "truncated", False):
        lines.append(TRUNCATED_NOTE)
    if res.matches:
        lines.append(ROUTE_LEGEND + (" · ranking: what orders the matches" + (", fused with lexical (term overlap)"
                                                                             if lexical else "") if ranked else ""))
    emit(json, res, "\n".join(lines))


ROUTE_LEGEND = ("score: route score, a cosine in [-1, 1] held to the task's threshold · faiss: signature inner "
                "product · act/err: activation and error factors in [0, 1] (docs/SCORES.md)")


TRUNCATED_NOTE = ("note: the prompt is longer than the model's token limit (the service's max_tokens_per_sample): "
                  "only its first tokens were read, so the answer is about that prefix")


@app.command()
def fit(file: Annotated[Path, typer.Argument(help='JSONL of {"prompt", "label"}, or CSV / TSV with a header row '
                                                 'naming "prompt" and "label"; a label is a task name or "none"; - '
                                                 'reads standard input (JSONL unless --format).')],
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Report, do not store the thresholds.")] = False,
        file_format: Annotated[str | None, typer.Option("--format", help="jsonl, csv or tsv where the file's name "
                                                        "does not say it.")] = None,
        url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
        json: Json = False) -> None:
    """Tune the route thresholds from labelled prompts ("none" for prompts that fit no task)."""
    from service.client import AtlasClientError

    examples, lines_of = labelled_prompts(file, format_option(file_format, ["jsonl", "csv", "tsv"]))
    if not examples:
        raise fail(f'{file}: no labelled prompts (one JSON object per line: {{"prompt": "...", "label": "..."}}, '
                   'or CSV rows under a "prompt,label" header)')
    try:
        with client(url, api_key, timeout) as cl:
            res = cl.fit(examples, space=space, dry_run=dry_run)
    except AtlasClientError as exc:  # a bad label or prompt: named by its line of the file
        at, message = example_at(exc)
        if at is None or not 0 <= at < len(lines_of):
            raise
        raise fail(f"{file}:{lines_of[at]}: {exc.status} {exc.code}: {message}") from None
    lines = [f"accuracy on the labelled prompts: {res.accuracy_before:.3f} -> {res.accuracy_after:.3f}"
             + ("" if res.stored else " (dry run: nothing stored)")]
    lines += [f"  {name}: threshold " + (f"{res.previous[name]:.4f} -> " if name in res.previous else "") + f"{thr:.4f}"
              for name, thr in sorted(res.thresholds.items())]
    lines += [f"  {name}: template test off (its labelled prompts lack its template)" for name in res.template_off]
    lines += [f"  {name}: novelty test off (it rejected too many of its labelled prompts)"
              + (f"; threshold {res.previous[name]:.4f} -> {res.unsplit[name]:.4f} (its whole false-reject rate, no "
                 "longer half)" if name in res.unsplit and name in res.previous else "") for name in res.novelty_off]
    lines += [f"  {name}: still answers {n} prompt{'' if n == 1 else 's'} labelled otherwise: refusing "
              f"{'it' if n == 1 else 'them'} would pass its false-reject rate on its own prompts (more samples, or a "
              "higher rate, let fit go further)" for name, n in sorted(res.held_by_cap.items())]
    emit(json, res, "\n".join(lines))


def example_at(exc: Any) -> tuple[int | None, str]:
    """The example a ``fit`` error is about (from 0) and its message without the example's number: the service's
    own errors name it in ``detail.example``, request validation in a ``loc`` of ``["body", "examples", i, …]`` (an
    empty prompt)."""
    detail = exc.detail
    if isinstance(detail, dict) and isinstance(detail.get("example"), int):
        return detail["example"], re.sub(r"^(example|prompt) \d+: ", "", exc.message)
    first = detail[0] if isinstance(detail, list) and detail and isinstance(detail[0], dict) else {}
    loc = first.get("loc") or []
    if len(loc) >= 3 and loc[:2] == ["body", "examples"] and isinstance(loc[2], int):
        field = f"{loc[3]}: " if len(loc) > 3 else ""
        return loc[2], f"{field}{first.get('msg', exc.message)}"
    return None, exc.message


def labelled_prompts(file: Path, fmt: str | None = None) -> tuple[list[tuple[str, str | int]], list[int]]:
    """``fit``'s labelled prompts from ``file`` and each one's line in it (the API names examples from 0):
    JSON Lines of ``{"prompt", "label"}`` objects, or ``.csv`` / ``.tsv`` with a header row naming ``prompt`` and
    ``label`` (other columns ignored; a CSV label is a task name, or "none"); ``-`` reads standard input, ``fmt``
    (``jsonl``, ``csv``, ``tsv``) says the format where the name does not. Blank lines are skipped; a BOM is no
    text. A malformed line raises the CLI's failure naming it (exit 1)."""
    import csv
    import json as jsonlib

    from atlas.errors import InvalidInput
    from atlas.route_fit import as_fit_example
    from atlas.samples import unique_keys_object

    raw = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:  # named by its line, as route --file and add name it
        newline = b"\n"
        line_start = raw.rfind(newline, 0, exc.start) + 1
        raise fail(f"{file}:{raw.count(newline, 0, exc.start) + 1}: not valid UTF-8 (byte {exc.start - line_start} "
                   "of the line)") from None
    examples: list[tuple[str, str | int]] = []
    lines_of: list[int] = []
    suffix = f".{fmt}" if fmt else file.suffix.lower()
    if suffix in (".csv", ".tsv"):
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ",",
                                strict=True)
        try:
            reader.fieldnames = [name.strip().lower() for name in reader.fieldnames or ()]  # " Label" is "label"
        except csv.Error as exc:
            raise fail(f"{file}:1: not CSV: {exc}") from None
        if not {"prompt", "label"} <= set(reader.fieldnames):
            raise fail(f"{file}:1: the header row must name the columns 'prompt' and 'label' "
                       f"(it names {', '.join(map(repr, reader.fieldnames)) or 'none'})")
        twice = sorted({n for n in ("prompt", "label") if reader.fieldnames.count(n) > 1})
        if twice:  # the last column of the name was read
            raise fail(f"{file}:1: the header row names {' and '.join(map(repr, twice))} more than once")
        while True:  # a row's line: its last (a quoted prompt may span lines); a malformed one's: where it starts
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                raise fail(f"{file}:{start}: not CSV: {exc}") from None
            prompt, label = row.get("prompt"), row.get("label")
            if prompt is None or label is None:
                raise fail(f"{file}:{reader.line_num}: the row has fewer columns than the header")
            if any(str(extra).strip() for extra in row.get(None) or ()):
                raise fail(f"{file}:{reader.line_num}: the row has more columns than the header (quote a field that "
                           "holds the delimiter)")  # an unquoted comma cut the prompt there, without a word
            if not prompt.strip() and not label.strip():
                continue
            if not label.strip():
                raise fail(f"{file}:{reader.line_num}: no label: a task name, or \"none\"")
            if not prompt.strip():  # named by its line here (the service names it by its place among the examples)
                raise fail(f"{file}:{reader.line_num}: the prompt is empty")
            examples.append((prompt, label.strip()))
            lines_of.append(reader.line_num)
        return examples, lines_of
    for i, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:  # a repeated key is refused, as the service refuses one (the last "label" was taken)
            rec = jsonlib.loads(line, object_pairs_hook=unique_keys_object)
        except InvalidInput as exc:
            raise fail(f"{file}:{i}: {exc.message}") from None
        except (ValueError, RecursionError):
            raise fail(f"{file}:{i}: not JSON: expected an object with 'prompt' and 'label'") from None
        example = as_fit_example(rec) if isinstance(rec, dict) else None
        if example is None:
            raise fail(f"{file}:{i}: expected an object with 'prompt' (a string) and 'label' (a task name or id, "
                       "or \"none\")")
        examples.append(example)
        lines_of.append(i)
    return examples, lines_of


@app.command()
def routing(name: str,
            threshold: Annotated[float | None, typer.Option(help="Override the route threshold (-1..1).")] = None,
            clear: Annotated[bool, typer.Option("--clear", help="Clear the threshold override.")] = False,
            false_reject_rate: Annotated[float | None, typer.Option(
                "--false-reject-rate", help="Re-calibrate at this share of the task's own prompts answered none "
                "(0 < r <= 0.5; default 0.05).")] = None,
            template: Annotated[bool | None, typer.Option("--template/--no-template",
                                                          help="Turn the template test on or off.")] = None,
            novelty: Annotated[bool | None, typer.Option("--novelty/--no-novelty",
                                                         help="Turn the novelty test on or off.")] = None,
            url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
            json: Json = False) -> None:
    """Show a task's route threshold and calibration; with options, change them (docs/SCORES.md)."""
    if clear and threshold is not None:
        raise fail("give --threshold or --clear, not both", 2)
    body: dict[str, Any] = {}
    if threshold is not None or clear:
        body["threshold"] = threshold
    if false_reject_rate is not None:
        body["false_reject_rate"] = false_reject_rate
    if template is not None:
        body["template"] = template
    if novelty is not None:
        body["novelty"] = novelty
    with client(url, api_key, timeout) as cl:
        task = cl.find_task(name, space=space)
        info = cl.patch_routing(task.id, **body) if body else cl.routing(task.id)
    rate = "-" if info.false_reject_rate is None else f"{info.false_reject_rate:g}"
    auto = "-" if info.threshold_auto is None else f"{info.threshold_auto:.4f}"
    state = "" if info.template_active is None else (
        f" (template {'active' if info.template_active else 'inactive'}, {info.template_terms} terms)")
    split = (info.source == "calibrated" and info.novelty_active and info.threshold_auto is not None
             and info.threshold != info.threshold_auto)
    if task.status != "ready":  # nothing is calibrated before its job ends: the lines below would mislead
        lines = [f"{task.name} (id {task.id}) has status {task.status}: it is not routed to until a job of it "
                 "succeeds, which stores its calibration, held-out views and novelty vectors (`fisher-atlas jobs "
                 "list`)"]
        lines += [f"threshold override {info.threshold_override:.4f}"] if info.threshold_override is not None else []
        lines += [f"false-reject rate {rate}"] if info.false_reject_rate is not None else []
        emit(json, info, "\n".join(lines))
        return
    lines = [f"{task.name} (id {task.id}): threshold {info.threshold:.4f} ({info.source}"
             + (", at half the false-reject rate: the novelty test takes the other half" if split else "")
             + f"); calibrated {auto} at false-reject rate {rate} from {info.calibration_scores} held-out scores"
             + ("" if info.threshold_auto is not None else
                f" (too few to calibrate: {MIN_CALIBRATION} are needed, a task of {MIN_CALIBRATION} samples or "
                "more; a false-reject rate applies from then on)"),
             _length_line(info.length_views, info.short_prompt_tokens, info.source == "override",
                          calibrated=info.threshold_auto is not None),
             f"template test {'on' if info.template_test else 'off'}{state}",
             _novelty_line(info.novelty_samples, info.novelty_test, info.novelty_active,
                           info.novelty_samples_needed, overridden=info.source == "override")]
    emit(json, info, "\n".join(lines))


def _length_line(views: int, short_below: float | None, overridden: bool = False, calibrated: bool = True) -> str:
    """The routing output's line on thresholds matched to a prompt's length (docs/SCORES.md, "Prompts shorter than
    the samples"); with an override, that it moves every length's threshold by as much as it moves whole prompts'; a
    task without a calibrated threshold holds every prompt to the one it has."""
    if not calibrated:
        return "prompt length: not calibrated (every prompt is held to the threshold above)"
    if short_below is None:
        return "prompt length: no held-out views stored (every prompt judged on whole samples; re-add to store them)"
    longest = math.ceil(short_below) - 1  # the most counted positions (one per token after the first) of a short one
    if longest < 1:
        return "prompt length: the samples are as short as a prompt can be (every prompt judged on whole samples)"
    return (f"prompt length: a prompt of up to {longest} token positions ({longest + 1} tokens) is held to the "
            f"threshold of its length ({views} held-out views) when that is lower than the calibrated one"
            + (", moved by as much as the override moves the threshold of whole prompts" if overridden else "")
            + ", and not to the novelty test")


def _novelty_line(n: int, switch: bool = True, active: bool = False, needed: int | None = None,
                  overridden: bool = False) -> str:
    """The routing output's line on the task's novelty test (docs/SCORES.md, "Open set: novelty test"): on, off by
    its switch (``novelty_test``), or off for want of sample vectors at its rate (``novelty_samples_needed``)."""
    from atlas.novelty import MAX_NOVELTY_SAMPLES, vectors_needed
    from atlas.route_calibration import FALSE_REJECT_RATE, split_rates

    if not switch:
        return f"novelty test off (switched off: --novelty turns it on; {n} sample vectors)"
    if active:
        if overridden:
            return f"novelty test on ({n} sample vectors; it takes half the task's false-reject rate)"
        return (f"novelty test on ({n} sample vectors; half the false-reject rate each for it and the threshold, "
                f"which is the threshold above)")
    needed = vectors_needed(split_rates(FALSE_REJECT_RATE)[1]) if needed is None else needed  # an older server's
    if needed > MAX_NOVELTY_SAMPLES:
        return (f"novelty test off (at this false-reject rate it needs {needed} sample vectors; a task keeps at most "
                f"{MAX_NOVELTY_SAMPLES})")
    if n >= needed:
        return f"novelty test off ({n} sample vectors, {needed} needed at this rate: off for the service)"
    return (f"novelty test off ({n} sample vectors: {needed} needed at half the task's false-reject rate, a task of "
            f"{needed} samples or more)")


@app.command()
def recommend(name: str, k: Annotated[int, typer.Option("-k", min=1, max=100)] = 5,
              candidates: Annotated[int | None, typer.Option(help="Nearest tasks compared.")] = None,
              plot: Annotated[Path | None, typer.Option(help="Also draw the factors (.png, .svg, .pdf).")] = None,
              url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
              json: Json = False) -> None:
    """Recommend fine-tuning sources for a target task, with their factors."""
    if plot is not None:
        _check_out(plot, numbers=False)
    with client(url, api_key, timeout) as cl:
        target = cl.find_task(name, space=space)
        res = cl.sources(target.id, k=k, candidates=candidates)
    if plot is not None:
        _plot("factors", res, plot, "Recommended sources: Fisher alignment and its factors")  # the target: below
    lines = [f"sources for {res.target.name} (id {res.target.task_id}), {res.compared} compared",
             f"{'rank':>4}  {'shrunk':>7}  {'fisher':>7}  {'act':>6}  {'err':>6}  {'rho':>6}  {'se':>6}  task"]
    for i, s in enumerate(res.sources, start=1):
        se = f"{s.se:6.3f}" if s.se is not None else "     -"
        dark = "  activation-dark" if s.activation_dark else ""
        flags = f"  [{', '.join(s.flags)}]" if s.flags else ""
        lines.append(f"{i:>4}  {s.fisher_shrunk:7.4f}  {s.fisher:7.4f}  {s.activation:6.3f}  {s.error:6.3f}  "
                     f"{s.rho:6.3f}  {se}  {s.name} (id {s.task_id}){dark}{flags}")
    emit(json, res, "\n".join(lines) + (f"\nwrote {plot}" if plot else ""))


@app.command()
def align(a: str, b: str, url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
          json: Json = False) -> None:
    """Fisher alignment of two tasks, with its activation, error and coupling factors."""
    with client(url, api_key, timeout) as cl:
        res = cl.align(cl.find_task(a, space=space).id, cl.find_task(b, space=space).id)
    se = f"{res.se:.4f}" if res.se is not None else "-"
    emit(json, res, f"{res.a.name} ~ {res.b.name}\n  fisher        {res.fisher:.4f}\n"
         f"  fisher_shrunk {res.fisher_shrunk:.4f}\n  activation    {res.activation:.4f}\n"
         f"  error         {res.error:.4f}\n  rho           {res.rho:.4f}\n  se            {se}\n"
         f"  activation-dark: {'yes' if res.activation_dark else 'no'}"
         + (f"\n  flags: {', '.join(res.flags)}" if res.flags else ""))


@app.command()
def matrix(names: Annotated[list[str] | None, typer.Argument(help="Tasks (default: the first ready ones).")] = None,
           out: Annotated[Path | None, typer.Option(
               help="Heatmap file: .png, .svg or .pdf (.json: the numbers). Default: matrix.png, or none with "
                    "--json (the numbers go to stdout).")] = None,
           url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
           json: Json = False) -> None:
    """Fisher alignment heatmap of the named tasks (the space's ready tasks up to 40 when none are named)."""
    out = _default_out(out, "matrix.png", json)
    with client(url, api_key, timeout) as cl:
        if names:
            ids = [cl.find_task(n, space=space).id for n in names]
        else:
            # The space's own tasks: GET /v1/tasks without a space lists every space's (mixing them is a 409).
            ids = [t.id for t in cl.list_tasks(space=space if space is not None else "default", status="ready",
                                               limit=MATRIX_DEFAULT_TASKS).items]
        if not ids:  # one task is a 1 x 1 matrix, as the REST API answers
            raise fail("no ready task to compare" + (f" in space {space!r}" if space is not None else ""))
        res = cl.align_matrix(ids)
    _write_out(out, res, "matrix", f"Fisher alignment of {len(ids)} tasks")
    emit(json, res, f"wrote {out} ({len(ids)} tasks)")


@app.command()
def atlas(out: Annotated[Path | None, typer.Option(
              help="Map file: .png, .svg or .pdf (.json: the coordinates). Default: atlas.png, or none with "
                   "--json (the coordinates go to stdout).")] = None,
          url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
          json: Json = False) -> None:
    """Draw the 2-D map of a space's tasks, coloured by cluster."""
    out = _default_out(out, "atlas.png", json)
    with client(url, api_key, timeout) as cl:
        res = cl.atlas(space=space)
        sp = cl.get_space(res.space_id)
    _write_out(out, res, "atlas", f"FisherAtlas, model {sp.model_name}")  # space and task count: the subtitle
    clusters = f"{res.n_clusters} cluster" + ("" if res.n_clusters == 1 else "s")
    emit(json, res, f"wrote {out} ({len(res.points)} tasks, {clusters})")


@app.command("export")
def export_space(out: Path, url: Url = None, api_key: ApiKey = None, space: Space = None, timeout: Timeout = 120.0,
                 json: Json = False) -> None:
    """Export a space (states, signatures, metadata) to a JSON-lines file ('-' or /dev/stdout: stdout)."""
    to_stdout = str(out) in ("-", "/dev/stdout")
    if to_stdout and json:
        raise fail("--json and '-' both write to stdout: give the export a file", 2)
    with client(url, api_key, timeout) as cl:  # streamed, not held in memory
        written = cl.download_export(sys.stdout.buffer if to_stdout else out, space)
    if to_stdout:
        print(f"fisher-atlas: wrote {written:,} bytes to stdout", file=sys.stderr)
        return
    if out.is_file():  # what is on disk (a .gz export is smaller than the export it holds)
        written = out.stat().st_size
    emit(json, {"out": str(out), "bytes": written}, f"wrote {out} ({written:,} bytes)")


@app.command("import")
def import_space(file: Annotated[Path, typer.Argument(help="An export file, a pipe, or - for standard input.")],
                 on_conflict: Annotated[str, typer.Option(help="Existing task names: fail (nothing imported) or skip.")]
                 = "fail",
                 url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0, json: Json = False) -> None:
    """Import a space exported with 'export' (export - | import - moves one between services)."""
    if on_conflict not in ("fail", "skip"):
        raise fail("--on-conflict must be 'fail' or 'skip'", 2)
    with client(url, api_key, timeout) as cl:
        res = cl.import_space(sys.stdin.buffer if str(file) == "-" else file, on_conflict=on_conflict)
    emit(json, res, f"imported {res.imported} tasks into space {res.space_id}"
         + (f"; skipped {len(res.skipped)} existing: {', '.join(res.skipped)}" if res.skipped else ""))
    if res.note:
        print(terminal_safe(f"fisher-atlas: warning: {res.note}"), file=sys.stderr)
