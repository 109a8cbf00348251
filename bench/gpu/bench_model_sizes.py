"""CPU speed of the route path for bundled-model sizes against an all-MiniLM-L6-v2-shaped encoder.

Usage (repository root): ``python -m bench.gpu.bench_model_sizes [THREADS]``

For GPT-2 configurations of 4 x 256, 6 x 320 and 6 x 384 (vocabulary 8192, the bundled tokenizer) it
times ``Extractor.prompt`` (one forward plus the FisherSketch update, m = 2048, what ``POST /v1/route``
runs per prompt) and the bare transformer forward, one prompt at a time, on 64 short prompts (two
passes after a warm-up, medians). It also times the forward of a BertModel of the all-MiniLM-L6-v2
shape (6 x 384, vocabulary 30,522) on the same prompt lengths (+2 for [CLS]/[SEP]). Weights are random:
the speed of these dense models does not depend on the weight values. CPU only.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from workers.extraction import Extractor
from workers.model_loading import LoadedModel

BASE = [
    "Which of the following is a prime number greater than twenty?",
    "Translate the sentence into French: the cat sleeps.",
    "Is the following review positive or negative? The film was dull and far too long.",
    "def add(a, b):\n    return a + b",
    "CC(=O)Oc1ccccc1C(=O)O",
    "Who wrote the novel Pride and Prejudice, and in which year?",
    "Sort the following words alphabetically: pear apple mango kiwi banana",
    "What is the boiling point of water at sea level in Kelvin?",
]
SIZES = [(4, 256, 4), (6, 320, 5), (6, 384, 6)]


def main() -> None:
    """Print one JSON line per model, then the settings."""
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained("workers/bundled_model")
    prompts = [f"{p} ({i})" for i, p in enumerate(BASE * 8)]
    if os.environ.get("QUICK"):
        prompts = prompts[:5]
    ntok = sum(len(tok(p)["input_ids"]) for p in prompts)
    for n_layer, width, heads in SIZES:
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=8192, n_positions=512, n_embd=width, n_layer=n_layer, n_head=heads,
                            tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        model = GPT2LMHeadModel(config).eval()
        lm = LoadedModel.from_model(model, tok, name=f"gpt2-{n_layer}x{width}", verify=False)
        ex = Extractor(lm, lm.make_sketcher(lm.make_spec(m=2048, seed=0)), max_tokens_per_sample=64)
        for p in prompts[:4]:
            ex.prompt(p)
        lat = []
        for _ in range(2):
            for p in prompts:
                t0 = time.perf_counter()
                ex.prompt(p)
                lat.append(time.perf_counter() - t0)
        fw = []
        with torch.inference_mode():
            for _ in range(2):
                for p in prompts:
                    ids = tok(p, return_tensors="pt")["input_ids"]
                    t0 = time.perf_counter()
                    model.transformer(ids)
                    fw.append(time.perf_counter() - t0)
        print(json.dumps({
            "model": f"GPT-2 {n_layer}x{width}",
            "params_M": round(sum(x.numel() for x in model.parameters()) / 1e6, 2),
            "route_sketch_p50_ms": round(1e3 * statistics.median(lat), 2),
            "route_sketch_prompts_per_s_seq": round(len(lat) / sum(lat), 1),
            "route_sketch_tok_per_s_seq": round(2 * ntok / sum(lat)),
            "bare_forward_p50_ms": round(1e3 * statistics.median(fw), 2),
        }), flush=True)
    bert_config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                             intermediate_size=1536)
    bert = BertModel(bert_config).eval()
    fw = []
    with torch.inference_mode():
        for _ in range(3):
            for p in prompts:
                ids = torch.randint(1000, 30000, (1, len(tok(p)["input_ids"]) + 2))
                t0 = time.perf_counter()
                bert(ids)
                fw.append(time.perf_counter() - t0)
    print(json.dumps({"model": "MiniLM-L6 shape (BertModel 6x384, random)",
                      "bare_forward_p50_ms": round(1e3 * statistics.median(fw[len(prompts):]), 2)}), flush=True)
    cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(" \t:")
    print(json.dumps({"threads": threads, "prompts": len(prompts), "tokens": ntok, "cpu": cpu}))


if __name__ == "__main__":
    main()
