"""Where the client writes an export: a path (through a temporary file, or in place for what is not a regular
file), a descriptor of this process, or an open binary file (:meth:`AsyncAtlasClient.download_export`); and what it
sends of one to import (:func:`import_source`)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import io
import os
import re
import shutil
import stat
import tempfile
import zlib
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast

from service.client.errors import InvalidInput

_DESCRIPTOR_PATH = re.compile(r"^/(?:dev/fd|proc/self/fd)/(\d+)$")


def descriptor_of(path: Path) -> int | None:
    """The file descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/fd/3``), or ``None``."""
    named = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}.get(str(path))
    found = _DESCRIPTOR_PATH.match(str(path))
    return named if named is not None else int(found.group(1)) if found else None


async def write_export(out: str | os.PathLike[str] | BinaryIO,
                       stream_into: Callable[[BinaryIO], Awaitable[int]]) -> int:
    """Write what ``stream_into(stream)`` streams into ``out``; the bytes written.

    Parameters
    ----------
    out : path or writable binary file
        A path naming a regular file, or none yet, is written whole or not at all, through a temporary file of its
        own beside it (two downloads to one path shared one); a symbolic link's target is written so and the link
        kept. ``/dev/stdout``, ``/dev/stderr`` and ``/dev/fd/N`` are written through the descriptor itself, at its
        offset (a shell's ``{ echo a; export; } > f`` keeps its ``a``); descriptor 0 is refused (opened for writing,
        the file redirected into stdin was emptied). A FIFO, a terminal, another file that is not regular and other
        paths under ``/dev`` or ``/proc`` are written in place, as a shell's ``>`` would (they were replaced by a new
        regular file). A binary file is written as the data arrives. A regular file named ``*.gz`` is gzipped.
    stream_into : callable
        Writes the export into the stream it is given (raising leaves a temporary file's target as it was).

    Raises
    ------
    InvalidInput
        ``out`` names standard input.
    OSError
        ``out`` is a directory or in none, or cannot be written; named by the path given.
    """
    if not isinstance(out, str | os.PathLike):
        return await stream_into(out)
    path = Path(os.fspath(out))
    try:
        mode: int | None = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file to write", str(path))
    fd = descriptor_of(path)
    if fd == 0:
        raise InvalidInput(0, "invalid_input", f"{path} is this process's standard input, not an output")
    if fd is not None:  # this process's own stdout, say: written at its offset, never truncated
        with os.fdopen(os.dup(fd), "wb") as stream:
            return await stream_into(stream)
    if mode is not None and (not stat.S_ISREG(mode) or path.absolute().parts[1:2] in (("dev",), ("proc",))):
        stream = await asyncio.to_thread(path.open, "wb")  # a FIFO's open waits for its reader
        with stream:
            return await stream_into(stream)
    target = Path(os.path.realpath(path))  # a symbolic link's target: the link stays
    if not target.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such directory", str(target.parent))
    partial: Path | None = None
    try:
        handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
        partial = Path(name)
        with os.fdopen(handle, "wb") as stream:
            if target.name.lower().endswith(".gz"):  # named so, compressed so (an import reads either)
                with gzip.GzipFile(fileobj=stream, mode="wb", filename="", mtime=0) as packed:
                    written = await stream_into(cast(BinaryIO, packed))
            else:
                written = await stream_into(stream)
        # the mode a file written with open() would have (an existing target's own): mkstemp's 0600 replaced a
        # shared backup's 0664 and ignored the umask
        partial.chmod(stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
        partial.replace(target)
    except OSError as exc:
        if partial is not None and exc.filename not in (str(partial), None):
            raise
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None  # named by the path given
    finally:
        if partial is not None:
            partial.unlink(missing_ok=True)
    return written


@contextmanager
def import_source(file: str | os.PathLike[str] | bytes | BinaryIO) -> Iterator[bytes | BinaryIO]:
    """What an import sends of ``file``: bytes as they are, a regular file open (streamed from disk), and a pipe, FIFO
    or open binary stream (``sys.stdin.buffer``) copied to a temporary file first — an upload is sized by its file's
    length, which a pipe does not have (its import failed with "Too much data for declared Content-Length"). A gzipped
    export (its first bytes say so, whatever its name) is sent decompressed (it was "not a FisherAtlas space export
    header")."""
    if isinstance(file, bytes) and not file.startswith(GZIP_MAGIC):
        yield file
        return
    with contextlib.ExitStack() as stack:
        if isinstance(file, bytes):  # gzipped: decompressed to a file, as a stream's is (not into memory)
            file = io.BytesIO(file)
        if isinstance(file, str | os.PathLike):
            stream: BinaryIO = stack.enter_context(Path(os.fspath(file)).open("rb"))
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                stream = stack.enter_context(_spooled(stream))
        else:
            stream = stack.enter_context(_spooled(file))
        if stream.read(len(GZIP_MAGIC)) == GZIP_MAGIC:
            stream.seek(0)
            try:
                stream = stack.enter_context(_spooled(cast(BinaryIO, gzip.GzipFile(fileobj=stream, mode="rb"))))
            except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # cut short or damaged, as the service says it
                raise InvalidInput(0, "invalid_input", f"the export is gzipped but cannot be decompressed ({exc})"
                                   ) from None
        stream.seek(0)
        yield stream


GZIP_MAGIC = b"\x1f\x8b"


@contextmanager
def _spooled(stream: BinaryIO) -> Iterator[BinaryIO]:
    """The rest of ``stream`` in a temporary file, at its start."""
    with tempfile.TemporaryFile() as copy:
        shutil.copyfileobj(stream, copy, 1 << 20)
        copy.seek(0)
        yield copy


def _umask() -> int:
    """This process's umask: read from ``/proc/self/status`` where there is one (setting it to read it, then putting it
    back, races with other threads creating files meanwhile), else so."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
