"""tessera's benchmarks: each module measures one thing against a reference taken in the same run.

`python -m benchmarks.run` runs them all and prints the tables that BENCHMARKS.md records.
"""
