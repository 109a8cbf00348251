"""Benchmarks and the quality harness of FisherAtlas (not part of the installed package)."""
