"""benchmarks/_shared/clock.py, the compile-time split the GPU compile benchmarks share, on synthetic timer values
(no compile): which timers are GEMM tuning, which other tuning, and the pad decision's clock."""
from __future__ import annotations

import pytest

from benchmarks._shared.clock import CompileClock, split_timers


def test_split_timers_parts():
    delta = {"mm_template_autotuning": 3.0, "addmm_template_precompiling": 1.0, "bmm_template_autotuning": 5.0,
             "convolution_template_autotuning": 0.5, "CachingAutotuner.coordinate_descent_tuning": 2.0,
             "CachingAutotuner.benchmark_all_configs": 0.25, "GraphLowering.codegen": 7.0, "tiny": 0.001}
    out = split_timers(delta, pad_s=0.75)
    assert out["gemm_tuning_s"] == pytest.approx(3.0 + 1.0 + 0.75)
    assert out["other_tuning_s"] == pytest.approx(5.0 + 0.5 + 2.0 + 0.25)
    assert out["autotune_s"] == pytest.approx(3.0 + 1.0 + 5.0 + 0.5)  # every template's timers
    assert out["pad_decision_s"] == 0.75
    assert list(out["timers"])[0] == "GraphLowering.codegen" and "tiny" not in out["timers"]  # by time, >= 10 ms


def test_clock_counts_what_a_compile_adds_and_times_the_pad_decision(monkeypatch):
    from torch._inductor.fx_passes import pad_mm

    clock = CompileClock()
    metrics = {"mm_template_autotuning": [1.0]}
    clock.metrics = metrics
    clock.start()
    metrics["mm_template_autotuning"].append(2.0)
    metrics["bmm_template_autotuning"] = [4.0]
    calls = []
    monkeypatch.setattr(pad_mm, "_should_pad", lambda *a, **kw: calls.append(a) or True)
    inner = pad_mm._should_pad
    with clock.pad_timing():
        assert pad_mm._should_pad is not inner and pad_mm._should_pad("m", 1, 2, "op") is True
    assert pad_mm._should_pad is inner and calls == [("m", 1, 2, "op")] and clock.pad_s > 0
    out = clock.stop()
    assert out["gemm_tuning_s"] == pytest.approx(2.0 + clock.pad_s) and out["other_tuning_s"] == pytest.approx(4.0)
