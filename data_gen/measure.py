"""Timing, correctness and physical-limit checks (docs/design.md, "Measuring").

Timing follows triton.testing.do_bench: CUDA events around each run, the L2 flushed (a buffer of
twice the L2 zeroed) before each, the median reported. Many callables are timed in one batch: one
pass of single runs sizes each callable's repetitions to a time budget, a second pass runs them; the
host syncs twice per batch, not per run. A caller may hand in a callable's first-pass run (the GEMM
sweep's correctness launch is timed as one, `Bench.timed_run`).

Among the callables marked as peers (the Triton configs of one problem), one whose first run took more
than `slow_factor` times the fastest peer's first run, and over `slow_min_ms`, keeps that run alone
(`Bench.last_single_run`): it cannot be near the top of the problem's ranking, and one run of a kernel
that long is within a few per cent of its median. On the largest GEMMs such configs are most of the
sweep's GPU time.

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

# One timed run: (start event, end event, stalled), see Bench.timed_run.
Run = tuple[torch.cuda.Event, torch.cuda.Event, bool]


@dataclass
class TimingSettings:
    budget_ms: float = 0.8   # GPU time per callable in the second pass (flush and spin included)
    min_reps: int = 3
    max_reps: int = 40
    # GPU spin before each timed run (see Bench.timed_run). Without it, host launch latency is timed on short
    # kernels: benchmarks/studies/launch_gap_check.py measured 0.04-0.2 ms instead of ~5 us on the H100.
    pre_sleep_us: float = 100.0
    # Rounds of min_reps extra runs for a callable left with fewer than min_reps runs enqueued ahead of
    # the GPU (one run for a callable kept at a single run, below). After them, its median is over every
    # run, stalled ones included (counted all the same).
    stall_retries: int = 5
    stall_check: bool = True  # False: keep (still count) stalled runs, as the sweeps before the check did
    # A peer callable (time_many's `peers`) whose first run took more than slow_factor times the fastest
    # peer's first run and more than slow_min_ms keeps that single run. A stalled first run decides
    # nothing (its config gets its repetitions).
    # slow_factor None or 0: every callable gets its repetitions; slow_min_ms 0: no floor.
    slow_factor: float | None = 2.0
    slow_min_ms: float = 0.5


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
        self.last_single_run: list[bool] = []  # per callable of the last time_many: kept at its first run

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

    def timed_run(self, fn: Callable[[], object]) -> Run:
        """One run of fn between CUDA events, behind an L2 flush and the GPU spin: (start, end, stalled).
        stalled: the GPU had already passed `start` when the host had enqueued fn and `end`, so it may
        have waited for them between the events, and that was timed. An exception from fn leaves no run."""
        self.flush()
        if self.settings.pre_sleep_us > 0:
            # Keep the GPU busy while the host enqueues start, fn and end: otherwise a slow launch
            # (a Python launcher, a busy CPU) leaves the GPU idle between the events and is timed.
            torch.cuda._sleep(self._sleep_cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end, start.query()

    def _run(self, fn: Callable[[], object], reps: int) -> list[Run]:
        return [self.timed_run(fn) for _ in range(reps)]

    def time_many(self, fns: Sequence[Callable[[], object]], on_busy: Callable[[], None] | None = None,
                  first_runs: Sequence[Run | None] | None = None, peers: Sequence[bool] | None = None
                  ) -> list[tuple[float, int]]:
        """(median ms, number of runs in the median) per callable. Each has been warmed up by the caller
        (a Triton kernel: its module loaded, so that no run times the load). Runs the GPU reached before
        the host had enqueued them are re-run and left out (`last_stalls`).

        first_runs: per callable, a run the caller already made with `timed_run` (it stands for the
        callable's first-pass run, which is then not made here), or None. peers: per callable, whether it
        takes part in the slow-run rule (TimingSettings.slow_factor; `last_single_run` says which kept a
        single run); None: no callable does."""
        s = self.settings
        given = list(first_runs) if first_runs is not None else [None] * len(fns)
        if len(given) != len(fns) or (peers is not None and len(peers) != len(fns)):
            raise ValueError("time_many: first_runs and peers need one entry per callable")
        first = [[run] if run is not None else self._run(fn, 1) for fn, run in zip(fns, given)]
        torch.cuda.synchronize()
        t_first = [start.elapsed_time(end) for ((start, end, _),) in first]
        # the slow rule decides on clean first runs only: a stalled one may have timed an idle GPU (a
        # 0.3 ms kernel measured at 0.6 ms would keep that single run, and its clean re-run, unrepeated)
        single = slow_single_runs([None if st and s.stall_check else t for t, ((_, _, st),) in zip(t_first, first)],
                                  peers, s)
        reps = [0 if one else
                max(s.min_reps - 1, min(s.max_reps - 1, int(s.budget_ms / (t + self.flush_ms + s.pre_sleep_us * 1e-3))))
                for t, one in zip(t_first, single)]
        runs = [f + self._run(fn, r) for f, fn, r in zip(first, fns, reps)]
        if on_busy is not None:
            on_busy()  # e.g. read the SM clock while the GPU is working
        # Clean runs each callable needs: min_reps, or one for a callable kept at its single run.
        need = [1 if one else s.min_reps for one in single]
        for _ in range(s.stall_retries if s.stall_check else 0):
            short = [i for i, rs in enumerate(runs) if sum(not st for *_, st in rs) < need[i]]
            if not short:
                break
            for i in short:
                runs[i] += self._run(fns[i], need[i])
        torch.cuda.synchronize()
        out, self.last_stalls, self.last_single_run = [], [], single
        for rs, n in zip(runs, need):
            clean = [a.elapsed_time(b) for a, b, st in rs if not (st and s.stall_check)]
            smp = clean if len(clean) >= n else [a.elapsed_time(b) for a, b, _ in rs]
            out.append((statistics.median(smp), len(smp)))
            self.last_stalls.append(sum(st for *_, st in rs))
        return out


def slow_single_runs(t_first: Sequence[float | None], peers: Sequence[bool] | None,
                     settings: TimingSettings) -> list[bool]:
    """Which callables keep their single first run: peers whose first-run time is above
    settings.slow_factor times the fastest peer's and above settings.slow_min_ms. Non-peers (cuBLAS in
    the GEMM sweep) are never kept at one run and do not set the reference; nor does a first run given
    as None (stalled: its time is not the kernel's), whose callable gets its repetitions."""
    if peers is None or not settings.slow_factor:
        return [False] * len(t_first)
    ref = min((t for t, peer in zip(t_first, peers) if peer and t is not None), default=None)
    if ref is None:
        return [False] * len(t_first)
    limit = max(settings.slow_factor * ref, settings.slow_min_ms)
    return [bool(peer) and t is not None and t > limit for t, peer in zip(t_first, peers)]


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
