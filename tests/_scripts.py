"""The benchmarks as modules for the tests: benchmark_script("model_bench") is benchmarks.model_bench,
benchmark_script("studies.bmm_sure_gain") benchmarks.studies.bmm_sure_gain -- imported as the package they are
(`python -m benchmarks.NAME` runs them), from the repo root that conftest.py puts on sys.path."""
from __future__ import annotations

import importlib
from types import ModuleType


def benchmark_script(name: str) -> ModuleType:
    """benchmarks/<name>.py (name: dotted below benchmarks/, e.g. "studies.transfer"), imported once."""
    return importlib.import_module(f"benchmarks.{name}")
