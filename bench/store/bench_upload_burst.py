"""Peak server memory under a burst of concurrent uploads, with and without the cap on uploads handled at once.

One upload's memory is bounded by the body limit (``bench_upload_memory``); a burst of them is bounded by
``max_concurrent_uploads`` (service/upload_slots.py). For each cap the script starts a real service process
(``service.app:create_app``, the bundled model, SQLite, m = 256) on a free port, sends ``--uploads`` Parquet uploads
of ``--mb`` MB of content at once from as many threads, and reads the process's peak RSS (``VmHWM``) minus its
resident size before the burst. Every upload ends with one malformed row, so the server parses the whole file
and answers 422 with nothing stored: what is measured is the upload path alone. ::

    python -m bench.store.bench_upload_burst --uploads 12 --mb 4 --caps 4 1000
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from bench.store.bench_upload_memory import _status, _texts, machine, wait_until_up

SERVER = """
import sys, uvicorn
from atlas.settings import Settings
from service.app import create_app
s = Settings(data_dir=sys.argv[1], sketch_dim=256, device="cpu", max_concurrent_uploads=int(sys.argv[3]),
             upload_slot_wait_s=600, rate_limit_per_s=0)
uvicorn.run(create_app(s), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def parquet_upload(mb: float) -> bytes:
    """A completion-mode Parquet file of about ``mb`` MB of content whose last row lacks its completion."""
    half = _texts(int(mb * 1024 * 1024 / 2))
    buf = io.BytesIO()
    pq.write_table(pa.table({"prompt": [*half, "p"], "completion": [*half, None]}), buf, compression="zstd")
    return buf.getvalue()


def burst(cap: int, n_uploads: int, data: bytes, port: int) -> tuple[int, float, list[int]]:
    """``(peak RSS growth in bytes, seconds for the whole burst, statuses)`` of one server run at ``cap``."""
    tmp = tempfile.mkdtemp(prefix="fa-burst-")
    proc = subprocess.Popen([sys.executable, "-c", SERVER, tmp, str(port), str(cap)],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url)
        # one upload first: the lazily built parts (Arrow, the readers) are resident before the peak is reset
        httpx.post(f"{url}/v1/tasks", data={"name": "warm", "mode": "completion"},
                   files={"file": ("u.parquet", data)}, timeout=600)
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
        before = _status(proc.pid, "VmRSS")
        statuses: list[int] = []
        lock = threading.Lock()

        def send() -> None:
            r = httpx.post(f"{url}/v1/tasks", data={"name": "m", "mode": "completion"},
                           files={"file": ("u.parquet", data)}, timeout=600)
            with lock:
                statuses.append(r.status_code)

        threads = [threading.Thread(target=send) for _ in range(n_uploads)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        secs = time.perf_counter() - t0
        peak = max(_status(proc.pid, "VmHWM") - before, 0)
        assert httpx.get(f"{url}/v1/tasks").json()["total"] == 0
        return peak, secs, statuses
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--uploads", type=int, default=12, help="uploads sent at once")
    ap.add_argument("--mb", type=float, default=4.0, help="content of each upload, MB")
    ap.add_argument("--caps", type=int, nargs="+", default=[4, 1000], help="max_concurrent_uploads values")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=8771)
    ap.add_argument("--out", default="bench/results/upload_burst.md")
    args = ap.parse_args()
    data = parquet_upload(args.mb)
    results: dict[int, list[tuple[int, float]]] = {cap: [] for cap in args.caps}
    for rep in range(args.repeats):  # interleaved: the caps see the same machine load
        for cap in args.caps:
            peak, secs, statuses = burst(cap, args.uploads, data, args.port)
            assert statuses == [422] * args.uploads, statuses
            results[cap].append((peak, secs))
            print(f"repeat {rep} cap {cap:5d}: peak +{peak / 1e6:8.1f} MB, burst {secs:6.2f} s", flush=True)
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Upload memory under a burst: the cap on uploads handled at once",
        "",
        f"Machine: {machine()}; date {when}; the 2-core dev box, other jobs running.",
        "",
        "```bash",
        f"python -m bench.store.bench_upload_burst --uploads {args.uploads} --mb {args.mb:g} "
        f"--caps {' '.join(map(str, args.caps))} --repeats {args.repeats}",
        "```",
        "",
        f"A real service process per run (bundled model, SQLite, m = 256); {args.uploads} Parquet uploads "
        f"({len(data) / 1e6:.2f} MB each, {args.mb:g} MB of content, completion mode) sent at once, each ending in "
        "a malformed row (422, nothing stored). Peak RSS growth over the burst (`VmHWM` after it minus `VmRSS` "
        "before); medians of the repeats, the caps interleaved.",
        "",
        "| max_concurrent_uploads | peak server RSS growth (median) | per upload | burst time s (median) |",
        "|---:|---:|---:|---:|",
    ]
    for cap in args.caps:
        peak = statistics.median(p for p, _ in results[cap])
        secs = statistics.median(s for _, s in results[cap])
        lines.append(f"| {cap} | {peak / 1e6:.1f} MB | {peak / args.uploads / 1e6:.1f} MB | {secs:.2f} |")
    lines.append("")
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
