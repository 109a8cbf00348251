"""A completion job's routing phase: the prompts sketched one at a time vs batched, beside the job's extraction.

Usage::

    python -m bench.extraction.bench_prompt_pass --pairs 128 --repeats 2 --threads 2

BoolQ validation pairs (``shared/data/superglue``, passage / question / "Answer:" → " yes" | " no"), the bundled
model, m = 4096, 512-token cap (the service defaults). In one process, alternating: the previous routing pass
(``Extractor.prompt`` per prompt, merged) and :func:`workers.calibration.prompt_side` (length-bucketed batches);
then the job's completion-mode extraction of the same pairs. Medians over ``--repeats``; prints one Markdown line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from atlas import routing
from atlas.errors import InvalidInput
from atlas.samples import Sample
from bench.extraction.common import service_extractor
from workers import calibration
from workers.extraction import Extractor

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "superglue" / "BoolQ_val.jsonl"


def one_at_a_time(ex: Extractor, samples: list[Sample]) -> object:
    """The routing pass before batching: one forward and one sketch per prompt, merged."""
    pick, total = set(routing.calibration_pick(len(samples))), None
    cal = []
    for i, s in enumerate(samples):
        try:
            st = ex.prompt(s.prompt or "").state
        except InvalidInput:
            continue
        total = st.copy() if total is None else total.merge(st)
        if i in pick:
            cal.append(st)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    ex = service_extractor(args.threads)
    rows = [json.loads(line) for line in DATA.open()][: args.pairs]
    samples = [Sample(prompt=f"{r['passage']}\nQuestion: {r['question']}?\nAnswer:",
                      completion=" yes" if r["label"] else " no") for r in rows]
    alone, batched = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        a = one_at_a_time(ex, samples)
        alone.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        side = calibration.prompt_side(ex, samples, "completion")
        batched.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ex.extract(samples, mode="completion")
    extraction = time.perf_counter() - t0
    assert side is not None and side.prompt_sum is not None
    cos = float(a.signature() @ side.prompt_sum.signature())  # type: ignore[attr-defined]
    tokens = sum(len(ex.sample_tokenizer.prepare([Sample(text=s.prompt or "")], "text")[0][0].input_ids)
                 for s in samples)
    m_alone, m_batched = statistics.median(alone), statistics.median(batched)
    print(f"| {args.pairs} BoolQ pairs ({tokens:,} prompt tokens) | {m_alone:.1f} s | {m_batched:.1f} s | "
          f"{m_alone / m_batched:.2f}x | {extraction:.1f} s | {cos:.7f} | {platform.processor() or 'cpu'}, "
          f"{args.threads} threads |")


if __name__ == "__main__":
    main()
