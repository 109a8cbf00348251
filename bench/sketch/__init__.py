"""Benchmarks of the fishersketch engine; each module writes one section of ``bench/results/sketch.md``.

Run from the repository root, e.g. ``nice -n 5 python -m bench.sketch.throughput``.
"""
