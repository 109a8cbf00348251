"""An offline study, not the product: a task's character language model as its open-set test (benches 4d / 4e).

Every "none" statistic measured on the product so far (route score, rank score, lexical cosine, hidden-state
novelty, their combinations) sits on one trade-off line. This study asks whether a classical text-typicality test
does better: each indexed task's signature samples make a character n-gram language model (Witten–Bell
interpolation of orders 1..n, the first :data:`CUT` characters of each text); a prompt is answered by the task of
lowest cross-entropy (nats per character) and refused when that cross-entropy is above the task's own threshold, the
``q`` quantile of its samples' cross-entropies held out 5-fold (no labels, no model). The splits and draws are bench
4d's (:mod:`bench.quality.openset_families`, seed 1000 + draw); ``--indexed 6`` is 4e's.

Reading: bench/RESULTS.md, 4d ("A task's character language model").

Run: ``python -m bench.quality.char_lm_openset`` (4d, ~40 s on one core), ``--order 3``, ``--indexed 6``.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from bench.quality.openset_families import family_tasks, split_texts

CUT = 1000
"""Characters of a text read (prompts and samples alike)."""
QUANTILES = (0.95, 0.975, 0.99)
"""Thresholds tried: a task's held-out cross-entropies' quantile (5 %, 2.5 % and 1 % of its own texts refused)."""


class CharLM:
    """A character n-gram language model with Witten–Bell interpolation.

    Parameters
    ----------
    texts : sequence of str
        Training texts (each cut to :data:`CUT` characters, padded with ``order - 1`` start marks and an end mark).
    order : int
        Longest n-gram.
    """

    def __init__(self, texts: Sequence[str], order: int) -> None:
        self.order = order
        self.grams: list[Counter[str]] = [Counter() for _ in range(order + 1)]
        self.contexts: list[Counter[str]] = [Counter() for _ in range(order + 1)]
        self.followers: list[defaultdict[str, set[str]]] = [defaultdict(set) for _ in range(order + 1)]
        for text in texts:
            padded = self._padded(text)
            for i in range(order - 1, len(padded)):
                for k in range(1, order + 1):
                    gram = padded[i - k + 1:i + 1]
                    self.grams[k][gram] += 1
                    self.contexts[k][gram[:-1]] += 1
                    self.followers[k][gram[:-1]].add(gram[-1])

    def _padded(self, text: str) -> str:
        return "\x02" * (self.order - 1) + text[:CUT] + "\x03"

    def cross_entropy(self, text: str) -> float:
        """Mean negative log-probability of ``text``'s characters (nats per character, end mark included)."""
        padded = self._padded(text)
        total = 0.0
        for i in range(self.order - 1, len(padded)):
            history, char = padded[i - self.order + 1:i], padded[i]
            p = 1.0 / 256
            for k in range(1, self.order + 1):
                context = history[len(history) - (k - 1):] if k > 1 else ""
                seen = self.contexts[k].get(context, 0)
                if seen:
                    distinct = len(self.followers[k][context])
                    keep = seen / (seen + distinct)
                    p = keep * self.grams[k].get(context + char, 0) / seen + (1 - keep) * p
            total -= math.log(p)
        return total / (len(padded) - self.order + 1)


def held_out_cross_entropies(texts: Sequence[str], order: int, folds: int = 5) -> np.ndarray:
    """Each text's cross-entropy under the model of the other folds' texts (``(len(texts),)``)."""
    out = np.empty(len(texts))
    for f in range(folds):
        model = CharLM([t for i, t in enumerate(texts) if i % folds != f], order)
        for i in range(f, len(texts), folds):
            out[i] = model.cross_entropy(texts[i])
    return out


def run_draw(draw: int, names: list[str], tasks: dict[str, list[str]], args: argparse.Namespace
             ) -> dict[float, tuple[float, float, float]]:
    """"None" on unseen prompts, "none" on indexed prompts and the share answered right, per quantile, in one draw."""
    rng = np.random.default_rng(1000 + draw)
    sig, held = {}, {}
    for t in names:
        sig[t], held[t] = split_texts(tasks[t], args.signature, args.heldout, rng)
    n_unseen = len(names) - args.indexed if args.indexed else max(1, round(0.2 * len(names)))
    unseen = sorted(rng.choice(names, size=n_unseen, replace=False).tolist())
    indexed = [t for t in names if t not in unseen]
    models = {t: CharLM(sig[t], args.order) for t in indexed}
    own = {t: held_out_cross_entropies(sig[t], args.order) for t in indexed}
    answers = []
    for truth in indexed + unseen:
        for prompt in held[truth]:
            scores = {t: models[t].cross_entropy(prompt) for t in indexed}
            best = min(scores, key=scores.__getitem__)
            answers.append((truth, best, scores[best]))
    out = {}
    for q in QUANTILES:
        limit = {t: float(np.quantile(own[t], q)) for t in indexed}
        none_u = [xe > limit[best] for truth, best, xe in answers if truth in unseen]
        none_i = [xe > limit[best] for truth, best, xe in answers if truth not in unseen]
        right = [xe <= limit[best] and best == truth for truth, best, xe in answers if truth not in unseen]
        out[q] = (float(np.mean(none_u)), float(np.mean(none_i)), float(np.mean(right)))
    print(f"draw {draw}: unseen {unseen}: " + "; ".join(
        f"q {q}: {u:.3f} / {i:.3f} / {r:.3f}" for q, (u, i, r) in out.items()), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--order", type=int, default=4, help="longest character n-gram")
    p.add_argument("--indexed", type=int, default=0, help="tasks indexed per draw (0: 80 %%, bench 4d; 6: bench 4e)")
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--signature", type=int, default=100, help="samples per indexed task")
    p.add_argument("--heldout", type=int, default=20, help="held-out prompts per task")
    args = p.parse_args()
    tasks = {k: v for k, v in family_tasks().items() if len(v) >= args.signature + args.heldout}
    names = sorted(tasks)
    draws = [run_draw(d, names, tasks, args) for d in range(args.draws)]
    for q in QUANTILES:
        med = [float(np.median([d[q][k] for d in draws])) for k in range(3)]
        print(f"q {q}: medians over {args.draws} draws: none unseen {med[0]:.3f}, none indexed {med[1]:.3f}, "
              f"answered right {med[2]:.3f}")


if __name__ == "__main__":
    main()
