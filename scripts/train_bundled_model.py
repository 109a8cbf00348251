"""Train the bundled default model of FisherAtlas: a small GPT-2 causal LM with its own BPE tokenizer.

The model is trained from scratch on CPU on a mixed corpus of four domains (prose, code,
question/answer, SMILES) drawn only from sources whose licences allow shipping derived weights.
Every row of every source is assigned to a bucket by a hash of its key string, so the training
subset is fixed, documented and can be excluded by later evaluations:

``bucket(key) = int(sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10``

Rows with ``bucket < 4`` are training rows (about 40 %). Rows with ``bucket == 9`` are the held-out
rows used by this script to report per-domain loss. Rows with bucket 4-9 are never trained on.
The key is the ``smiles`` field for molecules, the ``text`` field for ``multidomain_text``, the
``input`` field for ``multitask_instructions``, the path relative to the standard library for CPython
source files and the topic name for the Python reference topics (``pydoc_data/topics.py``).

Usage
-----
``python scripts/train_bundled_model.py --data-dir ../shared/data --out workers/bundled_model --seed 0``

``--steps N`` fixes the number of optimiser steps (fully reproducible). Without it, ``--minutes M``
times a few probe steps and picks the number of steps that fits the budget on this machine;
``--time-schedule`` instead runs the learning-rate schedule on wall-clock progress through ``--minutes``
(robust when the machine is shared; the steps done are recorded).

GPU / two-stage use (the accelerator machine has no ``shared/data`` and another CPython)::

    # here: tokenise once with the shipped tokenizer into a compact corpus file
    python scripts/train_bundled_model.py --data-dir ../shared/data --tokenizer-dir workers/bundled_model \
        --prepare-corpus corpus.npz
    # there: train from it on CUDA with bf16 autocast, checkpointing every 500 steps
    python scripts/train_bundled_model.py --corpus corpus.npz --tokenizer-dir workers/bundled_model \
        --out out_dir --device cuda --bf16 --batch-size 128 --n-layer 6 --n-embd 384 --n-head 6 \
        --minutes 8 --time-schedule --checkpoint-dir ckpt --save-dtype float16
    # continue an interrupted run (model, optimiser, step, sampler and torch RNG states)
    python scripts/train_bundled_model.py ... --resume ckpt

``--tokenizer-dir`` keeps an existing tokenizer (so ``K`` = 8192 and the token ids stay the same);
without it the BPE is trained from the training rows as before. Rows with ``bucket == 8`` are a
validation split used only to pick the best checkpoint (``--eval-every``); bucket 9 stays the report split.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

from bundled_training.training_run import run_training


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Parameters
    ----------
    argv : list[str] or None
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    argparse.Namespace
        The parsed arguments.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None, help="the shared/data directory")
    parser.add_argument("--corpus", type=Path, default=None, help="pre-tokenised corpus (.npz from --prepare-corpus)")
    parser.add_argument("--prepare-corpus", type=Path, default=None, help="write the tokenised corpus here and exit")
    parser.add_argument("--tokenizer-dir", type=Path, default=None, help="reuse this tokenizer instead of training one")
    parser.add_argument("--out", type=Path, default=None, help="output save_pretrained directory")
    parser.add_argument(
        "--stdlib-dir",
        type=Path,
        default=Path(sysconfig.get_paths()["stdlib"]),
        help="CPython standard library used for the code and Python-reference text (default: this Python's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget used when --steps is not given")
    parser.add_argument("--steps", type=int, default=None, help="fixed number of optimiser steps (reproducible)")
    parser.add_argument(
        "--time-schedule",
        action="store_true",
        help="run the LR schedule on wall-clock progress through --minutes and stop at --minutes",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="hard stop of the training loop (the run is then shorter than --steps; recorded in the summary)",
    )
    parser.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        help="stop after this many steps of the --steps schedule (replays a run cut short by --max-minutes)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="sequences of 256 tokens per step")
    parser.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=50, help="linear warm-up steps")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout while training (saved config has 0)")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--init-from", type=Path, default=None, help="start from these weights (same config)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:0")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on CUDA (fp32 master weights)")
    parser.add_argument("--save-dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="write resumable checkpoints here")
    parser.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints")
    parser.add_argument("--resume", type=Path, default=None, help="resume from this checkpoint directory")
    parser.add_argument("--eval-every", type=int, default=0, help="steps between validation evals (keep best)")
    parser.add_argument("--eval-windows", type=int, default=48, help="held-out windows of 256 tokens per domain")
    parser.add_argument(
        "--tokenizer-chars", type=int, default=2_000_000, help="characters per domain used to train the BPE"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Build the corpus, train tokenizer and model, evaluate and save to ``--out``.

    Parameters
    ----------
    argv : list[str] or None
        Arguments (default: ``sys.argv[1:]``).
    """
    run_training(parse_args(argv))


if __name__ == "__main__":
    main()
