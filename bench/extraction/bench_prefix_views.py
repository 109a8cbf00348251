"""What the held-out prefix views cost a job: an add with and without them (issue 13, prompts shorter than the samples).

Usage::

    python -m bench.extraction.bench_prefix_views --samples 100 --repeats 3 --threads 2

Every job scores up to 64 calibration samples held out (32 until 2026-12-07), and since 2026-11-28 the first half,
quarter and eighth of tokens of up to 32 of them as well (``workers.calibration.prefixes``;
``atlas.route_calibration.PREFIX_FRACTIONS``). This adds the same tasks through the library (in-process worker,
SQLite, FAISS, the bundled model, m = 4096, the service's 512-token cap) with the views and without them
(``PREFIX_FRACTIONS`` emptied in the worker), alternating, in one process; three data families of different sample
lengths (``bench.quality.openset_families.family_tasks``).
Medians over ``--repeats``; prints one Markdown table.

``--picks`` compares instead a job holding out 64 samples with the prefix views of 32 of them (since 2026-12-07,
``CALIBRATION_SAMPLES``, ``VIEW_SAMPLES``) with holding out 32, each with its views (before): the same adds, the
pick's cap set on ``calibration_pick`` for the "before" runs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time

from atlas.route_calibration import CALIBRATION_SAMPLES, PREFIX_FRACTIONS, VIEW_SAMPLES, calibration_pick

FAMILIES = ("wikipedia", "news", "bbh_navigate")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--picks", action="store_true", help="64 held-out samples (32 with views) against 32 (all with)")
    args = p.parse_args()
    from bench.quality.openset_families import family_tasks
    from fisher_atlas import Atlas
    from workers import calibration

    texts = family_tasks()
    tasks = {name: texts[name][:args.samples] for name in FAMILIES}
    seconds: dict[tuple[str, bool], list[float]] = {(n, v): [] for n in FAMILIES for v in (True, False)}
    with tempfile.TemporaryDirectory() as tmp, Atlas(tmp, torch_threads=args.threads) as atlas:
        atlas.add("warm-up", texts["reviews"][:20], progress=False)
        for rep in range(args.repeats):
            for views in (True, False) if rep % 2 == 0 else (False, True):
                if args.picks:  # "views" stands for the shipped picks, its absence for the 32 of before
                    calibration_pick.__defaults__ = (CALIBRATION_SAMPLES if views else VIEW_SAMPLES,)
                else:
                    calibration.PREFIX_FRACTIONS = PREFIX_FRACTIONS if views else ()
                for name, samples in tasks.items():
                    t0 = time.perf_counter()
                    atlas.add(f"{name}-{views}-{rep}", samples, progress=False)
                    seconds[(name, views)].append(time.perf_counter() - t0)
        calibration.PREFIX_FRACTIONS = PREFIX_FRACTIONS
        calibration_pick.__defaults__ = (CALIBRATION_SAMPLES,)
        words = {name: statistics.median(len(t.split()) for t in samples) for name, samples in tasks.items()}
    print(f"machine: {platform.processor() or platform.machine()}, {args.threads} threads; "
          f"{args.samples} samples per task, medians of {args.repeats}\n")
    head = (f"add, {CALIBRATION_SAMPLES} held out ({VIEW_SAMPLES} with views) | {VIEW_SAMPLES} held out, all with "
            "views (before)" if args.picks else "add with prefix views | without")
    print(f"| task (median words per sample) | {head} | ratio |\n|---|---:|---:|---:|")
    for name in FAMILIES:
        on, off = statistics.median(seconds[(name, True)]), statistics.median(seconds[(name, False)])
        print(f"| {name} ({words[name]:.0f}) | {on:.2f} s | {off:.2f} s | {on / off:.2f}x |")


if __name__ == "__main__":
    main()
