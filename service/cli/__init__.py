"""The ``fisher-atlas`` command line (typer).

Server-side commands (``serve``, ``worker``, ``migrate``, ``keys --local``) act on the local configuration;
user commands (``add``, ``route``, ``tasks``, ``jobs``, ``keys``, ...) talk to a running service over HTTP
through :class:`service.client.AtlasClient`. Every option has an environment twin ``FISHER_ATLAS_<NAME>``
(options win), ``--json`` gives machine-readable output, and errors are one line on stderr with the
service's code. Exit status: 0 done; 1 the service refused the request (a 4xx) or a local file is wrong; 2 a usage
error; 3 the service could not answer (unreachable, busy, failing: the same command may work later); 4 a job followed
with ``--wait`` ended failed or cancelled; 130 interrupted (a followed job goes on in the service); 141 the reader of
stdout went away (a pipe into ``head``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Sequence

import typer

from service.cli import keys, queries, server, tasks
from service.cli.common import exit_status, terminal_safe

app = typer.Typer(name="fisher-atlas", no_args_is_help=True, add_completion=False,
                  help="FisherAtlas: a task-signature vector database (FisherSketch + FAISS + SQL).")
for module in (server, tasks, queries):
    for command in module.app.registered_commands:
        app.registered_commands.append(command)
app.add_typer(tasks.tasks_app, name="tasks")
app.add_typer(tasks.jobs_app, name="jobs")
app.add_typer(tasks.spaces_app, name="spaces")
app.add_typer(keys.app, name="keys")


_HINTS = {
    "unreachable": "\n  is the service running there? Start it with `fisher-atlas serve`, or point --url "
                   "(FISHER_ATLAS_URL) at it",
    "timed_out": "\n  the service is there but did not answer in time: raise --timeout (FISHER_ATLAS_TIMEOUT)",
    "unauthorized": "\n  pass a key with --api-key or set FISHER_ATLAS_API_KEY (an admin key makes one with "
                    "`fisher-atlas keys create`; the first one: `fisher-atlas keys create --local` on the service's "
                    "machine)",
    "forbidden": "\n  this key lacks the scope named above: use a key that has it (`fisher-atlas keys current` "
                 "shows this key's scopes)",
}
"""What to do next, by the code of a client error ("unreachable": the service could not be reached; the client's own
checks of the caller's input, also without an HTTP status, get no hint). A 401 or 403 without the service's JSON
body (a proxy's: code ``http_error``) gets its status's hint."""
_HINTS_BY_STATUS = {401: _HINTS["unauthorized"], 403: _HINTS["forbidden"]}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fisher-atlas`` console script; returns the exit status."""
    from atlas.errors import AtlasError
    from service.client import AtlasClientError

    try:
        rc = app(args=list(argv) if argv is not None else None, prog_name="fisher-atlas", standalone_mode=False)
    except AtlasClientError as exc:
        print(terminal_safe(f"fisher-atlas: {exc.status} {exc.code}: {exc.message}" if exc.status
                            else f"fisher-atlas: {exc.message}")
              + (_HINTS.get(exc.code) or (_HINTS_BY_STATUS.get(exc.status, "") if exc.code == "http_error" else "")),
              file=sys.stderr)
        return exit_status(exc)
    except AtlasError as exc:  # a server-side command (migrate, serve, keys --local): the database, a setting
        print(terminal_safe(f"fisher-atlas: {exc.code}: {exc.message}"), file=sys.stderr)
        return 1
    except typer.Exit as exc:
        return int(exc.exit_code)
    except (BrokenPipeError, SystemExit) as exc:  # the reader of stdout went away (`| head`): quietly, as a shell
        # tool ends on SIGPIPE (typer turns the EPIPE into a bare exit 1, which read as "the service refused")
        cause = exc if isinstance(exc, BrokenPipeError) else exc.__context__
        if not (isinstance(cause, OSError) and cause.errno == errno.EPIPE):
            raise
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141
    except FileNotFoundError as exc:
        print(f"fisher-atlas: no such file: {exc.filename}", file=sys.stderr)
        return 1
    except OSError as exc:  # a directory, an unreadable file, ...
        print(f"fisher-atlas: {exc.filename or 'file'}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except UnicodeDecodeError as exc:
        print(f"fisher-atlas: a file is not valid UTF-8 (byte {exc.start})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # typer's (vendored) click usage errors and aborts
        show = getattr(exc, "show", None)
        if show is None and type(exc).__name__ != "Abort":
            raise
        if show is None:  # a question (``tasks delete``) with no answer: stdin is not a terminal, or it ended
            print("fisher-atlas: aborted: no answer to the question (pass --yes to skip it)", file=sys.stderr)
        if show is not None:
            show()
        return int(getattr(exc, "exit_code", 1))
    return rc if isinstance(rc, int) else 0
