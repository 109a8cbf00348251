"""One run of the bundled-model training, from the parsed command line to the saved model and summary.

Reads or builds the corpus (or only writes it, ``--prepare-corpus``), trains with optional
checkpoints, resumption and best-validation selection, evaluates and writes ``training_summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch
from transformers import GPT2LMHeadModel

from .checkpoint import load_checkpoint, save_checkpoint
from .constants import DOMAINS, SEQ_LEN
from .corpus import build_corpus, read_corpus, save_corpus
from .evaluation import eval_windows, mean_loss
from .export import save_model
from .model import build_model
from .tokenizer import load_tokenizer
from .training import lr_at, make_batch_sampler, make_optimizer, probe_seconds_per_step, train_step


def run_training(args: argparse.Namespace) -> None:
    """Build the corpus, train tokenizer and model, evaluate and save to ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed command-line arguments (see ``parse_args`` of ``scripts/train_bundled_model.py``).
    """
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    t_start = time.perf_counter()

    tokenizer = load_tokenizer(args.tokenizer_dir) if args.tokenizer_dir is not None else None
    if args.corpus is not None:
        if tokenizer is None:
            raise SystemExit("--corpus needs --tokenizer-dir (the tokenizer the corpus was packed with)")
        corpus = read_corpus(args.corpus)
    else:
        if args.data_dir is None:
            raise SystemExit("give --data-dir or --corpus")
        corpus, tokenizer = build_corpus(args, tokenizer)
    for name, entry in corpus.sources.items():
        print(f"[corpus] {name}: {entry}", flush=True)
    print(f"[tokenizer] vocab={len(tokenizer)} ({time.perf_counter() - t_start:.0f}s)", flush=True)
    if args.prepare_corpus is not None:
        save_corpus(corpus, args.prepare_corpus)
        print(f"[corpus] written to {args.prepare_corpus}", flush=True)
        return
    if args.out is None:
        raise SystemExit("--out is required for training")
    train_streams = corpus.train
    train_tokens = {d: len(s) for d, s in train_streams.items()}
    print(f"[corpus] train tokens per domain: {train_tokens}", flush=True)
    heldout_eval = {d: eval_windows(corpus.heldout[d].astype(np.int64), args.eval_windows) for d in DOMAINS}
    train_eval = {d: eval_windows(train_streams[d].astype(np.int64), args.eval_windows) for d in DOMAINS}
    val_eval = {d: eval_windows(corpus.val[d].astype(np.int64), args.eval_windows) for d in DOMAINS}

    # Equal mixture of the four domains: each domain gets a quarter of the training tokens.
    weights = dict.fromkeys(DOMAINS, 1.0)
    sample = make_batch_sampler(train_streams, weights, args.batch_size, args.seed)

    torch.manual_seed(args.seed)
    model = build_model(tokenizer, args)
    if args.init_from is not None:
        init = GPT2LMHeadModel.from_pretrained(args.init_from, dtype=torch.float32)
        model.load_state_dict(init.state_dict())
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())

    def losses(windows: dict[str, torch.Tensor]) -> dict[str, float]:
        return {d: mean_loss(model, windows[d], 64 if device.type == "cuda" else 16, args.bf16) for d in DOMAINS}

    loss_random_heldout = losses(heldout_eval)
    loss_random_train = losses(train_eval)
    print(f"[model] params={n_params} initial held-out loss={loss_random_heldout}", flush=True)

    steps = args.steps
    if steps is None and not args.time_schedule:
        probe_sample = make_batch_sampler(train_streams, weights, args.batch_size, args.seed + 1)
        sec = probe_seconds_per_step(tokenizer, args, probe_sample)
        steps = max(100, int(args.minutes * 60 * 0.92 / sec))
        print(f"[schedule] {sec:.3f}s/step -> {steps} steps for {args.minutes} min", flush=True)

    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    meta: dict[str, object] = {"step": 0, "train_seconds": 0.0, "best_val": None, "best_step": None}
    if args.resume is not None:
        meta = load_checkpoint(args.resume, model, optimizer, sample)
        print(f"[resume] from {args.resume} at step {meta['step']}", flush=True)
    start_step = int(meta["step"])  # type: ignore[call-overload]
    seconds_before = float(meta["train_seconds"])  # type: ignore[arg-type]
    best_val = meta.get("best_val")
    best_state: dict[str, torch.Tensor] | None = None
    if args.resume is not None and (args.resume / "best.pt").exists():
        best_state = torch.load(args.resume / "best.pt", map_location="cpu")
    budget_s = args.minutes * 60

    model.train()
    t_train = time.perf_counter()
    running: list[float] = []
    step = start_step
    while True:
        elapsed = seconds_before + time.perf_counter() - t_train
        if args.time_schedule:
            if elapsed >= budget_s:
                break
            if step < args.warmup:
                lr = args.lr * (step + 1) / args.warmup
            else:  # cosine to 10 % of peak over the wall-clock budget
                frac = min(elapsed / budget_s, 1.0)
                lr = args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))
        else:
            assert steps is not None
            if step >= steps:
                break
            if args.stop_at_step is not None and step >= args.stop_at_step:
                print(f"[train] --stop-at-step: stopped after {step} of {steps} steps", flush=True)
                break
            if args.max_minutes is not None and elapsed > args.max_minutes * 60:
                print(f"[train] --max-minutes reached: stopped after {step} of {steps} steps", flush=True)
                break
            lr = lr_at(step, steps, args.lr, args.warmup)
        running.append(train_step(model, optimizer, sample(), lr, args.bf16))
        step += 1
        if step % 50 == 0:
            elapsed = seconds_before + time.perf_counter() - t_train
            tok_s = (step - start_step) * args.batch_size * SEQ_LEN / max(time.perf_counter() - t_train, 1e-9)
            recent = sum(running[-50:]) / len(running[-50:])
            print(f"[train] step {step} loss {recent:.3f} lr {lr:.2e} {tok_s:.0f} tok/s {elapsed:.0f}s", flush=True)
        if args.eval_every and step % args.eval_every == 0:
            val = sum(losses(val_eval).values()) / len(DOMAINS)
            model.train()
            if best_val is None or val < float(best_val):  # type: ignore[arg-type]
                best_val, meta["best_step"] = val, step
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            print(f"[val] step {step} mean val loss {val:.4f} (best {float(best_val):.4f} @ {meta['best_step']})",
                  flush=True)
        if args.checkpoint_dir is not None and step % args.checkpoint_every == 0:
            meta.update(step=step, train_seconds=seconds_before + time.perf_counter() - t_train, best_val=best_val)
            save_checkpoint(args.checkpoint_dir, model, optimizer, sample, meta)
            if best_state is not None:
                torch.save(best_state, args.checkpoint_dir / "best.pt")
    train_seconds = seconds_before + time.perf_counter() - t_train
    steps_done = step
    if args.checkpoint_dir is not None:
        meta.update(step=step, train_seconds=train_seconds, best_val=best_val)
        save_checkpoint(args.checkpoint_dir, model, optimizer, sample, meta)

    if args.eval_every:
        last_val = sum(losses(val_eval).values()) / len(DOMAINS)
        if best_state is not None and best_val is not None and float(best_val) < last_val:  # type: ignore[arg-type]
            model.load_state_dict(best_state)
            print(f"[val] using best step {meta['best_step']} (val {float(best_val):.4f} < last {last_val:.4f})",
                  flush=True)
        else:
            meta["best_step"] = steps_done
    loss_heldout = losses(heldout_eval)
    loss_train = losses(train_eval)
    print(f"[eval] trained held-out loss={loss_heldout}", flush=True)
    print(f"[eval] trained train-row loss={loss_train}", flush=True)

    save_model(model, tokenizer, args.out, args.save_dtype)
    summary = {
        "bucket_rule": "int(sha256(key.encode('utf-8')).hexdigest()[:8], 16) % 10; train: < 4; held-out: == 9"
        + ("; validation (checkpoint choice): == 8" if args.eval_every else ""),
        "sources": corpus.sources,
        "train_tokens_per_domain": train_tokens,
        "n_params": n_params,
        "n_layer": args.n_layer,
        "n_embd": args.n_embd,
        "n_head": args.n_head,
        "steps": steps if steps is not None else steps_done,
        "steps_done": steps_done,
        "weights_step": meta.get("best_step", steps_done) if args.eval_every else steps_done,
        "batch_size": args.batch_size,
        "seq_len": SEQ_LEN,
        "tokens_trained": steps_done * args.batch_size * SEQ_LEN,
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - t_start, 1),
        "seed": args.seed,
        "lr": args.lr,
        "dropout": args.dropout,
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "bf16_autocast": bool(args.bf16 and device.type == "cuda"),
        "save_dtype": args.save_dtype,
        "init_from": str(args.init_from) if args.init_from else None,
        "time_schedule_minutes": args.minutes if args.time_schedule else None,
        "torch": torch.__version__,
        "eval_windows_per_domain": {d: int(heldout_eval[d].shape[0]) for d in DOMAINS},
        "loss_initial_heldout": loss_random_heldout,
        "loss_initial_train": loss_random_train,
        "loss_heldout": loss_heldout,
        "loss_train": loss_train,
        "best_val_loss": best_val,
        "stdlib_dir": corpus.stdlib_dir,
    }
    (args.out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"[done] saved to {args.out} in {summary['total_seconds']}s", flush=True)
