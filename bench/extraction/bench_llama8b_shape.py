"""Peak memory and tokens/s at a Llama-3.1-8B head shape, with and without logits chunking.

Usage::

    python -m bench.extraction.bench_llama8b_shape            # all configurations, one subprocess each
    python -m bench.extraction.bench_llama8b_shape --one --seq 1024 --chunk 256
    python -m bench.extraction.bench_llama8b_shape --speed --seq 1024 --chunk 256 0 --m 4096   # tokens/s

Model: ``LlamaForCausalLM`` with random weights at the Llama-3.1-8B widths (hidden 4096, intermediate
14336, 32 heads / 8 KV heads, vocab 128,256) but only ``--layers`` decoder layers and *tied* input/output
embeddings (the head shape and cost are those of the 8B model; tying saves 2 GiB of RAM on this shared
machine). float32 on CPU.

Memory is measured, not assumed: each configuration runs in a fresh subprocess; after the model is
built and warmed up, the kernel's peak-RSS counter is reset (``/proc/self/clear_refs``) and the peak
(``VmHWM``) after extraction minus the RSS before it is the extraction's peak on top of the weights.
"No chunking" means ``logits_chunk`` ≥ all positions, i.e. full (T, K) logits exist at once, as in a
plain forward.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch


def one(seq: int, chunk: int, layers: int, m: int, threads: int) -> dict[str, object]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from atlas.samples import Sample
    from bench.extraction.common import current_rss_mib, make_sketcher, max_rss_mib, reset_peak_rss
    from tests.tiny_models import build_tokenizer
    from workers.extraction import Extractor
    from workers.model_loading import LoadedModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         tie_word_embeddings=True, rope_theta=500_000.0)
    model = LlamaForCausalLM(config)
    lm = LoadedModel.from_model(model, build_tokenizer(), name="llama3.1-8b-shape", verify=False)
    text = "The quick brown fox jumps over the lazy dog. " * (seq // 4)
    ex = Extractor(lm, None, max_tokens_per_sample=seq, token_budget=seq, logits_chunk=chunk)
    for _ in ex.iter_head_batches([Sample(text=text[:200])]):  # warm-up
        pass
    before = current_rss_mib()
    if not reset_peak_rss():
        raise SystemExit("cannot reset the peak-RSS counter (/proc/self/clear_refs); no memory measurement")
    t0 = time.perf_counter()
    tokens = sum(len(hb) for hb in ex.iter_head_batches([Sample(text=text)]))
    dt = time.perf_counter() - t0
    peak = max_rss_mib()
    out: dict[str, object] = {"layers": layers, "seq": seq, "logits_chunk": chunk, "tokens": tokens,
                              "extract_tokens_per_s": round(tokens / dt, 1), "rss_weights_mib": round(before),
                              "peak_extra_mib": round(peak - before)}
    if m > 0:
        sketcher = make_sketcher(lm, m)
        if sketcher is not None:
            ex = Extractor(lm, sketcher, max_tokens_per_sample=seq, token_budget=seq, logits_chunk=chunk)
            ex.extract([Sample(text=text[:200])])
            before = current_rss_mib()
            reset_peak_rss()
            res = ex.extract([Sample(text=text)])
            out.update({"m": m, "with_sketch_tokens_per_s": round(res.tokens_per_s, 1),
                        "sketch_share": round(res.timings["sketch_s"] / res.elapsed_s, 3),
                        "peak_extra_with_sketch_mib": round(max_rss_mib() - before)})
    return out


def speed(seq: int, chunks: list[int], layers: int, m: int, threads: int, reps: int) -> list[dict[str, object]]:
    """Tokens/s of several ``logits_chunk`` values, interleaved in one process (fair on a busy machine)."""
    import statistics

    from transformers import LlamaConfig, LlamaForCausalLM

    from atlas.samples import Sample
    from bench.extraction.common import make_sketcher
    from tests.tiny_models import build_tokenizer
    from workers.extraction import Extractor
    from workers.model_loading import LoadedModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         tie_word_embeddings=True, rope_theta=500_000.0)
    lm = LoadedModel.from_model(LlamaForCausalLM(config), build_tokenizer(), name="llama3.1-8b-shape", verify=False)
    sample = [Sample(text="The quick brown fox jumps over the lazy dog. " * (seq // 4))]
    sketcher = make_sketcher(lm, m) if m > 0 else None
    times: dict[tuple[int, bool], list[float]] = {}
    tokens = 0
    for rep in range(reps + 1):  # rep 0 is a warm-up
        for chunk in chunks:
            c = chunk or seq
            ex = Extractor(lm, None, max_tokens_per_sample=seq, token_budget=seq, logits_chunk=c)
            t0 = time.perf_counter()
            tokens = sum(len(hb) for hb in ex.iter_head_batches(sample))
            if rep:
                times.setdefault((chunk, False), []).append(time.perf_counter() - t0)
            if sketcher is not None:
                ex = Extractor(lm, sketcher, max_tokens_per_sample=seq, token_budget=seq, logits_chunk=c)
                res = ex.extract(sample)
                if rep:
                    times.setdefault((chunk, True), []).append(res.elapsed_s)
                    times.setdefault((chunk, "sketch"), []).append(res.timings["sketch_s"] / res.elapsed_s)  # type: ignore[index]
    out = []
    for chunk in chunks:
        row: dict[str, object] = {"layers": layers, "seq": seq, "logits_chunk": chunk or "none", "tokens": tokens,
                                  "reps": reps,
                                  "extract_tokens_per_s": round(tokens / statistics.median(times[(chunk, False)]), 1)}
        if sketcher is not None:
            row.update({"m": m, "with_sketch_tokens_per_s": round(tokens / statistics.median(times[(chunk, True)]), 1),
                        "sketch_share": round(statistics.median(times[(chunk, "sketch")]), 3)})  # type: ignore[index]
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--one", action="store_true")
    p.add_argument("--seq", type=int, nargs="*", default=[256, 1024, 2048])
    p.add_argument("--chunk", type=int, nargs="*", default=[256, 0])  # 0: no chunking
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--m", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--speed", action="store_true", help="interleaved tokens/s of the --chunk values at --seq[0]")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    if args.speed:
        for row in speed(args.seq[0], args.chunk, args.layers, args.m, args.threads, args.reps):
            print(json.dumps(row), flush=True)
        return
    if args.one:
        seq, chunk = args.seq[0], args.chunk[0]
        print(json.dumps(one(seq, chunk or seq, args.layers, args.m, args.threads)), flush=True)
        return
    for chunk in args.chunk:
        for seq in args.seq:
            cmd = [sys.executable, "-m", "bench.extraction.bench_llama8b_shape", "--one", "--seq", str(seq),
                   "--chunk", str(chunk), "--layers", str(args.layers), "--m", str(args.m),
                   "--threads", str(args.threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
            print(line, flush=True)


if __name__ == "__main__":
    main()
