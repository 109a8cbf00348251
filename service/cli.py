"""The ``fisher-atlas`` command line.

Server-side commands (``serve``, ``worker``, ``keys``, ``migrate``) act on the local
configuration; user commands (``add``, ``route``, ...) talk to a running service over HTTP through
:class:`service.client.AtlasClient`. Every flag has an environment twin ``FISHER_ATLAS_<FLAG>``
(flags win over the environment).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Handler = Callable[[argparse.Namespace], int]


def _settings(args: argparse.Namespace) -> Any:
    from atlas.settings import get_settings

    return get_settings(
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        data_dir=getattr(args, "data_dir", None),
        database_url=getattr(args, "database_url", None),
        model=getattr(args, "model", None),
        queue=getattr(args, "queue", None),
        sketch_dim=getattr(args, "sketch_dim", None),
    )


def _err(message: str) -> int:
    print(f"fisher-atlas: {message}", file=sys.stderr)
    return 1


def _emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    if getattr(args, "json", False):
        data = payload.model_dump(mode="json") if hasattr(payload, "model_dump") else payload
        print(json.dumps(data, indent=2))
    else:
        print(text)


def _client(args: argparse.Namespace) -> Any:
    from service.client import AtlasClient

    return AtlasClient(args.url, api_key=args.api_key, timeout=args.timeout)


# --------------------------------------------------------------------------------------------------
# server side
# --------------------------------------------------------------------------------------------------


def _migrate_db(settings: Any) -> None:
    from migrations import upgrade


    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url())


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the HTTP service with uvicorn."""
    import uvicorn

    from atlas.db import make_engine, session_factory
    from service.app import create_app
    from service.auth import check_bind_allowed, count_active_keys

    settings = _settings(args)
    _migrate_db(settings)
    engine = make_engine(settings.resolved_database_url(), pool_size=1)
    try:
        with session_factory(engine, readonly=True)() as session:
            n_keys = count_active_keys(session)
    finally:
        engine.dispose()
    try:
        check_bind_allowed(settings, n_keys)
    except RuntimeError as exc:
        return _err(str(exc))
    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level, proxy_headers=False)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a Celery worker executing jobs from Redis."""
    # The Celery app reads its settings from the environment at import: flags become env twins first.
    for flag, env in (("data_dir", "DATA_DIR"), ("database_url", "DATABASE_URL"), ("model", "MODEL")):
        value = getattr(args, flag, None)
        if value is not None:
            os.environ[f"FISHER_ATLAS_{env}"] = str(value)
    settings = _settings(args)
    _migrate_db(settings)
    from workers.celery_app import run_worker

    run_worker(concurrency=args.concurrency)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Upgrade the database schema."""
    settings = _settings(args)
    _migrate_db(settings)
    print(f"database at {settings.resolved_database_url()} is at the latest schema revision")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Create, revoke or list API keys, directly in the database."""
    from atlas import apikeys
    from atlas.db import make_engine, session_factory
    from atlas.errors import AtlasError

    settings = _settings(args)
    _migrate_db(settings)
    engine = make_engine(settings.resolved_database_url(), pool_size=1)
    factory = session_factory(engine)
    try:
        with factory.begin() as session:
            if args.keys_command == "create":
                scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
                key, plaintext = apikeys.create_api_key(session, args.name, scopes)
                out = {"id": key.id, "name": key.name, "scopes": key.scopes, "key": plaintext}
                _emit(args, out, f"created key {key.id} ({key.name}, scopes {','.join(key.scopes)}):\n{plaintext}\n"
                      "store it now: it is shown only once")
            elif args.keys_command == "revoke":
                key = apikeys.revoke_api_key(session, int(args.key_id))
                _emit(args, {"id": key.id, "revoked": True}, f"revoked key {key.id} ({key.name})")
            else:
                rows = apikeys.list_api_keys(session, include_revoked=args.all)
                data = [{"id": k.id, "name": k.name, "prefix": k.prefix, "scopes": k.scopes,
                         "created_at": k.created_at.isoformat(), "revoked": k.revoked_at is not None,
                         "last_used_at": k.last_used_at.isoformat() if k.last_used_at else None} for k in rows]
                lines = [f"{d['id']:>4}  {d['prefix']}…  {','.join(d['scopes']):<18} {d['name']}"
                         + ("  (revoked)" if d["revoked"] else "") for d in data]
                _emit(args, data, "\n".join(lines) if lines else "no API keys")
    except (AtlasError, ValueError) as exc:
        return _err(getattr(exc, "message", str(exc)))
    finally:
        engine.dispose()
    return 0


# --------------------------------------------------------------------------------------------------
# client side
# --------------------------------------------------------------------------------------------------


def _metadata(args: argparse.Namespace) -> dict[str, Any] | None:
    if not getattr(args, "metadata", None):
        return None
    try:
        value = json.loads(args.metadata)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"fisher-atlas: --metadata is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise SystemExit("fisher-atlas: --metadata must be a JSON object")
    return value


def _wait_with_bar(client: Any, job_id: int, label: str) -> Any:
    from service.progress import JobProgressBar

    bar = JobProgressBar(label)
    try:
        return client.wait_job(job_id, on_progress=bar)
    finally:
        bar.close()


def cmd_add(args: argparse.Namespace) -> int:
    """Add a task from a file."""
    with _client(args) as client:
        created = client.add_task(args.name, args.file, mode=args.mode, metadata=_metadata(args), space=args.space)
        if not args.wait:
            _emit(args, created, f"task {created.task.id} ({created.task.name}) created; job {created.job.id} "
                  f"{created.job.status}")
            return 0
        job = _wait_with_bar(client, created.job.id, args.name)
        task = client.get_task(created.task.id)
        _emit(args, {"task": task.model_dump(mode="json"), "job": job.model_dump(mode="json")},
              f"task {task.id} ({task.name}): {task.status}, {task.n_samples} samples, {task.n_tokens} tokens; "
              f"job {job.id} {job.status}" + (f": {job.error}" if job.error else ""))
        return 0 if job.status == "succeeded" else 1


def cmd_append(args: argparse.Namespace) -> int:
    """Append samples from a file to an existing task."""
    with _client(args) as client:
        task = client.find_task(args.name, space=args.space)
        job = client.append(task.id, args.file)
        if args.wait:
            job = _wait_with_bar(client, job.id, args.name)
        _emit(args, job, f"job {job.id} ({job.kind} to task {task.id}, {task.name}): {job.status}"
              + (f": {job.error}" if job.error else ""))
        return 0 if job.status in ("queued", "running", "succeeded") else 1


def cmd_route(args: argparse.Namespace) -> int:
    """Route a prompt to the nearest tasks."""
    with _client(args) as client:
        res = client.route(args.prompt, k=args.k, threshold=args.threshold, space=args.space)
    lines = [f"{'rank':>4}  {'score':>8}  {'faiss':>7}  {'act':>6}  {'err':>6}  task"]
    for i, m in enumerate(res.matches, start=1):
        lines.append(f"{i:>4}  {m.score:8.4f}  {m.faiss_score:7.4f}  {m.activation:6.3f}  {m.error:6.3f}  "
                     f"{m.name} (id {m.task_id})")
    if res.none:
        lines.append(f"none: the best score is below the threshold {res.threshold:g} (no stored task fits)")
    _emit(args, res, "\n".join(lines))
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    """Recommend fine-tuning sources for a target task."""
    with _client(args) as client:
        target = client.find_task(args.name, space=args.space)
        res = client.sources(target.id, k=args.k, candidates=args.candidates)
    lines = [f"sources for {res.target.name} (id {res.target.task_id}), {res.compared} compared",
             f"{'rank':>4}  {'shrunk':>7}  {'fisher':>7}  {'act':>6}  {'err':>6}  {'rho':>6}  {'se':>6}  task"]
    for i, s in enumerate(res.sources, start=1):
        se = f"{s.se:6.3f}" if s.se is not None else "     -"
        dark = "  activation-dark" if s.activation_dark else ""
        lines.append(f"{i:>4}  {s.fisher_shrunk:7.4f}  {s.fisher:7.4f}  {s.activation:6.3f}  {s.error:6.3f}  "
                     f"{s.rho:6.3f}  {se}  {s.name} (id {s.task_id}){dark}")
    _emit(args, res, "\n".join(lines))
    return 0


def cmd_align(args: argparse.Namespace) -> int:
    """Fisher alignment of two tasks."""
    with _client(args) as client:
        a = client.find_task(args.a, space=args.space)
        b = client.find_task(args.b, space=args.space)
        res = client.align(a.id, b.id)
    se = f"{res.se:.4f}" if res.se is not None else "-"
    text = (f"{res.a.name} ~ {res.b.name}\n  fisher        {res.fisher:.4f}\n  fisher_shrunk {res.fisher_shrunk:.4f}\n"
            f"  activation    {res.activation:.4f}\n  error         {res.error:.4f}\n  rho           {res.rho:.4f}\n"
            f"  se            {se}\n  activation-dark: {'yes' if res.activation_dark else 'no'}")
    _emit(args, res, text)
    return 0


def cmd_atlas(args: argparse.Namespace) -> int:
    """Draw the 2-D map of a space."""
    from service.render import render_png, render_svg

    with _client(args) as client:
        res = client.atlas(space=args.space)
    out = Path(args.out)
    title = f"FisherAtlas space {res.space_id}: {len(res.points)} tasks, {res.n_clusters} clusters"
    if out.suffix.lower() == ".json":
        out.write_text(res.model_dump_json(indent=2))
    elif out.suffix.lower() == ".svg":
        out.write_bytes(render_svg(res.points, title=title))
    else:
        out.write_bytes(render_png(res.points, title=title))
    _emit(args, res, f"wrote {out} ({len(res.points)} tasks, {res.n_clusters} clusters)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a space to a file."""
    with _client(args) as client:
        blob = client.export_space(args.space, out=args.out)
    print(f"wrote {args.out} ({len(blob):,} bytes)")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Import a space exported with ``export``."""
    with _client(args) as client:
        res = client.import_space(args.file, on_conflict=args.on_conflict)
    _emit(args, res, f"imported {res.imported} tasks into space {res.space_id}"
          + (f"; skipped {len(res.skipped)} existing: {', '.join(res.skipped)}" if res.skipped else ""))
    return 0


# --------------------------------------------------------------------------------------------------
# parser
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="fisher-atlas",
        description="FisherAtlas: a task-signature vector database (FisherSketch + FAISS + SQL).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, handler: Handler) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    def server_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", default=None, help="SQLite, FAISS and upload files (env FISHER_ATLAS_DATA_DIR)")
        p.add_argument("--database-url", default=None,
                       help="SQLAlchemy URL, e.g. postgresql+psycopg://... (env FISHER_ATLAS_DATABASE_URL)")

    serve = add("serve", "run the HTTP service (embedded defaults: SQLite, on-disk FAISS, in-process worker)",
                cmd_serve)
    serve.add_argument("--host", default=None, help="bind address (env FISHER_ATLAS_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (env FISHER_ATLAS_PORT, default 8000)")
    server_flags(serve)
    serve.add_argument("--model", default=None, help="'bundled', hub name or local dir (env FISHER_ATLAS_MODEL)")
    serve.add_argument("--queue", choices=["inprocess", "celery"], default=None,
                       help="job queue (env FISHER_ATLAS_QUEUE, default inprocess)")
    serve.add_argument("--sketch-dim", type=int, default=None, help="signature length m (env FISHER_ATLAS_SKETCH_DIM)")
    serve.add_argument("--log-level", default=os.environ.get("FISHER_ATLAS_LOG_LEVEL", "info"),
                       choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn log level (env FISHER_ATLAS_LOG_LEVEL)")

    worker = add("worker", "run a Celery worker that executes jobs from Redis (scale-out)", cmd_worker)
    worker.add_argument("--concurrency", type=int, default=int(os.environ.get("FISHER_ATLAS_WORKER_CONCURRENCY", "1")),
                        help="jobs run at once by this worker (env FISHER_ATLAS_WORKER_CONCURRENCY)")
    server_flags(worker)
    worker.add_argument("--model", default=None, help="'bundled', hub name or local dir (env FISHER_ATLAS_MODEL)")

    migrate = add("migrate", "upgrade the database schema to the latest revision", cmd_migrate)
    server_flags(migrate)

    for name, help_text, handler in (
        ("add", "add a task from a file and (with --wait) show progress until its job ends", cmd_add),
        ("append", "append samples from a file to an existing task", cmd_append),
    ):
        p = add(name, help_text, handler)
        p.add_argument("name")
        p.add_argument("file", help="JSONL, JSON, CSV, Parquet or plain text (one sample per line)")
        p.add_argument("--mode", choices=["text", "completion"], default="text",
                       help="text: every next token counts; completion: only completions (append: the task's)")
        p.add_argument("--wait", action="store_true", help="show a progress bar until the job ends")
        if name == "add":
            p.add_argument("--metadata", default=None, help="task metadata as a JSON object")

    route = add("route", "route a prompt to the nearest stored tasks", cmd_route)
    route.add_argument("prompt")
    route.add_argument("-k", type=int, default=5)
    route.add_argument("--threshold", type=float, default=None)

    rec = add("recommend", "recommend fine-tuning sources for a target task", cmd_recommend)
    rec.add_argument("name")
    rec.add_argument("-k", type=int, default=5)
    rec.add_argument("--candidates", type=int, default=None)

    align = add("align", "Fisher alignment of two tasks, with its factors", cmd_align)
    align.add_argument("a")
    align.add_argument("b")

    atlas = add("atlas", "draw the 2-D map of a space's tasks (.png, .svg or .json)", cmd_atlas)
    atlas.add_argument("--out", default="atlas.png")

    export = add("export", "export a space's states and metadata to a file", cmd_export)
    export.add_argument("out")
    imp = add("import", "import a space exported with 'export'", cmd_import)
    imp.add_argument("file")
    imp.add_argument("--on-conflict", choices=["fail", "skip"], default="fail",
                     help="when a task name already exists: fail (nothing imported) or skip it")

    keys = add("keys", "manage API keys", cmd_keys)
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    kc = keys_sub.add_parser("create", help="create a key and print it once")
    kc.add_argument("--name", required=True)
    kc.add_argument("--scopes", default="read", help="comma-separated: read, write, admin")
    kr = keys_sub.add_parser("revoke", help="revoke a key by id")
    kr.add_argument("key_id")
    kl = keys_sub.add_parser("list", help="list keys (never their secrets)")
    kl.add_argument("--all", action="store_true", help="include revoked keys")
    for p in (kc, kr, kl):
        server_flags(p)
        p.add_argument("--json", action="store_true", help="machine-readable output")

    for p in sub.choices.values():
        if p.prog.split()[-1] not in ("serve", "worker", "migrate", "keys"):
            p.add_argument("--url", default=os.environ.get("FISHER_ATLAS_URL"),
                           help="service URL (env FISHER_ATLAS_URL, default http://127.0.0.1:8000)")
            p.add_argument("--api-key", default=os.environ.get("FISHER_ATLAS_API_KEY"),
                           help="API key (env FISHER_ATLAS_API_KEY)")
            p.add_argument("--space", default=os.environ.get("FISHER_ATLAS_SPACE"),
                           help="space id or name (env FISHER_ATLAS_SPACE; default: the service's model space)")
            p.add_argument("--timeout", type=float, default=float(os.environ.get("FISHER_ATLAS_TIMEOUT", "120")),
                           help="request timeout in seconds (env FISHER_ATLAS_TIMEOUT)")
            p.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fisher-atlas`` console script."""
    from service.client import AtlasClientError

    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except AtlasClientError as exc:
        return _err(f"{exc.status} {exc.code}: {exc.message}" if exc.status else exc.message)
    except FileNotFoundError as exc:
        return _err(f"no such file: {exc.filename}")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
