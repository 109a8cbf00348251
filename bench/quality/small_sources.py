"""Small sources in the recommendation: is a 1–12-sample task's ``fisher_shrunk`` inflated, and would a
minimum-evidence prior (as the route score has) make the ranking better?

Usage::

    python -m bench.quality.small_sources --draws 5 --threads 2

Targets: three text domains of 24 samples (multidomain_text: wikipedia, literature_shakespeare,
questions_trec). Sources: three other domains (biomedical_abstracts, news_sports, scientific_citations),
each as a *reference* task of 24 samples and as small tasks of n ∈ {1, 2, 3, 6, 12} samples drawn at
random (``--draws`` per size). Bundled model, m = 4096, the service's sketch settings; only rows the
bundled model was not trained on (its sha256 bucket ≥ 4).

For each target, ``fisher_shrunk`` is computed as ``atlas.analysis.recommend_sources`` computes it
(``fishersketch.align_matrix`` over the target, the source and the other two targets). The small task's value
is compared with its domain's reference value — ``bias`` and ``rmse`` of the difference — and ``agree`` counts
how often the small task is ordered against the two other targets (the competing sources) as its reference
is. Each column κ multiplies every score by the evidence prior ``√(n_s / (n_s + κ))`` (κ = 0: the product).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
from pathlib import Path

import numpy as np

from atlas.samples import Sample
from bench.extraction.common import service_extractor
from bench.quality.data import bucket
from fishersketch import SketchState, align_matrix

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multidomain_text" / "multidomain_text.jsonl"
TARGETS = ("wikipedia", "literature_shakespeare", "questions_trec")
SOURCES = ("biomedical_abstracts", "news_sports", "scientific_citations")
SIZES = (1, 2, 3, 6, 12)
KAPPAS = (0.0, 1.0, 4.0)
N_REF, POOL = 24, 48


def _texts() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {d: [] for d in TARGETS + SOURCES}
    with DATA.open() as f:
        for line in f:
            rec = json.loads(line)
            d, t = rec["domain"], rec["text"]
            if d in out and 30 <= len(t) <= 200 and bucket(t) >= 4 and len(out[d]) < POOL:
                out[d].append(t)
    return out


def _prior(n: int, kappa: float) -> float:
    return float(np.sqrt(n / (n + kappa))) if kappa > 0 else 1.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    texts, ex = _texts(), service_extractor(args.threads)

    def task(rows: list[str]) -> SketchState:
        return ex.extract([Sample(text=t) for t in rows], mode="text").state

    targets = {d: task(texts[d][:N_REF]) for d in TARGETS}
    refs = {d: task(texts[d][:N_REF]) for d in SOURCES}
    rng = random.Random(args.seed)
    # (kappa, n) -> differences to the reference, and [agreeing orders, orders compared]
    diffs: dict[tuple[float, int], list[float]] = {(k, n): [] for k in KAPPAS for n in SIZES}
    agree: dict[tuple[float, int], list[int]] = {(k, n): [0, 0] for k in KAPPAS for n in SIZES}
    for dom in SOURCES:
        for n in SIZES:
            for _ in range(args.draws):
                small = task(rng.sample(texts[dom], n))
                for tgt in TARGETS:
                    others = [targets[o] for o in TARGETS if o != tgt]
                    ref_row = np.asarray(align_matrix([targets[tgt], refs[dom], *others]).fisher_eb)[0]
                    row = np.asarray(align_matrix([targets[tgt], small, *others]).fisher_eb)[0]
                    for k in KAPPAS:
                        truth, est = ref_row[1] * _prior(N_REF, k), row[1] * _prior(n, k)
                        diffs[(k, n)].append(est - truth)
                        comp = [row[j] * _prior(N_REF, k) for j in (2, 3)]
                        agree[(k, n)][0] += sum((est > c) == (truth > c) for c in comp)
                        agree[(k, n)][1] += len(comp)
    print(f"# small sources: {args.draws} draws x {len(SOURCES)} domains x {len(TARGETS)} targets per size; "
          f"{platform.node()}, {args.threads} threads")
    print("| samples | " + " | ".join(f"κ = {k:g}: bias / rmse / order agrees" for k in KAPPAS) + " |")
    print("|---:|" + "---:|" * len(KAPPAS))
    for n in SIZES:
        cells = []
        for k in KAPPAS:
            d = np.asarray(diffs[(k, n)])
            a, t = agree[(k, n)]
            cells.append(f"{d.mean():+.3f} / {np.sqrt(np.mean(d ** 2)):.3f} / {a}/{t}")
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
