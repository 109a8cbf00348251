"""Extraction benchmarks (run from the repo root: python -m bench.extraction.<script>)."""
