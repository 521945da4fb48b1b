"""Timing, correctness and physical-limit checks (shared/DESIGN.md, "Measuring").

Timing follows triton.testing.do_bench: CUDA events around each run, the L2 flushed (a buffer of
twice the L2 zeroed) before each, warm-up first, the median reported. Many callables are timed in
one batch: one pass of single runs sizes each callable's repetitions to a time budget, a second
pass runs them; the host syncs twice per batch, not per run.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from perfmodel.devices import DeviceSpec

# Relative Frobenius error allowed against an fp64/fp32 reference, per (dtype, tf32).
TOLERANCE = {("float16", False): 1e-2, ("bfloat16", False): 3e-2, ("float32", True): 1e-2,
             ("float32", False): 1e-4}
REJECT_ABOVE = 1.0   # fraction of the physical peak: impossible, the row is rejected
FLAG_ABOVE = 0.9
FLAG_BELOW = 0.01


@dataclass
class TimingSettings:
    budget_ms: float = 0.8   # GPU time per callable in the second pass (flush and spin included)
    min_reps: int = 3
    max_reps: int = 40
    # GPU spin before each timed run (see Bench._run). Without it, host launch latency is timed on short
    # kernels: benchmarks/launch_gap_check.py measured 0.04-0.2 ms instead of ~5 us on the H100.
    pre_sleep_us: float = 100.0


class Bench:
    def __init__(self, device: torch.device, l2_bytes: int, settings: TimingSettings = TimingSettings()):
        self.device = device
        self.settings = settings
        self._flush_buf = torch.empty(max(2 * l2_bytes, 64 * 2**20), dtype=torch.int8, device=device)
        clock_hz = torch.cuda.get_device_properties(device).clock_rate * 1e3 if hasattr(
            torch.cuda.get_device_properties(device), "clock_rate") else 2e9
        self._sleep_cycles = int(settings.pre_sleep_us * 1e-6 * clock_hz)
        self.flush_ms = self._measure_flush()

    def flush(self) -> None:
        self._flush_buf.zero_()

    def _measure_flush(self) -> float:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        for _ in range(3):
            self.flush()
        ev[0].record()
        for _ in range(10):
            self.flush()
        ev[1].record()
        torch.cuda.synchronize()
        return ev[0].elapsed_time(ev[1]) / 10

    def _run(self, fn: Callable[[], object], reps: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
        pairs = []
        for _ in range(reps):
            self.flush()
            if self.settings.pre_sleep_us > 0:
                # Keep the GPU busy while the host enqueues start, fn and end: otherwise a slow launch
                # (a Python launcher, a busy CPU) leaves the GPU idle between the events and is timed.
                torch.cuda._sleep(self._sleep_cycles)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        return pairs

    def time_many(self, fns: Sequence[Callable[[], object]], on_busy: Callable[[], None] | None = None
                  ) -> list[tuple[float, int]]:
        """(median ms, number of timed runs) per callable. Each has been warmed up by the caller."""
        s = self.settings
        first = [self._run(fn, 1) for fn in fns]
        torch.cuda.synchronize()
        samples = [[a.elapsed_time(b) for a, b in runs] for runs in first]
        reps = [max(s.min_reps - 1, min(s.max_reps - 1, int(s.budget_ms / (t[0] + self.flush_ms + s.pre_sleep_us * 1e-3))))
                for t in samples]
        second = [self._run(fn, r) for fn, r in zip(fns, reps)]
        if on_busy is not None:
            on_busy()  # e.g. read the SM clock while the GPU is working
        torch.cuda.synchronize()
        out = []
        for smp, runs in zip(samples, second):
            smp = smp + [a.elapsed_time(b) for a, b in runs]
            out.append((statistics.median(smp), len(smp)))
        return out


def relative_error(out: torch.Tensor, ref: torch.Tensor, ref_norm: torch.Tensor) -> torch.Tensor:
    """||out - ref|| / ||ref|| as a 0-d device tensor (no host sync); NaN stays NaN."""
    return torch.linalg.vector_norm(out.float() - ref) / ref_norm


def fraction_of_peak(flops: float, nbytes: float, ms: float, dtype: str, allow_tf32: bool,
                     spec: DeviceSpec, sm_clock_mhz: float | None) -> float:
    """max(achieved FLOP/s over the peak at the measured clock, achieved bytes/s over DRAM bandwidth)."""
    s = ms * 1e-3
    return max(flops / s / spec.peak_flops(dtype, allow_tf32, sm_clock_mhz), nbytes / s / spec.peak_bytes_per_s())


def validate(frac: float) -> tuple[str, str]:
    """(status, flag) for a timing's fraction of the physical peak."""
    if not frac == frac or frac > REJECT_ABOVE:
        return "rejected_peak", "above_peak"
    if frac > FLAG_ABOVE:
        return "ok", "near_peak"
    if frac < FLAG_BELOW:
        return "ok", "below_1pct"
    return "ok", ""
