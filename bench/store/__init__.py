"""Store and index benchmarks (results in bench/results/store.md)."""
