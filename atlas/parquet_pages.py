"""The page sizes a Parquet file declares, read from its page headers before any page is decompressed.

A Parquet footer declares each column chunk's uncompressed size, but the decoder allocates what each *page header*
declares, and the two need not agree: a 50 KB upload whose footer said 2,000 bytes held pages of 25 MB of zstd
zeros each, and reading one batch of it took the API from 0.5 to 2.2 GB of memory before the decoded-size check
could refuse it (a security review, 2026-12-07). :func:`declared_page_bytes` walks the pages of the columns a mode
reads — each page header (Thrift compact protocol, :class:`_Compact`) gives its uncompressed and compressed sizes,
and the next header follows the compressed bytes — and sums what they declare, so the upload is refused before
pyarrow decodes a page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any

from atlas.errors import InvalidInput

HEADER_READ = 4 * 1024
"""Bytes read first for a page header (one with long statistics is read again, 4 times as far, as needed)."""
MAX_HEADER_BYTES = 1024 * 1024
"""Longest page header read (writers bound its statistics: Arrow drops those over 4 KiB)."""
MAX_PAGES = 200_000
"""Most pages walked in one file (64 MB in pages of 1 KB is 64,000; a file of tiny headers was seconds of CPU)."""
MAX_DEPTH = 16
"""Deepest Thrift struct nesting of a page header (a Parquet header nests three levels)."""


class _Truncated(Exception):
    """The header runs past the bytes read so far."""


class _Compact:
    """A reader of Thrift's compact protocol over ``data``, as far as a Parquet page header needs."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise _Truncated
        b = self.data[self.at]
        self.at += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0:
            raise ValueError("a negative length")
        if self.at + n > len(self.data):
            raise _Truncated
        self.at += n

    def size(self, n: int) -> int:
        """A container's element count, checked against the bytes left (each element takes one at least): a
        count of 2**62 read nothing and looped for good."""
        if n > len(self.data) - self.at:
            raise _Truncated
        return n

    def skip(self, kind: int, depth: int, *, element: bool = False) -> None:
        """Skip one value of compact type ``kind``; a boolean takes a byte as a container's element, none as a
        field (its value is in the field's header)."""
        if depth > MAX_DEPTH:
            raise ValueError("nested too deep")
        if kind in (1, 2):
            if element:
                self.skip_bytes(1)
            return
        if kind == 3:
            self.skip_bytes(1)
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.skip_bytes(8)
        elif kind == 8:
            self.skip_bytes(self.varint())
        elif kind in (9, 10):
            head = self.byte()
            count, of = head >> 4, head & 0x0F
            if count == 15:
                count = self.varint()
            for _ in range(self.size(count)):
                self.skip(of, depth + 1, element=True)
        elif kind == 11:
            size = self.size(self.varint())
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1, element=True)
                    self.skip(types & 0x0F, depth + 1, element=True)
        elif kind == 12:
            self.struct(depth + 1)
        else:
            raise ValueError(f"an unknown compact type {kind}")

    def struct(self, depth: int, wanted: Sequence[int] = ()) -> dict[int, int]:
        """Read a struct to its stop byte; the i32 values of the ``wanted`` field ids."""
        got: dict[int, int] = {}
        field = 0
        while True:
            head = self.byte()
            if head == 0:
                return got
            kind, delta = head & 0x0F, head >> 4
            field = field + delta if delta else self.zigzag()
            if field in wanted and kind == 5:
                got[field] = self.zigzag()
            else:
                self.skip(kind, depth)


def _page_header(stream: IO[bytes], at: int) -> tuple[int, int, int]:
    """``(uncompressed size, compressed size, header length)`` of the page header at byte ``at``."""
    size = HEADER_READ
    while True:
        stream.seek(at)
        data = stream.read(size)
        reader = _Compact(data)
        try:
            got = reader.struct(0, wanted=(2, 3))
        except _Truncated:
            if len(data) < size or size >= MAX_HEADER_BYTES:
                raise ValueError("a page header runs past its column chunk or the file") from None
            size *= 4
            continue
        if 2 not in got or 3 not in got:
            raise ValueError("a page header without its sizes")
        return got[2], got[3], reader.at


def declared_page_bytes(stream: IO[bytes], metadata: Any, columns: Sequence[str], filename: str) -> int:
    """Uncompressed bytes the page headers of ``columns`` declare, summed over every row group.

    Parameters
    ----------
    stream : binary file, seekable
        The Parquet file.
    metadata : pyarrow.parquet.FileMetaData
        Its footer (where each column chunk's pages start and how many compressed bytes they span).
    columns : sequence of str
        The columns read (a mode's fields).
    filename : str
        Named in errors.

    Returns
    -------
    int

    Raises
    ------
    InvalidInput
        A page header cannot be read, or declares a negative size.
    """
    stream.seek(0, 2)
    size = stream.tell()
    spans: list[tuple[int, int, str, int]] = []  # (start, end, column, row group) of each chunk read
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema not in columns:
                continue
            starts = [int(x) for x in (chunk.dictionary_page_offset, chunk.data_page_offset)
                      if x is not None and int(x) > 0]
            start = min(starts) if starts else 0
            spans.append((start, start + max(int(chunk.total_compressed_size), 0), chunk.path_in_schema, g))
    spans.sort()
    total = pages = 0
    previous_end = 4  # after the leading "PAR1"
    for start, end, column, g in spans:
        try:  # chunks lie in the file, apart: several row groups pointing at the same pages were walked again each
            if start < previous_end or end > size - 8:
                raise ValueError("its pages overlap another column chunk's or lie outside the file")
            previous_end = at = start
            while at < end:
                uncompressed, compressed, header = _page_header(stream, at)
                if uncompressed < 0 or compressed < 0:
                    raise ValueError("a negative page size")
                pages += 1
                if pages > MAX_PAGES:
                    raise ValueError(f"more than {MAX_PAGES} pages")
                total += uncompressed
                at += header + compressed
            previous_end = max(at, end)
        except (ValueError, OSError) as exc:
            raise InvalidInput(f"{filename}: not a readable Parquet file: column {column!r}, row group {g}: "
                               f"{exc}") from None
    return total
