"""Store and index benchmarks (results in bench/results/store.md; load and chaos: load.md, chaos.md)."""
