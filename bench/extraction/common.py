"""Shared helpers of the extraction benchmarks: models, texts, memory probes."""

from __future__ import annotations

import json
import random
import resource
from pathlib import Path

import torch

from atlas.samples import Sample
from atlas.settings import Settings
from workers.extraction import Extractor
from workers.model_loading import BUNDLED_MODEL_DIR, LoadedModel, load_causal_lm

DATA = Path("/work/shared/data/multidomain_text/multidomain_text.jsonl")


def load_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts from the multidomain corpus (deterministic shuffle), or synthetic text without it."""
    if DATA.is_file():
        with DATA.open(encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        random.Random(seed).shuffle(texts)
        return texts[:n]
    rng = random.Random(seed)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "fisher",
             "geometry", "aligns", "tasks"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(10, 120))) for _ in range(n)]


def samples_of(texts: list[str]) -> list[Sample]:
    return [Sample(text=t) for t in texts]


def random_gpt2_like_bundled(n_embd: int = 256, n_layer: int = 4, vocab: int = 8192) -> LoadedModel:
    """A random-weight GPT-2 of the bundled model's size with a BPE tokenizer trained on the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(load_texts(5000, seed=1), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                        eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_embd=n_embd, n_layer=n_layer, n_head=4, n_positions=1024,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LoadedModel.from_model(GPT2LMHeadModel(config), tokenizer, name="random-gpt2-256x4-v8192")


def bench_model(which: str) -> tuple[LoadedModel, str]:
    """``bundled`` when present (else the random stand-in), or ``random``."""
    if which == "bundled" and (BUNDLED_MODEL_DIR / "config.json").is_file():
        return load_causal_lm("bundled", device="cpu"), "bundled"
    return random_gpt2_like_bundled(), "random GPT-2 (n_embd=256, n_layer=4, vocab 8192)"


def service_extractor(threads: int) -> Extractor:
    """The bundled model's extractor as the service builds it on its defaults (:class:`atlas.settings.Settings`:
    sketch dimension, seed, error projection, token cap), on CPU with ``threads`` torch threads."""
    torch.set_num_threads(threads)
    s, lm = Settings(), load_causal_lm("bundled", device="cpu")
    spec = lm.make_spec(m=s.sketch_dim, seed=s.sketch_seed, error_projection=s.error_projection)
    return Extractor(lm, lm.make_sketcher(spec), max_tokens_per_sample=s.max_tokens_per_sample)


def _status_kib(key: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM, also ``ru_maxrss``) of this process (Linux ≥ 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def current_rss_mib() -> float:
    """Current resident set size (MiB)."""
    kib = _status_kib("VmRSS")
    return (kib or 0.0) / 1024.0


def max_rss_mib() -> float:
    """Peak resident set size since start or the last :func:`reset_peak_rss` (MiB)."""
    kib = _status_kib("VmHWM")
    if kib is None:
        kib = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return kib / 1024.0


def make_sketcher(lm: LoadedModel, m: int):  # type: ignore[no-untyped-def]
    """A FisherSketch sketcher for ``lm`` or None when fishersketch is not importable."""
    try:
        from fishersketch import Sketcher
    except ImportError:
        return None
    return Sketcher(lm.make_spec(m=m), device="cpu", dtype=torch.float32)
