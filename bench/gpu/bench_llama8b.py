"""FisherAtlas at Llama-3.1-8B shape on one GPU (random weights, bf16): the issue-12 GPU figures.

Usage (on a CUDA machine)::

    python -m bench.gpu.bench_llama8b --out bench/results/gpu.md

Model: ``LlamaForCausalLM`` at the Llama-3.1-8B configuration (32 layers, hidden 4096, intermediate
14,336, 32 heads / 8 KV heads, vocabulary 128,256, untied head), random weights, bf16, built directly on
the GPU. Sketch: m = 4096, SRHT error projection (K = 128,256), float32 sketch on the GPU. Token ids are
drawn uniformly from the vocabulary (the costs depend on shapes, not on the text). Every figure is the
median of ``--reps`` runs after a warm-up, with ``torch.cuda.synchronize()`` around each.

Figures
-------
1. **Sketch overhead over the bare forward**: a batch of ``--batch`` × ``--seq`` tokens. *Bare* is the
   plain HF forward producing full bf16 logits (what serving the model costs); *ours* is the extraction
   path: forward stopped at the head input, head logits per chunk, ``e = softmax − onehot`` in fp32, and the
   FisherSketch update of every token (state + baselines excluded). Overhead = ours / bare − 1.
2. **Routing**: ``PromptBatcher.sketch_prepared`` (one forward + one batched sketch; the states come back
   to the host) — p50 latency at batch 1 and prompts/s at batch 64, prompts of 16–64 tokens.
3. **Adding a 200-sample domain**: ``Extractor.extract`` of 200 samples of ``--domain-tokens`` tokens
   (tokenising, forward, sketch, baselines, state merge), the time a worker spends on the job.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

DEVICE = "cuda"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _median_time(fn: Any, reps: int) -> float:
    fn()  # warm-up
    _sync()
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def build(layers: int, tiny: bool = False) -> Any:
    """The 8B-shape model on the GPU with random weights, wrapped as a ``LoadedModel``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny_models import build_tokenizer
    from workers.model_loading import LoadedModel

    config = LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         rope_theta=500_000.0, tie_word_embeddings=False)
    if tiny:  # a dry run of the script on a CPU
        config = LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEVICE):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    return LoadedModel.from_model(model, build_tokenizer(), name="llama3.1-8b-shape", verify=False)


def prepared(lengths: list[int], vocab: int, seed: int) -> list[Any]:
    """Prompts as ``PreparedSample``s with random token ids (text-mode: every position counts)."""
    from workers.batching import PreparedSample

    g = torch.Generator().manual_seed(seed)
    return [PreparedSample(i, 10_000 + i, tuple(torch.randint(0, vocab, (n,), generator=g).tolist()), 0, False)
            for i, n in enumerate(lengths)]


def overhead(lm: Any, sketcher: Any, batch: int, seq: int, reps: int) -> dict[str, float]:
    from fishersketch import SketchState
    from workers.batching import collate
    from workers.head import iter_head_batches

    tb = collate(prepared([seq] * batch, lm.K, seed=1), pad_id=0).to(lm.device)

    def bare() -> None:
        with torch.inference_mode():
            lm.model(input_ids=tb.input_ids, attention_mask=tb.attention_mask, use_cache=False)

    def head_only() -> None:
        with torch.inference_mode():
            for _ in iter_head_batches(lm, tb, logits_chunk=4096):
                pass

    def ours() -> None:
        with torch.inference_mode():
            stream = sketcher.stream(SketchState.empty(sketcher.spec))
            for hb in iter_head_batches(lm, tb, logits_chunk=4096):
                stream.add(hb.a, hb.e, hb.sample_ids, hb.last_token_mask)
            stream.close()

    t_bare, t_head, t_ours = (_median_time(f, reps) for f in (bare, head_only, ours))
    tokens = batch * (seq - 1)
    return {"batch": batch, "seq": seq, "bare_s": t_bare, "head_errors_s": t_head, "ours_s": t_ours,
            "overhead": t_ours / t_bare - 1.0, "errors_overhead": t_head / t_bare - 1.0,
            "bare_tokens_per_s": tokens / t_bare, "ours_tokens_per_s": tokens / t_ours}


def routing(lm: Any, sketcher: Any, reps: int) -> dict[str, float]:
    from workers.extraction import Extractor
    from workers.prompt_batcher import PromptBatcher

    batcher = PromptBatcher(Extractor(lm, sketcher), max_batch=64, token_budget=64 * 64)
    one = prepared([32], lm.K, seed=2)
    lat = []
    batcher.sketch_prepared(one)
    for i in range(max(reps * 6, 30)):
        p = prepared([16 + (i * 7) % 49], lm.K, seed=100 + i)
        _sync()
        t0 = time.perf_counter()
        batcher.sketch_prepared(p)
        lat.append(time.perf_counter() - t0)
    lengths = [16 + (i * 13) % 49 for i in range(64)]
    many = prepared(lengths, lm.K, seed=3)
    t64 = _median_time(lambda: batcher.sketch_prepared(many), reps)
    p99 = sorted(lat)[int(0.99 * len(lat)) - 1]
    return {"p50_batch1_ms": statistics.median(lat) * 1e3, "p99_batch1_ms": p99 * 1e3,
            "batch64_s": t64, "prompts_per_s_batch64": 64 / t64, "mean_prompt_tokens": sum(lengths) / 64}


def add_domain(lm: Any, sketcher: Any, tokens: int, reps: int) -> dict[str, float]:
    from atlas.samples import Sample
    from workers.extraction import Extractor

    rng = torch.Generator().manual_seed(4)
    vocab = lm.tokenizer.get_vocab()
    words = [w for w in vocab if w.isalpha() and len(w) > 2][:200] or ["alpha", "beta"]
    texts = [" ".join(words[int(j)] for j in torch.randint(0, len(words), (tokens,), generator=rng))
             for _ in range(200)]
    ex = Extractor(lm, sketcher, max_tokens_per_sample=tokens, token_budget=32_768, logits_chunk=4096)
    samples = [Sample(text=t) for t in texts]
    t = _median_time(lambda: ex.extract(samples), reps)
    res = ex.extract(samples)
    return {"samples": 200, "tokens": res.tokens, "seconds": t, "tokens_per_s": res.tokens / t}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--domain-tokens", type=int, default=256)
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--tiny", action="store_true", help="dry run on the CPU with a tiny model of the same type")
    args = p.parse_args()
    global DEVICE
    DEVICE = "cpu" if args.tiny else "cuda"
    # float32 matmuls stay exact ("highest"): the SRHT's Kronecker-GEMM FWHT is chosen only then.
    t0 = time.perf_counter()
    lm = build(args.layers, args.tiny)
    sketcher = lm.make_sketcher(lm.make_spec(m=args.m, seed=0))
    built = time.perf_counter() - t0
    device_name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    result = {"device": device_name, "torch": torch.__version__, "layers": args.layers,
              "m": args.m, "d": sketcher.spec.d, "K": sketcher.spec.K, "build_s": built,
              "overhead": overhead(lm, sketcher, args.batch, args.seq, args.reps),
              "routing": routing(lm, sketcher, args.reps),
              "add_domain": add_domain(lm, sketcher, args.domain_tokens, args.reps),
              "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0}
    print(json.dumps(result, indent=2), flush=True)
    if args.out:
        write(Path(args.out), args, result)


def write(path: Path, args: argparse.Namespace, r: dict[str, Any]) -> None:
    """The markdown section of ``bench/results/gpu.md``."""
    o, q, a = r["overhead"], r["routing"], r["add_domain"]
    bare = f"{o['bare_s'] * 1e3:.1f} ms ({o['bare_tokens_per_s']:,.0f} tok/s)"
    errs = f"{o['head_errors_s'] * 1e3:.1f} ms (+{o['errors_overhead'] * 100:.1f} %)"
    ours = f"{o['ours_s'] * 1e3:.1f} ms ({o['ours_tokens_per_s']:,.0f} tok/s)"
    domain = f"**{a['seconds']:.2f} s** ({a['tokens_per_s']:,.0f} tok/s)"
    cmd = (f"python -m bench.gpu.bench_llama8b --layers {args.layers} --batch {args.batch} --seq {args.seq} "
           f"--domain-tokens {args.domain_tokens} --m {args.m} --reps {args.reps} --out {args.out}")
    text = f"""# GPU benchmarks (Llama-3.1-8B shape, random weights, bf16)

- Command: `{cmd}`
- Machine: 1x {r['device']} (device machine), torch {r['torch']}; date {dt.date.today().isoformat()}.
- Model: Llama-3.1-8B configuration ({r['layers']} layers, d = {r['d']}, K = {r['K']:,}), random weights, bf16;
  sketch m = {r['m']} (SRHT); activation GEMM in bf16 (exact inputs, fp32 accumulation), error side fp32.
  Medians of {args.reps} runs after a warm-up. Peak GPU memory
  {r['peak_gpu_gib']:.1f} GiB.

| figure | value | goal |
|---|---:|---:|
| bare forward, {o['batch']} x {o['seq']} tokens (full bf16 logits) | {bare} | |
| forward + head errors (fp32, chunks of 4,096 positions) | {errs} | |
| forward + head errors + FisherSketch update | {ours} | |
| **sketch overhead over the bare forward** | **{o['overhead'] * 100:+.1f} %** | ≤ 10 % |
| route sketch p50 / p99 at batch 1 (16-64-token prompts) | {q['p50_batch1_ms']:.1f} / {q['p99_batch1_ms']:.1f} ms | |
| route sketch at batch 64 (mean {q['mean_prompt_tokens']:.0f} tokens) | {q['prompts_per_s_batch64']:,.0f} prompts/s | |
| **add a 200-sample domain** ({a['tokens']:,} tokens) | {domain} | ≤ 2 s (paper: 4.7 s on an A100) |

Reading: the overhead row compares the whole extraction path with what serving the model already costs
(a forward that materialises the logits). The route rows are the worker side of `POST /v1/route` (one
forward + one batched sketch, states copied to the host); HTTP and the FAISS re-rank add the CPU-side
figures of `bench/results/api.md`.
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
