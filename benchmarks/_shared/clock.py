"""Where a compile's time goes: the clock the GPU compile benchmarks (inductor_bench.py, model_bench.py) share."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

# The ops whose template autotuning is GEMM tuning; any other op's (bmm, baddbmm, convolution, ...) is other tuning.
GEMM_OPS = ("mm", "addmm", "mm_plus_mm", "_int_mm", "scaled_mm")
TEMPLATE_SUFFIXES = ("_template_precompiling", "_template_autotuning")
# Max-autotune's first-run tuning of pointwise and reduction kernels.
POINTWISE_TUNING = ("CachingAutotuner.coordinate_descent_tuning", "CachingAutotuner.benchmark_all_configs")


def split_timers(delta: dict[str, float], pad_s: float) -> dict[str, Any]:
    """The tuning parts of a compile from the growth of Inductor's timers (torch._dynamo.utils.
    compilation_time_metrics, summed per key) over it and the time inside pad_mm's padding decision:
    autotune_s (every template's precompiling and autotuning), gemm_tuning_s (the GEMM ops' templates plus the
    pad decision, where stock benchmarks padded against unpadded mm), other_tuning_s (other ops' templates,
    coordinate descent and config benchmarking of pointwise and reduction kernels), and the timers."""
    gemm = other = 0.0
    for k, v in delta.items():
        suffix = next((s for s in TEMPLATE_SUFFIXES if k.endswith(s)), None)
        if suffix is not None:
            if k[: -len(suffix)] in GEMM_OPS:
                gemm += v
            else:
                other += v
        elif k in POINTWISE_TUNING:
            other += v
    autotune = sum(v for k, v in delta.items() if k.endswith(TEMPLATE_SUFFIXES))
    return {"autotune_s": autotune, "pad_decision_s": pad_s, "gemm_tuning_s": gemm + pad_s,
            "other_tuning_s": other,
            "timers": {k: round(v, 3) for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v >= 0.01}}


class CompileClock:
    """start() before a compile, stop() after it: split_timers() of what the compile added. The pad decision is
    timed while pad_timing() is open (it wraps whatever decision is installed when it opens: stock's benchmark,
    or a perfmodel hook's)."""

    def __init__(self) -> None:
        from torch._dynamo.utils import compilation_time_metrics

        self.metrics = compilation_time_metrics
        self.pad_s = 0.0
        self._before: dict[str, float] = {}

    def _sums(self) -> dict[str, float]:
        return {k: float(sum(v)) for k, v in self.metrics.items()}

    def start(self) -> None:
        self._before, self.pad_s = self._sums(), 0.0

    def stop(self) -> dict[str, Any]:
        delta = {k: v - self._before.get(k, 0.0) for k, v in self._sums().items()}
        return split_timers({k: v for k, v in delta.items() if v > 0}, self.pad_s)

    @contextlib.contextmanager
    def pad_timing(self) -> Iterator[None]:
        from torch._inductor.fx_passes import pad_mm

        inner = pad_mm._should_pad

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.pad_s += time.perf_counter() - t0

        pad_mm._should_pad = timed
        try:
            yield
        finally:
            pad_mm._should_pad = inner
