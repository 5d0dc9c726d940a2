"""The scale benchmark (`make bench-scale`): tessera on a kwok cluster of 1,000 GPU nodes (benchmarks/scale/run.py)."""
