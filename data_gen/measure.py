"""Timing, correctness and physical-limit checks (docs/design.md, "Measuring").

Timing follows triton.testing.do_bench: CUDA events around each run, the L2 flushed (a buffer of
twice the L2 zeroed) before each, warm-up first, the median reported. Many callables are timed in
one batch: one pass of single runs sizes each callable's repetitions to a time budget, a second
pass runs them; the host syncs twice per batch, not per run.

A GPU spin before each run hides the host's launch latency, as long as the host enqueues the run
before the GPU gets to it. A run the GPU reached first (its start event had completed by the time the
host had enqueued the kernel and the end event: the host was descheduled, e.g. by the sweep's compile
workers) may have timed an idle GPU: it is discarded and re-run (`Bench.last_stalls` counts them).
Checking the host's own enqueue time instead flags ~9 runs per config under the sweep's compiles,
nearly all harmless (the GPU is usually further behind than the spin), and cut throughput 3x.
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
    # Rounds of min_reps extra runs for a callable left with fewer than min_reps runs enqueued ahead of
    # the GPU. After them, its median is over every run, stalled ones included (counted all the same).
    stall_retries: int = 5
    stall_check: bool = True  # False: keep (still count) stalled runs, as the sweeps before the check did


class Bench:
    def __init__(self, device: torch.device, l2_bytes: int, settings: TimingSettings = TimingSettings()):
        self.device = device
        self.settings = settings
        self._flush_buf = torch.empty(max(2 * l2_bytes, 64 * 2**20), dtype=torch.int8, device=device)
        clock_hz = torch.cuda.get_device_properties(device).clock_rate * 1e3 if hasattr(
            torch.cuda.get_device_properties(device), "clock_rate") else 2e9
        self._sleep_cycles = int(settings.pre_sleep_us * 1e-6 * clock_hz)
        self.flush_ms = self._measure_flush()
        self.last_stalls: list[int] = []  # per callable of the last time_many: runs the GPU waited for

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

    def _run(self, fn: Callable[[], object], reps: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event, bool]]:
        """(start, end, stalled) per run. stalled: the GPU had already passed `start` when the host had
        enqueued fn and `end`, so it may have waited for them between the events, and that was timed."""
        out = []
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
            out.append((start, end, start.query()))
        return out

    def time_many(self, fns: Sequence[Callable[[], object]], on_busy: Callable[[], None] | None = None
                  ) -> list[tuple[float, int]]:
        """(median ms, number of runs in the median) per callable. Each has been warmed up by the caller.
        Runs the GPU reached before the host had enqueued them are re-run and left out (`last_stalls`)."""
        s = self.settings
        first = [self._run(fn, 1) for fn in fns]
        torch.cuda.synchronize()
        t_first = [start.elapsed_time(end) for ((start, end, _),) in first]
        reps = [max(s.min_reps - 1, min(s.max_reps - 1, int(s.budget_ms / (t + self.flush_ms + s.pre_sleep_us * 1e-3))))
                for t in t_first]
        runs = [f + self._run(fn, r) for f, fn, r in zip(first, fns, reps)]
        if on_busy is not None:
            on_busy()  # e.g. read the SM clock while the GPU is working
        for _ in range(s.stall_retries if s.stall_check else 0):
            short = [i for i, rs in enumerate(runs) if sum(not st for *_, st in rs) < s.min_reps]
            if not short:
                break
            for i in short:
                runs[i] += self._run(fns[i], s.min_reps)
        torch.cuda.synchronize()
        out, self.last_stalls = [], []
        for rs in runs:
            clean = [a.elapsed_time(b) for a, b, st in rs if not (st and s.stall_check)]
            smp = clean if len(clean) >= s.min_reps else [a.elapsed_time(b) for a, b, _ in rs]
            out.append((statistics.median(smp), len(smp)))
            self.last_stalls.append(sum(st for *_, st in rs))
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
