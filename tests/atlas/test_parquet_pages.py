"""The Parquet page-header walk (:mod:`atlas.parquet_pages`): every file pyarrow writes reads as before, and crafted
headers and footers are refused at once (a review of the walk, 2026-12-07: a map of 2**62 booleans looped for good;
row groups all pointing at one region of tiny pages took seconds of CPU per 100 KB)."""

from __future__ import annotations

import io
import signal
import struct
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas.errors import InvalidInput
from atlas.parquet_pages import declared_page_bytes
from atlas.sample_io import read_samples
from tests.atlas.test_sample_io import varint


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail a read that runs past 10 s (one that loops for good)."""
    def stop(*_: object) -> None:
        raise TimeoutError("still reading after 10 s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.text(alphabet="abcdefgh é\u4e2d", max_size=300).map(lambda t: f"x{t}y"), min_size=1,
                     max_size=120),
       compression=st.sampled_from(["none", "snappy", "gzip", "zstd"]), dictionary=st.booleans(),
       version=st.sampled_from(["1.0", "2.0"]), statistics=st.booleans(), page=st.sampled_from([64, 1024, 1 << 20]),
       groups=st.integers(1, 4))
def test_every_file_pyarrow_writes_reads_as_before(rows: list[str], compression: str, dictionary: bool,
                                                   version: str, statistics: bool, page: int, groups: int) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": rows, "other": list(range(len(rows)))}), buf, compression=compression,
                   use_dictionary=dictionary, data_page_version=version, write_statistics=statistics,
                   data_page_size=page, row_group_size=max(1, len(rows) // groups))
    meta = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata
    declared = declared_page_bytes(io.BytesIO(buf.getvalue()), meta, ["text"], "f.parquet")
    footer = sum(meta.row_group(g).column(0).total_uncompressed_size for g in range(meta.num_row_groups))
    assert 0 < declared <= footer  # the pages' own sizes, without their headers
    assert [s.text for s in read_samples(buf.getvalue(), "f.parquet", "text")] == rows


def test_a_map_of_booleans_counting_2_62_entries_is_refused_at_once(deadline: None) -> None:
    """A map's boolean entries take a byte each; a count past the bytes left is refused, not looped over."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": ["a" * 200]}), buf, use_dictionary=False, compression="none")
    data = bytearray(buf.getvalue())
    at = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(0).column(0).data_page_offset
    header = bytes([0x15, 0x00, 0x15]) + varint(20) + bytes([0x15, 0x00, 0x6B]) + varint(2**62) + bytes([0x11, 0x00])
    data[at:at + len(header)] = header
    t0 = time.monotonic()
    with pytest.raises(InvalidInput, match="not a readable Parquet file"):
        read_samples(bytes(data), "x.parquet", "text")
    assert time.monotonic() - t0 < 2


def test_row_groups_pointing_at_the_same_pages_are_refused(deadline: None) -> None:
    """A footer of 300 row groups whose chunks all span one region of 2,000 empty page headers."""
    def zz(n: int) -> bytes:
        return varint((n << 1) ^ (n >> 63))

    class Footer:
        def __init__(self) -> None:
            self.b, self.last = bytearray(), [0]

        def field(self, fid: int, kind: int) -> None:
            delta = fid - self.last[-1]
            self.b += bytes([(delta << 4) | kind]) if 0 < delta <= 15 else bytes([kind]) + zz(fid)
            self.last[-1] = fid

        def i32(self, fid: int, v: int) -> None:
            self.field(fid, 5)
            self.b += zz(v)

        def i64(self, fid: int, v: int) -> None:
            self.field(fid, 6)
            self.b += zz(v)

        def text(self, fid: int, v: str) -> None:
            self.field(fid, 8)
            self.b += varint(len(v)) + v.encode()

        def structs(self, fid: int, n: int) -> None:
            self.field(fid, 9)
            self.b += bytes([(n << 4) | 12]) if n < 15 else bytes([0xFC]) + varint(n)

        def begin(self, fid: int | None = None) -> None:
            if fid is not None:
                self.field(fid, 12)
            self.last.append(0)

        def end(self) -> None:
            self.b.append(0)
            self.last.pop()

    region = bytes([0x15, 0x00, 0x15, 0x00, 0x15, 0x00, 0x00]) * 2000
    f = Footer()
    f.i32(1, 1)
    f.structs(2, 2)
    f.begin(), f.text(4, "schema"), f.i32(5, 1), f.end()
    f.begin(), f.i32(1, 6), f.i32(3, 1), f.text(4, "text"), f.i32(6, 0), f.end()
    f.i64(3, 0)
    f.structs(4, 300)
    for _ in range(300):
        f.begin()
        f.structs(1, 1)
        f.begin(), f.i64(2, 4)
        f.begin(3), f.i32(1, 6)
        f.field(2, 9)
        f.b += bytes([0x15]) + zz(0)
        f.field(3, 9)
        f.b += bytes([0x18]) + varint(4) + b"text"
        f.i32(4, 0), f.i64(5, 0), f.i64(6, 10), f.i64(7, len(region)), f.i64(9, 4), f.end()
        f.end()
        f.i64(2, 10), f.i64(3, 0), f.end()
    f.b.append(0)
    data = b"PAR1" + region + bytes(f.b) + struct.pack("<i", len(f.b)) + b"PAR1"
    assert pq.ParquetFile(io.BytesIO(data)).metadata.num_row_groups == 300
    t0 = time.monotonic()
    with pytest.raises(InvalidInput, match="overlap another column chunk"):
        read_samples(data, "x.parquet", "text")
    assert time.monotonic() - t0 < 2
