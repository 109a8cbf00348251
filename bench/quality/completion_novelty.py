"""Probe: the novelty test on a completion-mode task (its prompts' vectors), with and without the test.

BoolQ added as prompt/completion pairs (passage + question → " yes"/" no") beside six text families of experiment
4d, through the library (bundled model, SQLite, every default but ``max_tokens_per_sample``); routed: held-out BoolQ
prompts (its own) and RTE prompts in the same "passage / Question: / Answer:" frame (an unseen task). The same
store is routed with the test on and off (``route_novelty=False``). Prints one Markdown table.

Run: ``python -m bench.quality.completion_novelty`` (about 3 min on 2 cores).
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import numpy as np

TEXT_FAMILIES = ("wikipedia", "news", "reviews", "trec", "mmlu_questions", "scicite")


def _prompt(passage: str, question: str) -> str:
    return f"{passage}\nQuestion: {question}\nAnswer:"


def _rates(own: list[Any], unseen: list[Any]) -> list[str]:
    topped = [a for a in unseen if a.matches and a.matches[0].name == "boolq"]
    return [f"{np.mean([(not a.none) and a.matches[0].name == 'boolq' for a in own]):.1%}",
            f"{np.mean([a.none for a in own]):.1%}",
            f"{np.mean([not a.none for a in topped]):.1%} of {len(topped)}" if topped else "–",
            f"{np.mean([a.none for a in unseen]):.1%}"]


def run(args: argparse.Namespace) -> str:
    from bench.quality.data_superglue import load_superglue_binary
    from bench.quality.openset_families import family_tasks
    from fisher_atlas import Atlas

    families = family_tasks()
    rng = np.random.default_rng(args.seed)
    boolq = load_superglue_binary("boolq")
    rte = load_superglue_binary("rte")
    boolq = [boolq[i] for i in rng.permutation(len(boolq))]
    rte = [rte[i] for i in rng.permutation(len(rte))]
    n = args.pairs
    pairs = [{"prompt": _prompt(p, q), "completion": " yes" if y else " no"} for p, q, y in boolq[:n]]
    own = [_prompt(p, q) for p, q, _ in boolq[n:n + args.heldout]]
    unseen = [_prompt(p, q) for p, q, _ in rte[:args.heldout]]
    settings = {"torch_threads": args.threads, "max_tokens_per_sample": args.max_tokens}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with Atlas(tmp, **settings) as atlas:
            atlas.add("boolq", pairs, mode="completion", progress=False)
            for name in TEXT_FAMILIES:
                atlas.add(name, families[name][:n], progress=False)
            vectors = atlas.routing("boolq").novelty_samples
            rows.append(["with the novelty test (product)", *_rates(atlas.route(own, k=3), atlas.route(unseen, k=3))])
        with Atlas(tmp, route_novelty=False, **settings) as plain:
            rows.append(["without it (`route_novelty=False`, same store)",
                         *_rates(plain.route(own, k=3), plain.route(unseen, k=3))])
    head = ("| BoolQ (completion task) | own prompts answered by it | own prompts \"none\" | RTE prompts it tops, "
            "accepted | RTE prompts \"none\" |\n|---|---:|---:|---:|---:|")
    return (f"{n} BoolQ pairs ({vectors} prompt vectors kept) beside {len(TEXT_FAMILIES)} text families of {n} "
            f"samples; {args.heldout} held-out BoolQ and RTE prompts; max_tokens_per_sample {args.max_tokens}.\n\n"
            + head + "\n" + "\n".join("| " + " | ".join(r) + " |" for r in rows))


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=100)
    p.add_argument("--heldout", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    print(run(p.parse_args()))


if __name__ == "__main__":
    main()
