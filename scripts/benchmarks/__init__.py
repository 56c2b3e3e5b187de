"""kvsweep's benchmark suite: each module measures one figure side by side and returns Markdown.

Every module defines `TITLE` and `run(quick: bool) -> Section`; `scripts/bench.py` runs them and
writes BENCHMARKS.md. Benchmarks are not tests: they print ratios, they never assert timings.
"""
