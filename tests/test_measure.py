"""The physical-limit validator (data_gen/measure.py) and the device specs' peak rates."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from perfmodel.data_gen.measure import FLAG_ABOVE, FLAG_BELOW, REJECT_ABOVE, fraction_of_peak, validate
from perfmodel import GemmProblem
from perfmodel.devices import DEFAULT_DEVICE, KNOWN_DEVICES, get_spec, match_spec

H100 = get_spec("h100-sxm")
FP16_PEAK_1980 = 132 * 4096 * 1.98e9  # FLOP/s: 132 SMs x 4096 dense fp16 FLOP/clk/SM x 1.98 GHz


def frac(p: GemmProblem, ms: float, clock: float | None = 1980.0) -> float:
    return fraction_of_peak(p.flops, p.min_bytes, ms, p.dtype, p.allow_tf32, H100, clock)


def ms_at_fraction(p: GemmProblem, f: float, clock: float = 1980.0) -> float:
    """The time at which a compute-bound problem runs at fraction f of the peak at `clock`."""
    return p.flops / (f * H100.peak_flops(p.dtype, p.allow_tf32, clock)) * 1e3


# ---- device specs ----

def test_h100_peaks():
    # the peak at a clock, by hand (FP16_PEAK_1980); without a clock, at the max boost
    assert H100.peak_flops("float16", sm_clock_mhz=1980) == pytest.approx(FP16_PEAK_1980, rel=1e-12)
    assert H100.peak_flops("float16") == pytest.approx(FP16_PEAK_1980, rel=1e-12)  # default: max boost
    assert H100.peak_flops("bfloat16", sm_clock_mhz=1980) == pytest.approx(FP16_PEAK_1980, rel=1e-12)
    assert H100.peak_flops("float32", allow_tf32=True, sm_clock_mhz=1980) == pytest.approx(132 * 2048 * 1.98e9)
    assert H100.peak_flops("float32", sm_clock_mhz=1980) == pytest.approx(132 * 256 * 1.98e9)
    # allow_tf32 only matters for fp32
    assert H100.peak_flops("float16", allow_tf32=True) == H100.peak_flops("float16")
    # the datasheet's 989.4 dense fp16 TFLOP/s is quoted at a 1830 MHz boost
    assert H100.peak_flops("float16", sm_clock_mhz=1830) == pytest.approx(989.4e12, rel=1e-3)
    assert H100.peak_bytes_per_s() == pytest.approx(3.35e12)


def test_peak_scales_with_clock():
    assert H100.peak_flops("float16", sm_clock_mhz=990) == pytest.approx(FP16_PEAK_1980 / 2)
    assert H100.peak_flops("float16", sm_clock_mhz=1000) == pytest.approx(132 * 4096 * 1e9)


def test_get_spec_and_match():
    assert DEFAULT_DEVICE in KNOWN_DEVICES
    with pytest.raises(ValueError, match="device"):
        get_spec("h100")
    assert match_spec("NVIDIA H100 80GB HBM3", 132) is H100
    assert match_spec("NVIDIA H100 80GB HBM3") is H100
    assert match_spec("NVIDIA H100 PCIe", 114).name == "h100-pcie"
    assert match_spec("NVIDIA H200", 132).name == "h200"
    assert match_spec("NVIDIA A100-SXM4-80GB", 108).name == "a100-sxm"
    assert match_spec("NVIDIA GeForce RTX 4090", 128) is None
    # a known marketing name with an unexpected SM count is not that spec
    assert match_spec("NVIDIA A100-SXM4-80GB", 100) is None


# ---- fraction_of_peak ----

def test_fraction_of_peak_compute_bound():
    p = GemmProblem(m=8192, n=8192, k=8192, dtype="float16")
    # DESIGN's sanity figure: best Triton config 1.45 ms -> 760 TFLOP/s, ~71 % of the 1980 MHz peak
    f = frac(p, 1.45)
    assert f == pytest.approx(p.flops / 1.45e-3 / FP16_PEAK_1980, rel=1e-12)
    assert 0.70 < f < 0.72
    assert validate(f) == ("ok", "")


def test_fraction_of_peak_memory_bound():
    # a GEMV-like problem: the byte term dominates, and it does not depend on the clock
    p = GemmProblem(m=1, n=8192, k=8192, dtype="float16")
    ms = 0.05
    expected = p.min_bytes / (ms * 1e-3) / 3.35e12
    assert frac(p, ms) == pytest.approx(expected, rel=1e-12)
    assert frac(p, ms, clock=500.0) == pytest.approx(expected, rel=1e-12)
    # faster than DRAM allows: rejected at any clock
    too_fast = p.min_bytes / 3.35e12 * 1e3 / 1.05
    assert validate(frac(p, too_fast))[0] == "rejected_peak"


def test_above_peak_rejected():
    p = GemmProblem(m=8192, n=8192, k=8192, dtype="float16")
    ms = ms_at_fraction(p, 1.02)
    assert frac(p, ms) == pytest.approx(1.02)
    assert validate(frac(p, ms)) == ("rejected_peak", "above_peak")


def test_near_peak_flagged():
    p = GemmProblem(m=8192, n=8192, k=8192, dtype="bfloat16")
    assert validate(frac(p, ms_at_fraction(p, 0.95))) == ("ok", "near_peak")
    assert validate(frac(p, ms_at_fraction(p, 0.85))) == ("ok", "")


def test_below_one_percent_flagged():
    p = GemmProblem(m=4096, n=4096, k=4096, dtype="float16")
    assert validate(frac(p, ms_at_fraction(p, 0.005))) == ("ok", "below_1pct")
    assert validate(frac(p, ms_at_fraction(p, 0.02))) == ("ok", "")


def test_same_time_ok_at_full_clock_rejected_at_low_clock():
    p = GemmProblem(m=8192, n=8192, k=8192, dtype="float16")
    ms = 1.30  # ~79 % of the 1980 MHz peak; ~157 % of the 1000 MHz one
    f_hi, f_lo = frac(p, ms, clock=1980.0), frac(p, ms, clock=1000.0)
    assert f_lo == pytest.approx(f_hi * 1980 / 1000)
    assert validate(f_hi) == ("ok", "")
    assert validate(f_lo) == ("rejected_peak", "above_peak")
    # clock unknown (no NVML): the max boost clock is used
    assert frac(p, ms, clock=None) == pytest.approx(f_hi)


def test_tf32_peak_used_for_fp32_with_tf32():
    p32 = GemmProblem(m=4096, n=4096, k=4096, dtype="float32")
    p_tf = GemmProblem(m=4096, n=4096, k=4096, dtype="float32", allow_tf32=True)
    ms = 2.0
    # 137 GFLOP in 2 ms = 68.7 TFLOP/s: above the fp32 CUDA-core peak (66.9), fine for tf32 (535)
    assert validate(frac(p32, ms))[0] == "rejected_peak"
    assert validate(frac(p_tf, ms)) == ("ok", "")
    assert frac(p32, ms) == pytest.approx(8 * frac(p_tf, ms))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_and_inf_rejected(value):
    assert validate(value)[0] == "rejected_peak"


def test_nan_time_rejected():
    p = GemmProblem(m=64, n=64, k=64)
    f = frac(p, float("nan"))
    assert math.isnan(f)
    assert validate(f)[0] == "rejected_peak"


@pytest.mark.parametrize("value,expected", [
    (REJECT_ABOVE, ("ok", "near_peak")),            # exactly 100 % is not above the peak
    (REJECT_ABOVE + 1e-9, ("rejected_peak", "above_peak")),
    (FLAG_ABOVE, ("ok", "")),                        # "above 90 %" is strict
    (FLAG_ABOVE + 1e-9, ("ok", "near_peak")),
    (FLAG_BELOW, ("ok", "")),                        # "below 1 %" is strict
    (FLAG_BELOW - 1e-9, ("ok", "below_1pct")),
    (0.5, ("ok", "")),
])
def test_validate_thresholds(value, expected):
    assert (REJECT_ABOVE, FLAG_ABOVE, FLAG_BELOW) == (1.0, 0.9, 0.01)
    assert validate(value) == expected


# ---- Bench.time_many: runs the GPU reached before the host had enqueued them (synthetic events) ----

class _FakeEvent:
    """A CUDA event stand-in: the elapsed time of an (start, end) pair is the value the test's fn set,
    and query() (has the GPU passed this event?) what the fn said about its run."""
    current = 0.0
    gpu_passed = False

    def __init__(self, enable_timing: bool = True) -> None:
        self.ms = None

    def record(self) -> None:
        self.ms = _FakeEvent.current

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return end.ms

    def query(self) -> bool:
        return _FakeEvent.gpu_passed


def _fake_bench(monkeypatch, pre_sleep_us: float = 100.0, **kw):
    import torch

    from perfmodel.data_gen.measure import Bench, TimingSettings

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    bench = Bench.__new__(Bench)  # no GPU: no flush buffer, a fixed flush time
    bench.settings = TimingSettings(pre_sleep_us=pre_sleep_us, **kw)
    bench.flush = lambda: None
    bench.flush_ms = 0.01
    bench._sleep_cycles = 0
    bench.last_stalls = []
    return bench


def _kernel(times_ms, stall_calls=()):
    """fn whose n-th call 'runs' times_ms[n] (the value its end event records); on the calls in
    stall_calls the GPU has passed the start event by the time the host has enqueued the run."""
    calls = []

    def fn():
        n = len(calls)
        calls.append(n)
        _FakeEvent.current = times_ms[min(n, len(times_ms) - 1)]
        _FakeEvent.gpu_passed = n in stall_calls
    return fn, calls


def test_time_many_drops_runs_enqueued_slower_than_the_spin(monkeypatch):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3)
    # 3 runs (min_reps), the middle two stalled and timed 10x slow: without the check the median is 1.0
    fn, calls = _kernel([0.1, 1.0, 1.0, 0.1, 0.1, 0.1], stall_calls={1, 2})
    (ms, n), = bench.time_many([fn])
    assert bench.last_stalls == [2]
    assert len(calls) == 6  # one extra round of min_reps runs replaced them
    assert (ms, n) == (0.1, 4)


def test_time_many_without_stalls_is_the_plain_median(monkeypatch):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3)
    fn, calls = _kernel([0.3, 0.1, 0.2])
    assert bench.time_many([fn]) == [(0.2, 3)]
    assert bench.last_stalls == [0] and len(calls) == 3


def test_time_many_keeps_stalled_runs_when_retries_run_out(monkeypatch):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, stall_retries=1)
    fn, calls = _kernel([0.5] * 6, stall_calls=set(range(6)))
    (ms, n), = bench.time_many([fn])
    assert (ms, n) == (0.5, 6) and bench.last_stalls == [6] and len(calls) == 6


def test_time_many_check_can_be_turned_off(monkeypatch):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, stall_check=False)
    fn, calls = _kernel([0.1, 1.0, 1.0], stall_calls={1, 2})
    assert bench.time_many([fn]) == [(1.0, 3)]  # the stalled runs are kept, and counted
    assert bench.last_stalls == [2] and len(calls) == 3


# ---- time_many: a first run handed in, and slow configs kept at their single run (synthetic events) ----

def test_time_many_uses_a_handed_in_first_run(monkeypatch):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3)
    fn, calls = _kernel([0.3, 0.1, 0.2, 9.0])
    other, other_calls = _kernel([0.5, 0.5, 0.5, 9.0])
    first = bench.timed_run(fn)  # e.g. the sweep's correctness launch
    assert len(calls) == 1
    out = bench.time_many([fn, other], first_runs=[first, None])
    # fn: the handed-in run is its first pass (no run of its own there), then min_reps - 1 more
    assert len(calls) == 3 and out[0] == (0.2, 3)
    assert len(other_calls) == 3 and out[1] == (0.5, 3)  # no first run given: its own first pass


def test_time_many_first_run_sizes_the_repetitions(monkeypatch):
    # budget 0.8 ms, flush 0.01 + spin 0.1: a 0.09 ms first run gets int(0.8 / 0.2) = 4 more runs
    bench = _fake_bench(monkeypatch, budget_ms=0.8, min_reps=3)
    fn, calls = _kernel([0.09] * 10)
    bench.time_many([fn], first_runs=[bench.timed_run(fn)])
    assert len(calls) == 5


def test_slow_config_keeps_its_single_run(monkeypatch):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, slow_factor=2.0, slow_min_ms=0.5)
    fast, fast_calls = _kernel([0.4, 0.4, 0.4])
    at_factor, at_calls = _kernel([0.8, 0.8, 0.8])   # exactly 2x the fastest: not above it
    slow, slow_calls = _kernel([1.0, 7.0, 7.0])      # 2.5x and above 0.5 ms: one run
    firsts = [bench.timed_run(f) for f in (fast, at_factor, slow)]
    out = bench.time_many([fast, at_factor, slow], first_runs=firsts, peers=[True, True, True])
    assert out == [(0.4, 3), (0.8, 3), (1.0, 1)]
    assert (len(fast_calls), len(at_calls), len(slow_calls)) == (3, 3, 1)
    assert bench.last_single_run == [False, False, True]


def test_slow_rule_floor(monkeypatch):
    # 4x the fastest but not above slow_min_ms: a short kernel keeps its repetitions
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, slow_factor=2.0, slow_min_ms=0.5)
    fast, _ = _kernel([0.1] * 3)
    short, short_calls = _kernel([0.4] * 3)
    assert bench.time_many([fast, short], peers=[True, True]) == [(0.1, 3), (0.4, 3)]
    assert len(short_calls) == 3 and bench.last_single_run == [False, False]


def test_stalled_first_run_does_not_decide_the_slow_rule(monkeypatch):
    """A first run the GPU reached before the host had enqueued it may have timed an idle GPU: it neither
    keeps its config at one run nor sets the reference (seen on the H100: a 0.33 ms kernel's stalled
    first run above 0.5 ms), so the config gets its repetitions, timed clean."""
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, slow_factor=2.0, slow_min_ms=0.5)
    fast, _ = _kernel([0.1] * 9)
    short, short_calls = _kernel([0.9] + [0.33] * 8, stall_calls={0})  # stalled first run 0.9 ms
    out = bench.time_many([fast, short], first_runs=[None, bench.timed_run(short)], peers=[True, True])
    assert bench.last_single_run == [False, False]
    # 2 repetitions, then min_reps more for the clean runs the stalled one left it short of
    assert out[1] == (0.33, 5) and len(short_calls) == 6 and bench.last_stalls == [0, 1]
    # nor is a stalled fast first run the reference that would make the others slow
    bench2 = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, slow_factor=2.0, slow_min_ms=0.5)
    quick, _ = _kernel([0.2] + [1.0] * 8, stall_calls={0})
    other, other_calls = _kernel([1.5] * 9)
    bench2.time_many([quick, other], first_runs=[bench2.timed_run(quick), None], peers=[True, True])
    assert bench2.last_single_run == [False, False] and len(other_calls) == 3


def test_slow_config_stalled_run_kept_without_stall_check(monkeypatch):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, slow_factor=2.0, slow_min_ms=0.5,
                        stall_check=False)
    fast, _ = _kernel([0.4] * 3)
    slow, slow_calls = _kernel([3.0, 1.1], stall_calls={0})
    assert bench.time_many([fast, slow], peers=[True, True])[1] == (3.0, 1)
    assert len(slow_calls) == 1 and bench.last_stalls == [0, 1]


def test_non_peers_never_kept_at_one_run_nor_the_reference(monkeypatch):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, slow_factor=2.0, slow_min_ms=0.5)
    # cuBLAS 12x slower than the Triton configs: still its repetitions
    cublas, cublas_calls = _kernel([5.0] * 3)
    t1, _ = _kernel([0.4] * 3)
    t2, _ = _kernel([0.45] * 3)
    assert bench.time_many([cublas, t1, t2], peers=[False, True, True]) == [(5.0, 3), (0.4, 3), (0.45, 3)]
    assert len(cublas_calls) == 3 and bench.last_single_run == [False, False, False]
    # a fast cuBLAS does not set the reference: 0.9 and 1.5 ms are within 2x of the fastest peer (0.9),
    # though both are above 2x cuBLAS's 0.3 ms
    cublas, _ = _kernel([0.3] * 3)
    t1, t1_calls = _kernel([0.9] * 3)
    t2, t2_calls = _kernel([1.5] * 3)
    assert bench.time_many([cublas, t1, t2], peers=[False, True, True]) == [(0.3, 3), (0.9, 3), (1.5, 3)]
    assert len(t1_calls) == len(t2_calls) == 3
    # without peers (the cuBLAS and pad sweeps, the benchmarks) no callable is kept at one run
    fast, _ = _kernel([0.4] * 3)
    slow, slow_calls = _kernel([2.0] * 3)
    assert bench.time_many([fast, slow]) == [(0.4, 3), (2.0, 3)] and len(slow_calls) == 3


@pytest.mark.parametrize("factor", [None, 0.0])
def test_slow_factor_off_gives_every_config_its_repetitions(monkeypatch, factor):
    bench = _fake_bench(monkeypatch, budget_ms=0.0, min_reps=3, slow_factor=factor, slow_min_ms=0.5)
    fast, _ = _kernel([0.4] * 3)
    slow, slow_calls = _kernel([4.0] * 3)
    assert bench.time_many([fast, slow], peers=[True, True]) == [(0.4, 3), (4.0, 3)]
    assert len(slow_calls) == 3 and bench.last_single_run == [False, False]


def test_timing_settings_in_the_shard_header():
    # The sweep's header records vars(settings.timing): the slow-config rule is in it
    from perfmodel.data_gen.settings import GemmSweepSettings

    timing = vars(GemmSweepSettings().timing)
    assert timing["slow_factor"] == 2.0 and timing["slow_min_ms"] == 0.5


# ---- gemm_sweep.measure_problem on the CPU: the real kernel under TRITON_INTERPRET=1, synthetic events ----

MEASURE_CHILD = textwrap.dedent("""
    import collections, json
    import torch
    from triton.runtime.errors import OutOfResources
    from perfmodel import GemmConfig, GemmProblem
    from perfmodel.data_gen import gemm_sweep, kernel
    from perfmodel.data_gen.measure import Bench, TimingSettings
    from perfmodel.devices import get_spec

    class Event:  # elapsed time: what the launch that ran between the pair set; never stalled
        current, created = 0.0, 0
        def __init__(self, enable_timing=True):
            Event.created += 1
        def record(self):
            self.ms = Event.current
        def elapsed_time(self, end):
            return end.ms
        def query(self):
            return False

    torch.cuda.Event = Event
    torch.cuda._sleep = lambda cycles: None
    torch.cuda.synchronize = lambda: None

    FAST, SLOW, NEAR, WRONG = GemmConfig(16, 16, 16, 8, 1, 2), GemmConfig(32, 16, 32, 4, 2, 4), \\
        GemmConfig(16, 32, 16, 2, 3, 8), GemmConfig(32, 32, 16, 8, 1, 4)
    # Out of shared memory on the device (the interpreter has no limit: its prepare raises as Triton's would)
    BIG = GemmConfig(256, 256, 128, 8, 5, 8)
    MS = {FAST: 0.6, SLOW: 2.0, NEAR: 0.9, WRONG: 0.7}
    launches = collections.Counter()
    real_launch, real_prepare, real_mm = kernel.launch, kernel.prepare, torch.mm
    prepared = []

    def launch(a, b, c, cfg, allow_tf32=False, static=False):
        launches[cfg] += 1
        Event.current = MS[cfg]
        if cfg != WRONG:  # WRONG writes nothing: its output stays poisoned
            real_launch(a, b, c, cfg, allow_tf32, static)

    def prepare(a, b, c, cfg, allow_tf32=False, static=False):
        prepared.append(Event.created)
        real_prepare(a, b, c, cfg, allow_tf32, static)
        if cfg == BIG:
            raise OutOfResources(294912, 232448, "shared memory")

    def mm(a, b):  # cuBLAS, the slowest callable (the fp64 reference is not timed)
        if a.dtype != torch.float64:
            launches["cublas"] += 1
            Event.current = 5.0
        return real_mm(a, b)

    kernel.launch, kernel.prepare, torch.mm = launch, prepare, mm
    bench = Bench.__new__(Bench)
    bench.device, bench.flush_ms, bench._sleep_cycles = torch.device("cpu"), 0.01, 0
    bench.settings = TimingSettings(budget_ms=0.0, min_reps=3, slow_factor=2.0, slow_min_ms=0.5)
    bench.flush = lambda: None
    clock = type("Clock", (), {"sm_clock_mhz": lambda self: 1980.0})()
    p = GemmProblem(m=40, n=24, k=56, dtype="float32")
    cfgs = [(FAST, ""), (BIG, ""), (SLOW, ""), (NEAR, ""), (GemmConfig(64, 64, 64), "compile:Error:x"), (WRONG, "")]
    rows = gemm_sweep.measure_problem(p, cfgs, bench, get_spec("h100-sxm"), clock)
    print("RESULTS" + json.dumps({
        "rows": [{k: r.get(k) for k in ("kind", "block_m", "block_n", "block_k", "status", "ms", "reps", "rel_err")}
                 for r in rows],
        "launches": {str(k): v for k, v in launches.items()},
        "events": Event.created, "prepared": prepared, "single": bench.last_single_run}))
""")


@pytest.fixture(scope="module")
def measured(repo_root):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(repo_root)}
    proc = subprocess.run([sys.executable, "-c", MEASURE_CHILD], env=env, cwd=repo_root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULTS"))
    return json.loads(line[len("RESULTS"):])


def _row(measured, block):
    (r,) = [r for r in measured["rows"] if r["kind"] == "triton" and (r["block_m"], r["block_n"], r["block_k"]) == block]
    return r


def test_measure_problem_times_the_correctness_launch(measured):
    launches = measured["launches"]
    # every Triton launch is a timed run: min_reps for the configs timed in full (no extra correctness
    # launch), one for the slow config; cuBLAS: its own warm-up/correctness call and min_reps runs
    assert launches["cublas"] == 4
    assert sorted(v for k, v in launches.items() if k != "cublas") == [1, 3, 3, 3]
    # two events per timed run, none for the config that failed to load
    assert measured["events"] == 2 * (sum(launches.values()) - 1)
    assert _row(measured, (16, 16, 16))["reps"] == 3 and _row(measured, (16, 16, 16))["ms"] == 0.6
    assert _row(measured, (16, 32, 16))["reps"] == 3   # 1.5x the fastest: repetitions
    assert measured["single"] == [False, False, True, False, False]  # cuBLAS, FAST, SLOW, NEAR, WRONG


def test_measure_problem_slow_config_single_run(measured):
    slow = _row(measured, (32, 16, 32))
    assert (slow["status"], slow["ms"], slow["reps"]) == ("ok", 2.0, 1)
    (cublas,) = [r for r in measured["rows"] if r["kind"] == "cublas"]
    assert (cublas["ms"], cublas["reps"]) == (5.0, 3)  # slowest of all, never kept at one run
    assert cublas["rel_err"] < 1e-5


def test_measure_problem_out_of_resources_is_a_launch_failure(measured):
    big = _row(measured, (256, 256, 128))
    assert big["status"] == "fail:launch:OutOfResources" and big["ms"] is None
    # events created when each config's module was loaded: none before FAST's, FAST's first run (2)
    # before BIG's, and none from BIG, whose load failed before any event was recorded
    assert measured["prepared"][:3] == [0, 2, 2]
    assert _row(measured, (64, 64, 64))["status"].startswith("fail:compile:")


def test_measure_problem_catches_a_wrong_result(measured):
    assert _row(measured, (32, 32, 16))["status"] == "fail:wrong_result"
    for block in ((16, 16, 16), (32, 16, 32), (16, 32, 16)):  # the real kernel, checked on its timed first run
        assert _row(measured, block)["status"] == "ok" and _row(measured, block)["rel_err"] < 1e-5
