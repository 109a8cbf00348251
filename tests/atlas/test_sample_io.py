"""The sample readers and writers (atlas.sample_io): round trips through standard writers, limits, bombs.

Files are written here by the standard libraries (json, csv, pyarrow, plain text), not by the module
under test, and read back by :func:`atlas.sample_io.read_samples`; the store's own encoding is checked
the same way. Memory of the bomb uploads is measured in a fresh subprocess (peak RSS growth).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atlas import repository
from atlas.errors import InvalidInput, PayloadTooLarge
from atlas.file_formats import FILE_FORMATS, file_format
from atlas.sample_io import SampleLimits, read_samples
from atlas.sample_writers import text_representable, write_csv, write_parquet, write_text
from atlas.samples import Sample, check_metadata

ROOT = Path(__file__).resolve().parents[2]
SEPARATORS = ["\n", "\r", "\u0085", "\u2028", "\u2029", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c", "\x00"]
chars = st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from([*SEPARATORS, '"', ",", "\\", "\ufeff"]))
texts = st.text(alphabet=chars, max_size=40)
text_samples = st.lists(texts.map(lambda t: Sample(text=t)), min_size=1, max_size=8)
pair_samples = st.lists(st.builds(lambda p, c: Sample(prompt=p, completion=c), texts, texts), min_size=1, max_size=6)


def std_jsonl(samples: list[Sample], ascii_only: bool) -> bytes:
    return "".join(json.dumps(s.model_dump(exclude_none=True), ensure_ascii=ascii_only) + "\n"
                   for s in samples).encode("utf-8")


def std_csv(samples: list[Sample], keys: list[str], delimiter: str = ",") -> bytes:
    buf = io.StringIO(newline="")
    w = csv.writer(buf, delimiter=delimiter)
    w.writerow(keys)
    for s in samples:
        w.writerow([getattr(s, k) for k in keys])
    return buf.getvalue().encode("utf-8")


def std_parquet(samples: list[Sample], keys: list[str], compression: str = "zstd", dictionary: bool = True) -> bytes:
    buf = io.BytesIO()
    table = pa.table({k: pa.array([getattr(s, k) for s in samples], pa.string()) for k in keys})
    pq.write_table(table, buf, compression=compression, use_dictionary=dictionary)
    return buf.getvalue()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=text_samples, ascii_only=st.booleans(), fmt=st.sampled_from(["jsonl", "json", "csv", "parquet", "gz"]))
def test_text_round_trip_through_standard_writers(samples: list[Sample], ascii_only: bool, fmt: str) -> None:
    data = {
        "jsonl": lambda: std_jsonl(samples, ascii_only),
        "json": lambda: json.dumps([s.model_dump(exclude_none=True) for s in samples],
                                   ensure_ascii=ascii_only).encode(),
        "csv": lambda: std_csv(samples, ["text"]),
        "parquet": lambda: std_parquet(samples, ["text"]),
        "gz": lambda: gzip.compress(std_jsonl(samples, ascii_only)),
    }[fmt]()
    name = {"gz": "up.jsonl.gz"}.get(fmt, f"up.{fmt}")
    assert read_samples(data, name, "text") == samples
    assert read_samples(write_csv(samples, "text"), "w.csv", "text") == samples
    assert read_samples(write_parquet(samples, "text"), "w.parquet", "text") == samples
    # the store's encoding (gzip canonical JSONL) gives back the same samples, U+2028 & co included
    blob, _ = repository.encode_samples(samples)
    assert repository.decode_samples(blob) == samples


@settings(max_examples=40, deadline=None)
@given(samples=pair_samples, fmt=st.sampled_from(["jsonl", "csv", "parquet"]))
def test_completion_round_trip(samples: list[Sample], fmt: str) -> None:
    keys = ["prompt", "completion"]
    data = {"jsonl": lambda: std_jsonl(samples, False), "csv": lambda: std_csv(samples, keys),
            "parquet": lambda: std_parquet(samples, keys, compression="snappy")}[fmt]()
    assert read_samples(data, f"up.{fmt}", "completion") == samples


@settings(max_examples=40, deadline=None)
@given(samples=pair_samples, suffix=st.sampled_from([".tsv", ".tsv.gz", ".TSV"]))
def test_tsv_round_trip(samples: list[Sample], suffix: str) -> None:
    data = std_csv(samples, ["prompt", "completion"], delimiter="\t")
    assert read_samples(gzip.compress(data) if suffix.endswith(".gz") else data, f"up{suffix}",
                        "completion") == samples


@settings(max_examples=60, deadline=None)
@given(stem=st.text(alphabet="abcxyz_-0123456789", min_size=1, max_size=8),
       suffix=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=9),
       gz=st.booleans())
def test_an_unknown_file_type_is_refused_not_read_as_text(stem: str, suffix: str, gz: bool) -> None:
    """A ``.tsv`` read as plain text kept its header and tabs in every sample, a ``.jsonlines`` its JSON syntax,
    a ``.jsonl`` named ``.xlsx`` likewise: only the documented suffixes (and none) are read — a file without a
    suffix as plain text, unless its first line is a JSON object (a JSONL file that lost its suffix)."""
    name = f"{stem}.{suffix}" + (".gz" if gz else "")
    data = b'{"text": "hello world"}\n'
    if f".{suffix}" in FILE_FORMATS:
        assert file_format(name) == FILE_FORMATS[f".{suffix}"]
        return
    with pytest.raises(InvalidInput) as info:
        read_samples(gzip.compress(data) if gz else data, name, "text")
    assert info.value.detail["suffix"] == f".{suffix}" and ".txt" in info.value.message
    with pytest.raises(InvalidInput, match=r"first line is a JSON object; name it \.jsonl") as info:
        read_samples(data, stem, "text")  # no suffix: JSON lines were read as texts with their syntax (before)
    assert info.value.detail["suffix"] == ""
    assert read_samples(b"\n" + data.replace(b"{", b"{{"), stem, "text") == [Sample(text='{{"text": "hello world"}')]
    assert read_samples(b"hello world\n" + data, stem, "text") == [Sample(text="hello world"),
                                                                  Sample(text='{"text": "hello world"}')]
    assert read_samples(data, f"{stem}.jsonlines", "text") == [Sample(text="hello world")]


@settings(max_examples=60, deadline=None)
@given(samples=text_samples)
def test_plain_text_round_trip_where_representable(samples: list[Sample]) -> None:
    lines = [s for s in samples if text_representable(s)]
    if not lines:
        return
    data = "".join(s.text + "\n" for s in lines if s.text is not None).encode("utf-8")
    assert read_samples(data, "up.txt", "text") == lines
    assert write_text(lines) == data
    crlf = data.replace(b"\n", b"\r\n")
    assert read_samples(crlf, "up.txt", "text") == lines


@pytest.mark.parametrize("ch", ["\u0085", "\u2028", "\u2029", "\x1c", "\x1d", "\x1e"])
def test_line_separators_inside_jsonl_strings_raw_and_escaped(ch: str) -> None:
    sample = Sample(text=f"before{ch}after")
    for ascii_only in (True, False):  # escaped, then raw
        assert read_samples(std_jsonl([sample, sample], ascii_only), "a.jsonl", "text") == [sample, sample]


def test_parse_errors_are_4xx_naming_the_line_or_row() -> None:
    cases = [
        (b'{"text": "a"}\n{"text": \n', "a.jsonl", "line 2"),
        (b'{"text": "a"}\n[1]\n', "a.jsonl", "line 2"),
        (b'{"text": "a"}\n{"txt": "b"}\n', "a.jsonl", "line 2"),
        (b'{"text": "a"}\n{"text": 5}\n', "a.jsonl", "line 2"),
        (b'{"text": "\\ud800"}\n', "a.jsonl", "line 1"),
        (b"text\nok\n\xff\xfe\n", "a.txt", "line 3"),
        (b"text\nok\n", "a.csv", "column(s) ['prompt', 'completion']"),
        (b'[{"text": "a"}, {"text": 1}]', "a.json", "item 1"),
        # found by review (were 500s or silently altered rows):
        (b'[{"text": "\xff"}]', "a.json", "a.json is not valid UTF-8"),
        (b'{"text": "a", "n": ' + b"1" * 5001 + b"}\n", "a.jsonl", "line 1: a number in it has too many digits"),
        (b'[{"text": "a"}, {"text": "b", "n": ' + b"1" * 5001 + b"}]", "a.json", "item 1: a number"),
        (b'{"samples": [{"text": "a", "n": ' + b"1" * 5001 + b"}]}", "a.json", "too many digits"),
        (b"text\nhello, world and more\n", "b.csv", "row 2: 2 fields but the header has 1"),
        (b"prompt,completion\nWhat is 2+2, exactly?,4\n", "a.csv", "row 2: 3 fields"),
        (b"text,text\nfirst,second\n", "b.csv", "'text' more than once"),
    ]
    for data, name, where in cases:
        mode = "completion" if name == "a.csv" else "text"
        with pytest.raises(InvalidInput, match=None) as info:
            read_samples(data, name, mode)  # type: ignore[arg-type]
        assert info.value.status_code == 422 and where in info.value.message, (name, info.value.message)


def _parquet(columns: dict[str, list[str]]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table(columns), out)
    return out.getvalue()


@pytest.mark.parametrize(("data", "name", "mode", "says"), [
    # a table missing the mode's columns is refused once, for its header, not "row 2: missing field" (found by a
    # new-user walkthrough: a headerless CSV, a header in capitals, prompt/completion columns added as text)
    (b"CCO\nCCN\n", "smiles.csv", "text", "the header is ['CCO']: a table's first row names its columns"),
    (b"Text\nhello there\n", "a.csv", "text", "found ['Text']: column names are lower case"),
    (b"prompt,completion\nIs it?,yes\n", "a.csv", "text", "samples for a task of mode 'completion'"),
    (b"prompt\tcompletion\nIs it?\tyes\n", "a.tsv", "text", "samples for a task of mode 'completion'"),
    (b'{"prompt": "Is it?", "completion": " yes"}\n', "a.jsonl", "text", "samples for a task of mode 'completion'"),
    (b'[{"text": "hello there"}]', "a.json", "completion", "samples for a task of mode 'text'"),
    (b'{"txt": "hello there"}\n', "a.jsonl", "text", "the fields are ['txt']"),
    # a Parquet file without the column was "not a readable Parquet file: b'text'" (pyarrow's KeyError)
    (_parquet({"txt": ["hello there"]}), "a.parquet", "text", "missing column(s) ['text'] for mode 'text' "
                                                              "(the columns are ['txt'])"),
    (_parquet({"prompt": ["Is it?"], "completion": [" yes"]}), "a.parquet", "text", "for a task of mode 'completion'"),
])
def test_missing_fields_say_what_the_file_has_and_what_to_do(data: bytes, name: str, mode: str, says: str) -> None:
    with pytest.raises(InvalidInput) as info:
        read_samples(data, name, mode)  # type: ignore[arg-type]
    assert info.value.status_code == 422 and says in info.value.message, info.value.message
    assert "row 2" not in info.value.message  # the header's fault, said once


def test_csv_rows_may_end_in_empty_extra_fields() -> None:
    # a spreadsheet's trailing separators lose nothing: they are read, not refused
    assert read_samples(b"text\nhello world,,\n", "a.csv", "text") == [Sample(text="hello world")]


@pytest.mark.parametrize("name", ["a.txt.gz", "a.jsonl.gz", "a.csv.gz", "a.tsv"])
def test_blank_lines_are_bounded_like_samples(name: str) -> None:
    """64 MB of gzipped newlines held no sample but cost 20 s of CPU to walk (6 s as CSV): blank lines count
    against ``max_samples``; as many as that are fine."""
    lim = SampleLimits(max_samples=10)
    head = b"text\n" if ".csv" in name or ".tsv" in name else b""
    body = b'{"text": "a b"}\n' if "jsonl" in name else b"a b\n"
    pack = gzip.compress if name.endswith(".gz") else bytes
    assert len(read_samples(pack(head + b"\n" * 10 + body), name, "text", lim)) == 1
    with pytest.raises(PayloadTooLarge, match="more than 10 blank"):
        read_samples(pack(head + b"\n" * 11 + body), name, "text", lim)


def test_a_wide_csv_header_names_its_repeated_columns() -> None:
    """Repeated names are found with a Counter (``header.count`` per column was quadratic: a 9 MB header of 1M
    columns kept a core busy for hours). Only a column the mode reads must be named once (a review, 2026-12-07: a
    spreadsheet's export "text,label,,", or a repeated unused column, refused the whole file)."""
    header = ",".join([f"c{i}" for i in range(5000)] + ["text", "c7", "c9", "c7", "c9", "", ""])
    row = "," * 5000 + "a sample" + "," * 6
    assert read_samples((header + "\n" + row + "\n").encode(), "w.csv", "text") == [Sample(text="a sample")]
    with pytest.raises(InvalidInput, match="the header names 'text' more than once"):
        read_samples((header + ",text\n" + row + ",b\n").encode(), "w.csv", "text")
    pairs = b"prompt,completion,,\nQ1,A one,,\n"
    assert read_samples(pairs, "p.csv", "completion") == [Sample(prompt="Q1", completion="A one")]
    with pytest.raises(InvalidInput, match="'completion' more than once"):
        read_samples(b"prompt,completion,completion\nQ1,A,B\n", "p.csv", "completion")


@pytest.mark.parametrize(("data", "name", "mode", "row"), [
    (b"prompt,completion\nQ1,A one\nprompt,completion\nQ2,A two\n", "rh.csv", "completion", 3),
    (b"text,label\nfirst sample text,a\ntext,label\nsecond sample text,b\n", "rh.csv", "text", 3),
    (b"text\tlabel\nfirst sample\ta\ntext\tlabel\n", "rh.tsv", "text", 3),
])
def test_a_csv_row_repeating_the_header_is_refused_naming_it(data: bytes, name: str, mode: str, row: int) -> None:
    """Two files joined with ``cat`` stored the second header as a sample ("prompt" → "completion"), or skipped it
    as too short (a review, 2026-12-07): the row is named and nothing is stored."""
    with pytest.raises(InvalidInput, match=f"row {row} repeats the header row") as err:
        read_samples(data, name, mode)  # type: ignore[arg-type]
    assert err.value.detail == {"row": row}
    with pytest.raises(InvalidInput, match="repeats the header"):
        read_samples(gzip.compress(data), name + ".gz", mode)  # type: ignore[arg-type]


def test_a_repeated_header_is_found_behind_a_bom_and_empty_columns_and_one_column_files_keep_their_rows() -> None:
    """Two Excel "CSV UTF-8" exports joined: the second header starts with a BOM; a spreadsheet's header may end in
    empty columns — still the header (a review, 2026-12-07). A one-column file's row equal to its column's name is a
    sample (a word list holding "text"): kept, as before."""
    excel = b"\xef\xbb\xbftext,label\nhello,a\n"
    with pytest.raises(InvalidInput, match="row 3 repeats the header row"):
        read_samples(excel + excel, "joined.csv", "text")
    with pytest.raises(InvalidInput, match="row 3 repeats the header row"):
        read_samples(b"text,label,,\nhello,a,,\ntext,label\nworld,b,,\n", "j.csv", "text")
    assert read_samples(b"text\nhello\ntext\nworld\n", "words.csv", "text") == [
        Sample(text="hello"), Sample(text="text"), Sample(text="world")]


def test_json_errors_name_the_line_and_gzip_bytes_say_so() -> None:
    """A JSON file's syntax error was named by its column alone, JSON lines uploaded as .json said "Extra data",
    and gzip bytes under a name without .gz (or compressed twice) read "line 1 is not valid UTF-8" (a review,
    2026-12-07)."""
    with pytest.raises(InvalidInput, match=r"q.json is not valid JSON: .* \(line 3, column 17\)") as err:
        read_samples(b'{"samples": [\n {"text": "a b"},\n {"text": "c d",}\n]}', "q.json", "text")
    assert err.value.detail == {"line": 3}
    with pytest.raises(InvalidInput, match=r"Extra data \(line 2, column 1\); one JSON value a line is a JSON-lines"):
        read_samples(b'{"text": "a b"}\n{"text": "c d"}\n', "l.json", "text")
    with pytest.raises(InvalidInput, match=r"l.jsonl: line 4 is not valid JSON: .* \(column \d+\)$"):
        read_samples(b'{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n{"text": \n', "l.jsonl", "text")
    packed = gzip.compress(b'{"text": "a b"}\n')
    for data, name in ((packed, "s.jsonl"), (packed, "s.txt"), (gzip.compress(packed), "s.jsonl.gz"),
                       (gzip.compress(json.dumps([{"text": "a"}]).encode()), "s.json")):
        with pytest.raises(InvalidInput, match=r"gzip-compressed — a compressed upload's name ends in \.gz"):
            read_samples(data, name, "text")
    with pytest.raises(InvalidInput) as plain:  # other invalid UTF-8: no such hint
        read_samples(b"\xff\xfe broken\n", "s.txt", "text")
    assert "gzip" not in plain.value.message


def test_deeply_nested_json_is_422_not_recursion_error() -> None:
    deep = b'{"text": "a", "x": ' + b"[" * 40_000 + b"]" * 40_000 + b"}\n"  # (an item's 100,000 values: 413)
    with pytest.raises(InvalidInput, match="line 1: JSON nested too deeply"):
        read_samples(deep, "a.jsonl", "text")
    with pytest.raises(InvalidInput, match="nested too deeply"):
        read_samples(b"[" + deep.strip() + b"]", "a.json", "text")
    with pytest.raises(InvalidInput, match="nested deeper than 16"):
        check_metadata(json.loads("{" + '"a": {' * 20 + "}" * 20 + "}"))


@pytest.mark.parametrize("blob", [b"", b"PAR1", b"PAR1" + b"\0" * 64 + b"PAR1", b"not parquet at all",
                                  b"PAR1" + b"\x15\x04" * 40 + b"\x10\x00\x00\x00PAR1"])
def test_malformed_parquet_is_422(blob: bytes) -> None:
    with pytest.raises(InvalidInput) as info:
        read_samples(blob, "a.parquet", "text")
    assert info.value.status_code == 422


def test_corrupted_parquet_pages_are_422() -> None:
    good = std_parquet([Sample(text=f"sample number {i}") for i in range(500)], ["text"], dictionary=False)
    for offset in (8, 40, 100, len(good) // 2):
        bad = bytearray(good)
        bad[offset : offset + 16] = b"\xff" * 16
        with contextlib.suppress(InvalidInput, PayloadTooLarge):  # any 4xx; never another exception
            read_samples(bytes(bad), "a.parquet", "text")  # (a damaged page that still decodes is data)


def test_limits_stop_the_readers() -> None:
    lim = SampleLimits(max_samples=10, max_sample_chars=50, max_bytes=10_000)
    with pytest.raises(PayloadTooLarge, match="line 11"):
        read_samples(b"a\n" * 100, "a.txt", "text", lim)
    with pytest.raises(PayloadTooLarge, match="line 2"):
        read_samples(b'{"text": "a"}\n{"text": "' + b"x" * 60 + b'"}\n', "a.jsonl", "text", lim)
    with pytest.raises(PayloadTooLarge, match="row 2"):
        read_samples(b"text\n" + b"y" * 80 + b"\n", "a.csv", "text", lim)
    with pytest.raises(PayloadTooLarge):
        read_samples(std_parquet([Sample(text="z")] * 11, ["text"]), "a.parquet", "text", lim)
    with pytest.raises(PayloadTooLarge):  # gzip bomb: decompression stops at max_bytes
        read_samples(gzip.compress(b"\n" * 5_000_000), "a.txt.gz", "text", lim)
    with pytest.raises(PayloadTooLarge, match="bytes"):  # one line of 2 MB without a newline
        read_samples(b"x" * 2_000_000, "a.jsonl", "text", SampleLimits(max_sample_chars=50))
    # a plain-text line is one sample: over its bound in bytes it is said over the character limit, whatever its
    # script (a CJK line was told "longer than 202 bytes (its fields the reader does not use count too)")
    for line in ("长" * 70, "长" * 600, "x" * 600):
        with pytest.raises(PayloadTooLarge, match=r"line 2: the sample has (70 characters|more than 50 characters); "
                                                  r"the limit is 50") as info:
            read_samples(f"a\n{line}\nb\n".encode(), "a.txt", "text", lim)
        assert "bytes" not in info.value.message and "fields" not in info.value.message


MEMORY_SCRIPT = textwrap.dedent("""
    import gzip, io, json, resource, sys
    import pyarrow as pa, pyarrow.parquet as pq
    from atlas.errors import AtlasError
    from atlas.sample_io import read_samples
    kind = sys.argv[1]
    if kind == "text":
        data, name = b"a\\n" * 5_000_000, "lines.txt"
    elif kind == "jsonl":
        data, name = b'{"text":"a"}\\n' * 800_000, "lines.jsonl"
    elif kind == "json_element":  # one sample whose ignored field holds 5 M values (was built whole, then accepted)
        data, name = b'[{"text":"a","x":[' + b"{}," * 5_000_000 + b'{}]}]', "one.json"
    elif kind == "json_object":
        data, name = b'{"samples":[{"text":"a"}],"x":[' + b"{}," * 5_000_000 + b'{}]}', "object.json"
    elif kind == "zstd_dict":
        one = pa.DictionaryArray.from_arrays(pa.array([0] * 150_000, pa.int32()), pa.array(["a" * 90_000]))
        buf = io.BytesIO(); pq.write_table(pa.table({"text": one}), buf, compression="zstd")
        data, name = buf.getvalue(), "bomb.parquet"
    elif kind == "zstd_plain":
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": ["b" * 60_000] * 1200}), buf, compression="zstd", use_dictionary=False)
        data, name = buf.getvalue(), "bomb.parquet"
    elif kind.endswith(".parquet"):  # a file made beforehand in another process (its making is no part of the peak)
        data, name = open(kind, "rb").read(), "bomb.parquet"
    else:
        data, name = gzip.compress(b"c\\n" * 40_000_000), "bomb.txt.gz"
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        read_samples(data, name, "text")
        status = 200
    except AtlasError as exc:
        status = exc.status_code
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"status": status, "bytes": len(data), "grown_mb": grown / 1024}))
""")


def varint(n: int) -> bytes:
    """``n`` as a ULEB128 varint (Thrift's compact protocol, Parquet footers and page headers)."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _lying_footer(path: Path) -> str:
    """One page of 8 × 25 MB of one letter, zstd (~6 KB), whose footer says its column holds 2,000 bytes: the decoder
    allocates what the page header says (a security review, 2026-12-07: a 50 KB file took the API to 2.2 GB)."""
    import pyarrow as pa

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": ["a" * 25_000_000] * 8}), buf, compression="zstd", use_dictionary=False,
                   data_page_size=1 << 40, write_statistics=False)
    raw = bytearray(buf.getvalue())
    meta = pq.ParquetFile(io.BytesIO(bytes(raw))).metadata
    footer = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    for true in {meta.row_group(0).column(0).total_uncompressed_size, meta.row_group(0).total_byte_size}:
        enc = varint(2 * true)  # zigzag; 2,000 padded to the same varint length, so no offset moves
        small = bytearray(varint(2 * 2000))
        while len(small) < len(enc):
            small[-1] |= 0x80
            small.append(0)
        at = raw.find(enc, footer)
        while at >= 0:
            raw[at:at + len(enc)] = small
            at = raw.find(enc, at + len(enc))
    assert pq.ParquetFile(io.BytesIO(bytes(raw))).metadata.row_group(0).column(0).total_uncompressed_size == 2000
    path.write_bytes(bytes(raw))
    return str(path)


@pytest.mark.parametrize("kind", ["text", "jsonl", "json_element", "json_object", "zstd_dict", "zstd_plain",
                                  "lying_footer", "gzip"])
def test_bomb_uploads_keep_memory_bounded(kind: str, tmp_path: Path) -> None:
    if kind == "lying_footer":
        kind = _lying_footer(tmp_path / "lying.parquet")
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, kind], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["status"] == 413, res
    assert res["grown_mb"] < 100, res


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".csv.gz"])
def test_csv_names_the_line_of_invalid_utf8_and_splits_rows_at_newlines_only(suffix: str) -> None:
    """Invalid UTF-8 in a CSV was named at a row and byte of the decoder's read-ahead chunk ("near row 1 (byte 35)"
    for row 5; row 19439 for row 20000); a bare carriage return ended a row, splitting a sample a .txt upload kept
    whole. Now the line and its byte, as every other format; a bare \\r in an unquoted field is refused, in a quoted
    one kept."""
    def read(data: bytes) -> list[str]:
        raw = gzip.compress(data) if suffix.endswith(".gz") else data
        return [s.text for s in read_samples(raw, f"x{suffix}", "text")]

    with pytest.raises(InvalidInput, match=r"line 5 is not valid UTF-8 \(byte 3 of the line\)"):
        read(b"text\nr2 words\nr3 words\nr4 words\nbad\xffrow5\nr6 words\n")
    far = b"text\n" + b"".join(b"row %d\n" % i for i in range(2, 20000)) + b"bad\xff\n"
    with pytest.raises(InvalidInput, match="line 20000 is not valid UTF-8"):
        read(far)
    with pytest.raises(InvalidInput, match=r"row 2: malformed (CSV|TSV): a carriage return \(\\r\)"):
        read(b"text\r\nfirst sample\rsecond part of it\r\nthird sample here\r\n")
    assert read(b'text\r\n"first sample\rsecond part"\r\nthird sample here\r\n') == [
        "first sample\rsecond part", "third sample here"]
    assert read(b'\xef\xbb\xbftext\n"two\nlines"\nplain\n') == ["two\nlines", "plain"]  # BOM, quoted line break
    # paragraph breaks inside quoted fields are no blank rows (they were counted against the blank-line bound: 413)
    doc = '"para one\n\npara two\n\npara three\n\npara four"'
    raw = ("text\n" + "\n".join([doc] * 40) + "\n").encode()
    data = gzip.compress(raw) if suffix.endswith(".gz") else raw
    got = read_samples(data, f"x{suffix}", "text", SampleLimits(max_samples=100))
    assert len(got) == 40 and got[0].text == "para one\n\npara two\n\npara three\n\npara four"
    with pytest.raises(PayloadTooLarge, match="blank rows"):  # a file of newlines is still bounded
        read_samples(b"text\n" + b"\n" * 101, f"x{suffix.removesuffix('.gz')}", "text", SampleLimits(max_samples=100))


def test_a_parquet_column_of_lists_or_bytes_is_named_by_its_type() -> None:
    """A valid Parquet file whose text column holds lists read as "not a readable Parquet file: b'text'" (a KeyError
    of pyarrow's dictionary reader); a binary one as "not dictionary<values=binary, …>"."""
    for values, kind in (([["a b", "c d"], ["e f"]], "list<element: string>"), ([b"ab", b"cd"], "binary"),
                         ([1, 2], "int64")):
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": values}), buf)
        with pytest.raises(InvalidInput) as info:
            read_samples(buf.getvalue(), "x.parquet", "text")
        assert info.value.message == f"x.parquet: column 'text' must hold strings, not {kind}", info.value.message


def test_a_json_array_is_bounded_per_item_not_in_total() -> None:
    """A wide table as one JSON array (pandas' ``to_json(orient="records")``: 45,000 rows of 21 fields) passed a
    bound on the whole file's values and was refused, though read one element at a time (a review, 2026-12-07):
    each element is bounded now, as a line of JSON lines is; any other document still in total."""
    rows = [{"text": f"molecule {i}", **{f"f{j}": j for j in range(40)}} for i in range(3_000)]
    lim = SampleLimits(max_samples=3_000)  # 124,000 values in total: these rows hold about 246,000
    assert len(read_samples(json.dumps(rows).encode(), "wide.json", "text", lim)) == 3_000
    huge = [{"text": "a b"}, {"text": "c d", "ignored": list(range(150_000))}]
    with pytest.raises(PayloadTooLarge, match=r"wide\.json: item 1 holds more than 100000 JSON values"):
        read_samples(json.dumps(huge).encode(), "wide.json", "text", lim)
    with pytest.raises(PayloadTooLarge, match="holds more than 124000 JSON values"):
        read_samples(json.dumps({"samples": rows}).encode(), "wide.json", "text", lim)
    # more elements than samples allowed: refused as soon as the scan counts them (the scan walked every token of
    # a 64 MB file of {} first: 16 s of CPU; a review, 2026-12-07)
    with pytest.raises(PayloadTooLarge, match=r"many\.json holds more than 3000 samples"):
        read_samples(b"[" + b",".join([b"{}"] * 3_001) + b"]", "many.json", "text", lim)
    from atlas.json_bounds import first_item_over
    assert first_item_over(b"[" + b",".join([b"{}"] * 10) + b"]", 100, max_items=4) == 4
    assert first_item_over(b"[" + b",".join([b"{}"] * 4) + b"]", 100, max_items=4) is None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.recursive(st.none() | st.integers() | st.text(max_size=5),
                             lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=3), kids,
                                                                                     max_size=4),
                             max_leaves=30), max_size=8),
       st.integers(0, 40))
def test_first_item_over_counts_each_element_s_tokens(items: list[object], limit: int) -> None:
    from atlas.json_bounds import first_item_over, json_token_count

    data = json.dumps(items).encode()
    counts = [json_token_count(json.dumps(x).encode(), 10**9) for x in items]
    expected = next((i for i, n in enumerate(counts) if n > limit), None)
    assert first_item_over(data, limit) == expected


def test_a_parquet_footer_that_understates_its_pages_is_refused_before_a_page_is_decoded(tmp_path: Path) -> None:
    """The page headers' sizes are summed before pyarrow decodes anything: the file is refused on what its pages
    declare (8 × 25 MB), not after a batch of them was decompressed and a value found too long."""
    data = Path(_lying_footer(tmp_path / "lying.parquet")).read_bytes()
    with pytest.raises(PayloadTooLarge, match=r"the columns hold 2000\d{5} bytes uncompressed"):
        read_samples(data, "bomb.parquet", "text")
    good = std_parquet([Sample(text=f"sample number {i}") for i in range(300)], ["text"])
    assert len(read_samples(good, "good.parquet", "text")) == 300  # a true footer reads as before


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.text(alphabet=st.characters(codec="latin-1", exclude_categories=("Cc", "Zs")), min_size=2,
                              max_size=40), min_size=1, max_size=4),
       encoding=st.sampled_from(["utf-16-le", "utf-16-be", "utf-16"]), suffix=st.sampled_from([".txt", ".jsonl", ""]))
def test_utf16_text_is_refused_not_stored_with_a_nul_per_character(lines: list[str], encoding: str,
                                                                   suffix: str) -> None:
    """A UTF-16 ``.txt`` without a byte-order mark is valid UTF-8 with a NUL beside every character: it was stored as
    ``f\\x00i\\x00r\\x00…`` plus a sample ``\\x00`` per line end (a data-integrity review, 2026-12-07); with a mark it
    was "not valid UTF-8 (byte 0)". The same lines in UTF-8 read as they are. (Without a mark, text of Latin-1
    characters is what is told: a NUL beside every character.)"""
    text = "".join(f"{line}\n" for line in lines)
    for head in ("", "\n", "a\n"):  # a first line blank or of one character passed a check of line 1 alone
        with pytest.raises(InvalidInput, match="the file is UTF-16 text"):
            read_samples((head + text).encode(encoding), f"notes{suffix}", "text")
    if suffix == ".txt":
        assert read_samples(text.encode(), "notes.txt", "text") == [Sample(text=line) for line in lines]


def test_a_json_document_without_a_suffix_is_refused() -> None:
    """A ``.json`` file that lost its suffix was stored a line a sample — ``[``, ``  {``, ``    "text": …`` (a
    data-integrity review, 2026-12-07); a first line of JSON object, array, or a lone ``{`` / ``[`` is refused."""
    for data in (json.dumps([{"text": "first sample"}], indent=2), json.dumps({"samples": [{"text": "a b"}]}, indent=1),
                 '[{"text": "one"}]\n', '{"text": "one"}\n'):
        with pytest.raises(InvalidInput, match="a file without a suffix is read as plain text"):
            read_samples(data.encode(), "samples", "text")
    assert read_samples(b"[citation needed] is text\n{braces} too\n", "notes", "text") == [
        Sample(text="[citation needed] is text"), Sample(text="{braces} too")]


def test_metadata_limits_hold_at_their_bounds() -> None:
    """A byte or a level more than the limit is refused, the limit itself taken (no test held either bound)."""
    from atlas.samples import MAX_METADATA_BYTES, MAX_METADATA_DEPTH

    def nested(levels: int) -> dict[str, object]:
        value: dict[str, object] = {}
        for _ in range(levels - 1):
            value = {"a": value}
        return value

    assert check_metadata(nested(MAX_METADATA_DEPTH))
    with pytest.raises(InvalidInput, match=r"nested deeper than \d+ levels"):
        check_metadata(nested(MAX_METADATA_DEPTH + 1))
    frame = len(json.dumps({"k": ""}, separators=(",", ":")).encode())
    assert check_metadata({"k": "é" * ((MAX_METADATA_BYTES - frame) // 2)})  # two bytes a character: at the limit
    with pytest.raises(InvalidInput, match=f"has {MAX_METADATA_BYTES + 1} bytes as JSON; the limit is "
                                           f"{MAX_METADATA_BYTES}"):
        check_metadata({"k": "x" * (MAX_METADATA_BYTES - frame + 1)})
