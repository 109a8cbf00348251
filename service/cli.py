"""The ``fisher-atlas`` command line.

Server-side commands (``serve``, ``worker``, ``keys``, ``migrate``) act on the local
configuration; user commands (``add``, ``route``, ...) talk to a running service over HTTP through
:class:`service.client.AtlasClient`. Every flag has an environment twin ``FISHER_ATLAS_<FLAG>``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]


def _not_implemented(name: str) -> Handler:
    def run(_: argparse.Namespace) -> int:
        print(f"fisher-atlas {name}: not implemented yet", file=sys.stderr)
        return 2

    return run


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="fisher-atlas",
        description="FisherAtlas: a task-signature vector database (FisherSketch + FAISS + SQL).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=_not_implemented(name))
        return p

    serve = add("serve", "run the HTTP service (embedded defaults: SQLite, on-disk FAISS, in-process worker)")
    serve.add_argument("--host", default=None, help="bind address (env FISHER_ATLAS_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (env FISHER_ATLAS_PORT, default 8000)")
    serve.add_argument("--data-dir", default=None, help="SQLite, FAISS and upload files (env FISHER_ATLAS_DATA_DIR)")
    serve.add_argument("--model", default=None, help="'bundled', hub name or local dir (env FISHER_ATLAS_MODEL)")

    worker = add("worker", "run a Celery worker that executes jobs from Redis (scale-out)")
    worker.add_argument("--concurrency", type=int, default=1)

    add("migrate", "upgrade the database schema to the latest revision")

    for name, help_text in (
        ("add", "add a task from a file and (with --wait) show progress until its job ends"),
        ("append", "append samples from a file to an existing task"),
    ):
        p = add(name, help_text)
        p.add_argument("name")
        p.add_argument("file")
        p.add_argument("--mode", choices=["text", "completion"], default="text")
        p.add_argument("--wait", action="store_true")

    route = add("route", "route a prompt to the nearest stored tasks")
    route.add_argument("prompt")
    route.add_argument("-k", type=int, default=5)
    route.add_argument("--threshold", type=float, default=None)

    rec = add("recommend", "recommend fine-tuning sources for a target task")
    rec.add_argument("name")
    rec.add_argument("-k", type=int, default=5)

    align = add("align", "Fisher alignment of two tasks, with its factors")
    align.add_argument("a")
    align.add_argument("b")

    atlas = add("atlas", "draw the 2-D map of a space's tasks")
    atlas.add_argument("--out", default="atlas.png")

    export = add("export", "export a space's states and metadata to a file")
    export.add_argument("out")
    imp = add("import", "import a space exported with 'export'")
    imp.add_argument("file")

    keys = add("keys", "manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    kc = keys_sub.add_parser("create")
    kc.add_argument("--name", required=True)
    kc.add_argument("--scopes", default="read")
    kr = keys_sub.add_parser("revoke")
    kr.add_argument("key_id")
    keys_sub.add_parser("list")

    for p in sub.choices.values():
        if p.prog.split()[-1] not in ("serve", "worker", "migrate", "keys"):
            p.add_argument("--url", default=None, help="service URL (env FISHER_ATLAS_URL)")
            p.add_argument("--api-key", default=None, help="API key (env FISHER_ATLAS_API_KEY)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fisher-atlas`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
