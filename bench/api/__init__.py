"""HTTP API benchmarks (results in bench/results/api.md)."""
