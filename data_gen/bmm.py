"""The bmm sweep's problems, configs, settings and cost estimate (no Triton here: `perfmodel data info`
and the CLI import this module; the GPU work is in bmm_sweep.py, the kernel in bmm_kernel.py).

Problems are batched GEMMs users run (attention score and value products, per-expert batches, batched
small matrices) in every dtype mode, both operand layouts; the configs are those Inductor generates
for its bmm template (the mm heuristics' DEFAULT list, scaled to the problem) plus a few of its
EXHAUSTIVE space.
"""
from __future__ import annotations

import hashlib
import itertools
import math
import os
import random
from dataclasses import dataclass, field

from perfmodel.configs import fits, inductor_default_configs, stratified_sample
from perfmodel.devices import DeviceSpec
from perfmodel.schema import BLOCK_SIZES, NUM_STAGES, PAD_ALIGNMENT, GemmConfig, GemmProblem

from .measure import TimingSettings

KIND = "bmm"  # the shard kind: one unit per problem, rows of kind "triton", "aten" and "aten_pad"
FAMILIES = ("attn_score", "attn_value", "experts", "small")

# (dtype, allow_tf32, weight). fp32 without tf32 compiles several times slower per config (tl.dot
# becomes FMAs unrolled over BLOCK_K: `compile_units`), so it gets a smaller share of the draw.
MODES = (("float16", False, 0.34), ("bfloat16", False, 0.34), ("float32", True, 0.22), ("float32", False, 0.10))
# The names `perfmodel gen bmm --modes` takes for them (fp32 with tf32 is "tf32", without it "float32")
MODE_NAMES = {"float16": ("float16", False), "bfloat16": ("bfloat16", False), "tf32": ("float32", True),
              "float32": ("float32", False)}
FAMILY_WEIGHTS = (0.3, 0.25, 0.25, 0.2)
HEAD_DIMS = (64, 128)
# Sequence lengths of real models beside the log-uniform draw: CLIP text 77, ViT 197/257/577, BERT
# 384/512, whisper 1500.
SEQ_LENGTHS = (64, 77, 128, 197, 256, 257, 384, 512, 577, 1024, 1500, 2048, 4096, 8192)

# torch 2.11's Inductor mm configs (CUDAConfigHeuristic.mm_configs, which its bmm template uses too):
# perfmodel.configs.inductor_default_configs() is torch 2.13's list, which adds one.
DEFAULT_211 = frozenset((c.block_m, c.block_n, c.block_k, c.num_stages, c.num_warps) for c in inductor_default_configs()
                        if (c.block_m, c.block_n, c.block_k, c.num_stages, c.num_warps) != (128, 256, 64, 4, 8))
# Per-thread multiply-adds per K step above which fp32 without tf32 is left out of the extra configs
# (gemm_sweep.IEEE_MAX_FMA_PER_THREAD; Inductor's own list is always timed).
IEEE_MAX_FMA_PER_THREAD = 4096


@dataclass
class BmmSweepSettings:
    n: int = 300                 # problems to draw (bmm_problems); sized for ~8 minutes on one H100
    seed: int = 0
    extra_configs: int = 6       # EXHAUSTIVE configs per problem beside Inductor's DEFAULT list
    # The share of problems that repeat an earlier problem's shape with another batch: the kernel does
    # not depend on the batch (it only sizes the grid), so they compile nothing.
    rebatch: float = 0.3
    time_limit_s: float | None = None  # stop cleanly (between problems) after this long
    compile_workers: int = max(1, (os.cpu_count() or 2) - 1)
    exclude: frozenset[str] = frozenset()  # unit ids left out of the draw (--exclude-from)
    # Draw only these dtype modes (MODE_NAMES' keys), with their MODES weights among themselves; None: all
    modes: tuple[str, ...] | None = None
    # The device spec the problem list and extra configs are drawn with (its peak and bandwidth decide
    # which problems fit the budget), by name; None: the timing device's. A second device times the
    # first's problems with the first's spec (--problems-spec h100-sxm).
    problem_spec: str | None = None
    budget: "BmmBudget" = field(default_factory=lambda: BmmBudget())
    timing: TimingSettings = field(default_factory=TimingSettings)
    aten_pre_sleep_us: float = 1000.0  # the GPU spin before aten::bmm and the padded variant (several launches)


@dataclass(frozen=True)
class BmmBudget:
    max_flops: float = 2e12        # per problem (all matrices of the batch)
    max_est_ms: float = 4.0        # roofline estimate (estimated_ms) of the best kernel
    max_bytes: float = 2e9         # operands + output
    max_output_elems: int = 2**28  # the fp64 reference output stays within 2 GiB
    max_tensor_elems: int = 2**31 - 1  # each operand: the template indexes in int32


def problem_id(p: GemmProblem) -> str:
    """The unit id of a bmm problem (its own key format: never equal to a GEMM problem's id)."""
    key = (f"bmm:{p.batch}x{p.m}x{p.n}x{p.k}:{p.dtype}:{int(p.allow_tf32)}:"
           f"{int(p.transpose_left)}{int(p.transpose_right)}")
    return "bmm-" + hashlib.sha1(key.encode()).hexdigest()[:12]


def strides(p: GemmProblem) -> tuple[int, ...]:
    """(A q/m/k, B q/k/n, C q/m/n) strides of the problem's layout: each matrix dense, stored
    column-major where transposed (a transposed view of a contiguous (b, k, m) / (b, n, k) tensor, as
    `key.transpose(-1, -2)`); the output contiguous."""
    a = (p.m * p.k, 1, p.m) if p.transpose_left else (p.m * p.k, p.k, 1)
    b = (p.k * p.n, 1, p.k) if p.transpose_right else (p.k * p.n, p.n, 1)
    return (*a, *b, p.m * p.n, p.n, 1)


def shape_key(p: GemmProblem) -> tuple:
    """What decides a problem's compiled kernels besides the config: everything but the batch."""
    return (p.m, p.n, p.k, p.dtype, p.allow_tf32, p.transpose_left, p.transpose_right)


def estimated_ms(p: GemmProblem, spec: DeviceSpec) -> float:
    """A roofline guess (60% of peak FLOP/s, 70% of DRAM bandwidth), only to budget the sweep."""
    return 1e3 * max(p.flops / (0.6 * spec.peak_flops(p.dtype, p.allow_tf32)),
                     p.min_bytes / (0.7 * spec.peak_bytes_per_s()))


def within(p: GemmProblem, spec: DeviceSpec, budget: BmmBudget) -> bool:
    return (p.flops <= budget.max_flops and estimated_ms(p, spec) <= budget.max_est_ms
            and p.min_bytes <= budget.max_bytes and p.batch * p.m * p.n <= budget.max_output_elems
            and p.batch * max(p.m * p.k, p.k * p.n, p.m * p.n) <= budget.max_tensor_elems)


def padded_dims(p: GemmProblem) -> tuple[int, int, int]:
    """(m, k, n) as Inductor's pad_mm pass pads a bmm (get_padded_length): up to the dtype's alignment
    (8 elements for fp16/bf16, 4 for fp32); a dim of 1 is not padded."""
    a = PAD_ALIGNMENT[p.dtype]

    def up(d: int) -> int:
        return d if d == 1 or d % a == 0 else -(-d // a) * a

    return up(p.m), up(p.k), up(p.n)


def needs_padding(p: GemmProblem) -> bool:
    return padded_dims(p) != (p.m, p.k, p.n)


# ----------------------------------------------------------------------------------------- configs

def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def inductor_scale(m: int, n: int, k: int, raw: list[tuple[int, int, int, int, int]], group_m: int = 8,
                   prune_reg_spill: bool = False) -> list[tuple[GemmConfig, tuple[int, int, int, int, int]]]:
    """Inductor's preprocess_mm_configs for a static (m, n, k) (template_heuristics/triton.py, torch
    2.11-2.13): each raw (BM, BN, BK, stages, warps) has its blocks capped at the next power of two of
    its dim (at least 16); EXHAUSTIVE drops configs whose fp32 accumulator needs more than 255 registers
    a thread (prune_reg_spill); then the warps are capped at BM*BN/256 and duplicates dropped, in order.
    Returns (config, the raw config it came from) pairs."""
    m_hint, n_hint, k_hint = (max(_next_power_of_2(d), 16) for d in (m, n, k))
    out: dict[GemmConfig, tuple[int, int, int, int, int]] = {}
    for r in raw:
        bm0, bn0, bk0, stages, warps = r
        bm, bn, bk = max(min(bm0, m_hint), 16), max(min(bn0, n_hint), 16), max(min(bk0, k_hint), 16)
        if prune_reg_spill and math.ceil(bm * bn / (warps * 32)) > 255:
            continue
        out.setdefault(GemmConfig(bm, bn, bk, group_m, stages, max(1, min(warps, bm * bn // 256))), r)
    return list(out.items())


def default_configs(p: GemmProblem) -> list[tuple[GemmConfig, str]]:
    """Inductor's DEFAULT search space for this bmm: (config, source), source "default" for a config
    that torch 2.11's list yields, "default_2.13" for one only torch 2.13's longer list does."""
    raw_213 = [(c.block_m, c.block_n, c.block_k, c.num_stages, c.num_warps) for c in inductor_default_configs()]
    in_211 = {cfg for cfg, _ in inductor_scale(p.m, p.n, p.k, [r for r in raw_213 if r in DEFAULT_211])}
    return [(cfg, "default" if cfg in in_211 else "default_2.13") for cfg, _ in inductor_scale(p.m, p.n, p.k, raw_213)]


# Inductor's EXHAUSTIVE list (BaseConfigHeuristic.exhaustive_configs) before scaling, in its order.
EXHAUSTIVE_RAW = [(bm, bn, bk, s, w) for bm, bn, bk in itertools.product(BLOCK_SIZES, repeat=3)
                  for s in NUM_STAGES for w in (2, 4, 8)]


def fma_per_thread(c: GemmConfig) -> int:
    return c.block_m * c.block_n * c.block_k // (32 * c.num_warps)


def extra_configs(p: GemmProblem, spec: DeviceSpec, n: int, taken: set[GemmConfig]) -> list[GemmConfig]:
    """n configs of Inductor's EXHAUSTIVE space as it scales it for this problem, not in `taken`, that
    fit the device (shared memory, registers), spread over tile shapes, seeded by the problem's shape
    (problems of one shape share them, and their compiles)."""
    space = [c for c, _ in inductor_scale(p.m, p.n, p.k, EXHAUSTIVE_RAW, prune_reg_spill=True)
             if c not in taken and fits(c, p.dtype, spec)]
    if p.dtype == "float32" and not p.allow_tf32:
        space = [c for c in space if fma_per_thread(c) <= IEEE_MAX_FMA_PER_THREAD]
    seed = int(hashlib.sha1(repr(shape_key(p)).encode()).hexdigest()[:8], 16)
    return stratified_sample(space, n, seed)


def sweep_configs(p: GemmProblem, spec: DeviceSpec, n_extra: int) -> list[tuple[GemmConfig, str]]:
    """Every config a problem times: Inductor's DEFAULT list (all of it, whatever the device can run:
    a config it cannot is a failure row, as in Inductor's autotuning), then n_extra "exhaustive" ones."""
    cfgs = default_configs(p)
    return cfgs + [(c, "exhaustive") for c in extra_configs(p, spec, n_extra, {c for c, _ in cfgs})]


# ---------------------------------------------------------------------------------------- problems

def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def _dim(rng: random.Random, low: int, high: int, p_odd: float, mults: tuple[int, ...] = (16, 64, 128)) -> int:
    """Log-uniform in [low, high]; aligned to one of mults unless odd (p_odd: any integer, which
    pad_mm would pad unless it happens to be aligned)."""
    d = _log_uniform(rng, low, high)
    if rng.random() < p_odd:
        return d
    mult = rng.choice([x for x in mults if x <= high] or [1])
    return min(high, max(low, max(mult, d // mult * mult)))


def _seq(rng: random.Random) -> int:
    return rng.choice(SEQ_LENGTHS) if rng.random() < 0.5 else _dim(rng, 64, 8192, p_odd=0.35)


def _heads(rng: random.Random) -> int:
    """batch x heads in [8, 512]: a batch size times a head count of real models."""
    while True:
        bh = rng.choice((1, 2, 4, 8, 16, 32)) * rng.choice((8, 12, 16, 20, 25, 32, 40, 64))
        if 8 <= bh <= 512:
            return bh


def draw_problem(rng: random.Random, family: str, dtype: str, tf32: bool) -> GemmProblem:
    """One problem of a family (FAMILIES), before the budget check."""
    if family in ("attn_score", "attn_value"):
        batch, d = _heads(rng), rng.choice(HEAD_DIMS)
        s_kv = _seq(rng)
        r = rng.random()
        # prefill (queries = keys), chunked prefill / a causal step against a cache, or decode
        s_q = s_kv if r < 0.7 else (_dim(rng, 16, max(16, s_kv), p_odd=0.3) if r < 0.85 else rng.choice((1, 2, 4, 8, 16)))
        if family == "attn_score":  # S = Q @ K^T: K^T a transposed view of K (B column-major) or a copy
            m, n, k = s_q, s_kv, d
            tl_, tr = rng.random() < 0.1, rng.random() < 0.6
        else:  # O = P @ V: V row-major; A transposed in the backward's P^T @ dO
            m, n, k = s_q, d, s_kv
            tl_, tr = rng.random() < 0.15, rng.random() < 0.25
    elif family == "experts":  # per-expert / grouped GEMMs: weights (E, K, N) or (E, N, K)
        batch = _dim(rng, 8, 64, p_odd=0.3, mults=(8, 16))
        m = _dim(rng, 16, 2048, p_odd=0.35)
        n, k = _dim(rng, 1024, 8192, p_odd=0.2, mults=(128, 256)), _dim(rng, 1024, 8192, p_odd=0.2, mults=(128, 256))
        tl_, tr = rng.random() < 0.1, rng.random() < 0.5
    elif family == "small":  # batched small matrices (batched linear algebra, per-token mixing)
        batch = _dim(rng, 64, 4096, p_odd=0.3, mults=(64, 128))
        m, n, k = (_dim(rng, 16, 128, p_odd=0.35, mults=(16, 32)) for _ in range(3))
        tl_, tr = rng.random() < 0.3, rng.random() < 0.4
    else:
        raise ValueError(f"family: expected one of {', '.join(FAMILIES)}, got {family!r}")
    return GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=tf32, transpose_left=tl_, transpose_right=tr,
                       batch=batch)


def check_modes(modes: tuple[str, ...]) -> tuple[str, ...]:
    """modes, checked: one or more of MODE_NAMES' keys; ValueError naming `modes` otherwise."""
    bad = [m for m in modes if m not in MODE_NAMES]
    if bad or not modes:
        raise ValueError(f"modes: must be some of {', '.join(MODE_NAMES)}, got {', '.join(modes) or 'none'}")
    return modes


def bmm_problems(n: int, spec: DeviceSpec, seed: int = 0, budget: BmmBudget = BmmBudget(), rebatch: float = 0.3,
                 exclude: frozenset[str] = frozenset(), modes: tuple[str, ...] | None = None
                 ) -> list[tuple[GemmProblem, str]]:
    """n (problem, family) pairs within the budget, none whose id is in exclude, in the dtype modes named
    (MODE_NAMES; None: all); deterministic for a seed (and exclude and modes), so a resumed run agrees on the
    list. With probability `rebatch` a problem repeats an earlier one's shape, layout and dtype with a batch
    of its family's range (no new compile)."""
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    wanted = None if modes is None else {MODE_NAMES[m] for m in check_modes(modes)}
    rng = random.Random(seed)
    drawn_modes = [(d, t, w) for d, t, w in MODES if wanted is None or (d, t) in wanted]
    modes_, mode_w = [(d, t) for d, t, _ in drawn_modes], [w for *_, w in drawn_modes]
    out: list[tuple[GemmProblem, str]] = []
    seen: set[GemmProblem] = set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 10000 * (n + 1):
            raise RuntimeError("bmm_problems: the budget leaves too few problems to draw from")
        if out and rng.random() < rebatch:
            base, family = rng.choice(out)
            lo, hi = {"attn_score": (8, 512), "attn_value": (8, 512), "experts": (8, 64), "small": (64, 4096)}[family]
            p = GemmProblem(**{**base.as_dict(), "batch": _dim(rng, lo, hi, p_odd=0.3, mults=(8,))})
        else:
            family = rng.choices(FAMILIES, FAMILY_WEIGHTS)[0]
            dtype, tf32 = rng.choices(modes_, mode_w)[0]
            p = draw_problem(rng, family, dtype, tf32)
        if p in seen or not within(p, spec, budget) or problem_id(p) in exclude:
            continue
        seen.add(p)
        out.append((p, family))
    return out


# ------------------------------------------------------------------------------------ cost estimate

# Compile cost of one static kernel in worker-seconds on the GPU host: ~16 kernels/s with 15 workers
# (docs/data.md). fp32 without tf32 costs more per config: Triton's compile for sm_90 on a CPU
# (bmm_kernel.compile_for_target) took 0.12-0.5 s a config in the tensor-core modes and 3.6-4.4 s for
# 8,192 FMAs a thread per K step without tf32, about 1 + fma/600 times as long.
KERNEL_WORKER_S = 15 / 16
STARTUP_S = 30.0  # CUDA init, worker processes importing torch, the first compiles' latency


def compile_units(p: GemmProblem, c: GemmConfig) -> float:
    return 1.0 + fma_per_thread(c) / 600 if (p.dtype == "float32" and not p.allow_tf32) else 1.0


def estimate(problems: list[GemmProblem], plan: dict[GemmProblem, list[tuple[GemmConfig, str]]], spec: DeviceSpec,
             workers: int, timing: TimingSettings = TimingSettings()) -> dict[str, float]:
    """Kernels to compile (one per shape and config: problems that differ only in batch share them),
    the compile and GPU-timing seconds, and the run's wall time: compiles and timing overlap, so the
    slower of the two plus the start-up."""
    kernels: dict[tuple, float] = {}
    gpu_s = 0.0
    for p in problems:
        t = estimated_ms(p, spec) / 0.6 * 1.5  # a config's time: about 1.5x the best kernel's estimate
        per_run = t + 0.15 + timing.pre_sleep_us * 1e-3  # flush and spin
        runs = 1 + max(timing.min_reps - 1, min(timing.max_reps - 1, int(timing.budget_ms / per_run)))
        for cfg, _ in plan[p]:
            kernels.setdefault((shape_key(p), cfg), compile_units(p, cfg))
            gpu_s += runs * per_run * 1e-3 + 2e-4  # + the host's per-config work
        gpu_s += 2 * 8 * (t + 1.2) * 1e-3  # aten::bmm and the padded variant (1 ms spin)
    compile_s = sum(kernels.values()) * KERNEL_WORKER_S / max(1, workers)
    return {"problems": len(problems), "configs": sum(len(plan[p]) for p in problems), "kernels": len(kernels),
            "compile_s": round(compile_s, 1), "timing_s": round(gpu_s, 1),
            "wall_s": round(STARTUP_S + max(compile_s, gpu_s), 1)}
