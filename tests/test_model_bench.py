"""benchmarks/model_bench.py's CPU side: which workloads a --workloads value names, and the ratios it reports
from rows (SYNTHETIC timings written in the tests; the GPU runs are not tested here)."""
from __future__ import annotations

import pytest

from tests._scripts import benchmark_script


def _model_bench():
    return benchmark_script("model_bench")


def test_workload_prefixes_with_and_without_commas():
    mb = _model_bench()
    names = lambda spec: [w.name for w in mb.select_workloads(spec)]  # noqa: E731
    # "," separates prefixes; "Llama" names both Llama workloads, in WORKLOADS' order
    assert names("T5,BERT") == ["BERT-large (4 layers), fp16, 16x384", "T5-base, bf16, 8x512 -> 128"]
    assert len(names("Llama")) == 2
    # a prefix that holds a comma: ";" separates, so prefill and decode can be named apart
    assert names("Llama-3-8B widths (2 layers), bf16, decode;Swin") == [
        "Llama-3-8B widths (2 layers), bf16, decode 8x1", "Swin-T, fp16, batch 32"]
    assert names("no such model") == []


def _row(step: float, compile_s: float, run: str) -> dict:
    return {"step_ms": step, "compile_s": compile_s, "run": run}


def test_ratios_pair_rows_of_one_run_and_one_tag():
    """SYNTHETIC rows: each perfmodel row is set against default mode of its own run (and, where two processes
    shared one run label, of its own tag); stock's ratio to default mode of its run caps the baseline."""
    mb = _model_bench()
    vs = {"max-autotune": _row(1.8, 100.0, "a"), "default": _row(2.0, 10.0, "a"),
          "default@x": _row(2.0, 5.0, "b"), "perfmodel@x": _row(1.6, 10.0, "b"),
          "perfmodel@y": _row(1.0, 4.0, "b"), "default@y": _row(1.1, 4.0, "b")}
    res = {"workloads": {"GPT-2 124M, fp16, 8x512": {"variants": vs}}}
    step, comp = mb.ratios(res)["perfmodel"]["GPT-2 124M, fp16, 8x512"]
    # perfmodel@x against default@x (2.0 / 1.6, 10 / 5), perfmodel@y against default@y (1.1 / 1.0, 4 / 4),
    # over stock's 2.0 / 1.8 of default mode in its run
    assert step == pytest.approx((2.0 / 1.6 * 1.1 / 1.0) ** 0.5 / (2.0 / 1.8), rel=1e-9)
    assert comp == pytest.approx((10.0 / 5.0 * 4.0 / 4.0) ** 0.5, rel=1e-9)
    assert mb.headline(res) == (step, step, comp, comp)
