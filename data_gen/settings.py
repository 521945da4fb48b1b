"""The GEMM sweep's settings, importable without Triton (the `perfmodel gen` flags read their defaults)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .measure import TimingSettings
from .problems import Budget


@dataclass
class GemmSweepSettings:
    n_random: int = 300           # random problems on top of the real-model shapes
    configs_per_group: int = 112  # stratified sample of the pruned space per aligned compile group
    configs_unaligned: int = 40   # ... per group with K or N not divisible by 16 (fewer problems)
    # Problems whose roofline estimate exceeds large_ms take milliseconds a run: they time only
    # configs_large of their group's configs, those with BLOCK_M and BLOCK_N >= 64 (smaller tiles run
    # these shapes several times slower than the best and would cost most of the sweep's GPU time).
    large_ms: float = 1.0
    configs_large: int = 24
    modes: tuple[str, ...] | None = None  # restrict to these dtype modes (float16, bfloat16, tf32, float32)
    max_per_group: int | None = None   # cap problems per compile group (spreads a short run over groups)
    time_limit_s: float | None = None  # stop cleanly (between problems) after this long
    seed: int = 0
    compile_workers: int = max(1, (os.cpu_count() or 2) - 1)
    max_problems: int | None = None
    # Only these problems (unit ids), e.g. those of an earlier dataset, to re-time it (--problems-from).
    only_units: frozenset[str] | None = None
    # The device spec the problem list and config samples are drawn with (their size budgets use its
    # bandwidth and peak), by name; None: the timing device's. A second device re-times the first's
    # problems and configs with the first's spec (--problems-from sets it from that dataset's header).
    problem_spec: str | None = None
    budget: Budget = field(default_factory=Budget)
    timing: TimingSettings = field(default_factory=TimingSettings)
