"""Helpers the benchmarks share; no benchmark here (runner.py: a worker process per variant; clock.py: where a
compile's time goes)."""
