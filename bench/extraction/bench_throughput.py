"""Extraction throughput on this CPU, and the sketch's share of the time.

Usage::

    python -m bench.extraction.bench_throughput --samples 400 --m 4096

Runs the bundled model when ``workers/bundled_model`` exists (else a random GPT-2 of the same size,
n_embd=256, n_layer=4, vocab 8192) over texts of the shared multidomain corpus, twice:

1. extraction only: tokenise, forward, chunked logits and errors (``Extractor.iter_head_batches``);
2. the full job path: ``Extractor.extract`` with a FisherSketch sketcher and the baselines.

Prints one JSON object per run.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench.extraction.common import bench_model, load_texts, make_sketcher, samples_of
from workers.extraction import Extractor


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bundled", choices=["bundled", "random"])
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--token-budget", type=int, default=4096)
    p.add_argument("--logits-chunk", type=int, default=256)
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    lm, label = bench_model(args.model)
    samples = samples_of(load_texts(args.samples))
    ex = Extractor(lm, None, max_tokens_per_sample=args.max_tokens, token_budget=args.token_budget,
                   logits_chunk=args.logits_chunk)
    for _ in ex.iter_head_batches(samples[:16]):  # warm-up
        pass

    t0 = time.perf_counter()
    tokens = sum(len(hb) for hb in ex.iter_head_batches(samples))
    dt = time.perf_counter() - t0
    base = {"model": label, "d": lm.d, "K": lm.K, "samples": len(samples), "threads": args.threads,
            "token_budget": args.token_budget, "logits_chunk": args.logits_chunk}
    print(json.dumps({**base, "run": "extraction only", "tokens": tokens, "seconds": round(dt, 2),
                      "tokens_per_s": round(tokens / dt, 1)}), flush=True)

    sketcher = make_sketcher(lm, args.m)
    if sketcher is None:
        print(json.dumps({**base, "run": "with sketch", "skipped": "fishersketch not importable"}))
        return
    ex = Extractor(lm, sketcher, max_tokens_per_sample=args.max_tokens, token_budget=args.token_budget,
                   logits_chunk=args.logits_chunk)
    ex.extract(samples[:16])  # warm-up (projections drawn)
    res = ex.extract(samples, checkpoint_every=256)
    t = res.timings
    print(json.dumps({**base, "run": "with sketch", "m": args.m, "error_projection": sketcher.spec.error_projection,
                      "tokens": res.tokens, "seconds": round(res.elapsed_s, 2),
                      "tokens_per_s": round(res.tokens_per_s, 1),
                      "share": {k.removesuffix("_s"): round(v / res.elapsed_s, 3) for k, v in t.items()},
                      "skipped": res.skipped_reasons, "truncated": res.truncated}), flush=True)


if __name__ == "__main__":
    main()
