"""The GEMM config sweep: every problem x a stratified sample of the pruned config space, plus cuBLAS.

Kernels are compiled by worker processes (kernel.warmup into Triton's on-disk cache) group by group
-- a group is one (dtype, tf32, layout, specialisation key) -- while the main process times the
problems of groups already compiled. One problem is one crash-safe unit of the shard.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import multiprocessing as mp
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from perfmodel.configs import inductor_default_configs, pruned_space, stratified_sample
from perfmodel.devices import DeviceSpec
from perfmodel.schema import SCHEMA_VERSION, GemmConfig, GemmProblem

from . import kernel
from .measure import TOLERANCE, Bench, TimingSettings, fraction_of_peak, relative_error, validate
from .problems import Budget, gemm_problems, problem_id
from .runtime import cublas_tf32, device_header, make_operands, resolve_spec, torch_dtype

KIND = "gemm"


@dataclass
class GemmSweepSettings:
    n_random: int = 600           # random problems on top of the real-model shapes
    configs_per_group: int = 128  # stratified sample of the pruned space per aligned compile group
    configs_unaligned: int = 40   # ... per group with K or a stride not divisible by 16 (fewer problems)
    modes: tuple[str, ...] | None = None  # restrict to these dtype modes (float16, bfloat16, tf32, float32)
    max_per_group: int | None = None   # cap problems per compile group (spreads a short run over groups)
    time_limit_s: float | None = None  # stop cleanly (between problems) after this long
    seed: int = 0
    compile_workers: int = max(1, (os.cpu_count() or 2) - 1)
    max_problems: int | None = None
    # Only these problems (unit ids), e.g. those of an earlier dataset, to re-time it (--problems-from).
    only_units: frozenset[str] | None = None
    budget: Budget = field(default_factory=Budget)
    timing: TimingSettings = field(default_factory=TimingSettings)


# fp32 without tf32 lowers tl.dot to FMAs, fully unrolled per K step: compile time grows with the
# multiply-adds per thread per K step (the v1 sweep saw ~30 s per kernel). Sampled configs above this are
# skipped for that mode (Inductor's defaults are always kept); the model still ranks them.
IEEE_MAX_FMA_PER_THREAD = 4096


def fma_per_thread(c: GemmConfig) -> int:
    return c.block_m * c.block_n * c.block_k // (32 * c.num_warps)


def config_sample(dtype: str, allow_tf32: bool, layout: tuple[bool, bool], spec: DeviceSpec, n: int) -> list[GemmConfig]:
    """Inductor's default configs that fit the device, then a fixed stratified sample of the rest of the
    pruned space up to n configs, per (dtype mode, layout): different layouts see different configs."""
    seed = zlib.crc32(f"{dtype}:{allow_tf32}:{layout}".encode())
    space = pruned_space(dtype, spec)
    fitting = set(space)
    defaults = [c for c in inductor_default_configs() if c in fitting][:n]
    chosen = set(defaults)
    rest = [c for c in space if c not in chosen]
    if dtype == "float32" and not allow_tf32:
        rest = [c for c in rest if fma_per_thread(c) <= IEEE_MAX_FMA_PER_THREAD]
    return defaults + stratified_sample(rest, max(0, n - len(defaults)), seed)


def strides(p: GemmProblem) -> tuple[int, ...]:
    """(stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn) of the problem's layout."""
    sa = (1, p.m) if p.transpose_left else (p.k, 1)
    sb = (1, p.k) if p.transpose_right else (p.n, 1)
    return (*sa, *sb, p.n, 1)


def spec_key(p: GemmProblem) -> tuple:
    """What Triton specialises on besides the config: K and the strides (1 / divisible by 16 / other)."""
    def cls(v: int) -> str:
        return "1" if v == 1 else ("D" if v % 16 == 0 else "N")

    return (p.dtype, p.allow_tf32, p.transpose_left, p.transpose_right, cls(p.k), *map(cls, strides(p)))


def mode_name(p: GemmProblem) -> str:
    return "tf32" if p.allow_tf32 else p.dtype


def is_aligned(key: tuple) -> bool:
    return "N" not in key[4:]


def _compile_chunk(dtype: str, allow_tf32: bool, strides_: tuple[int, ...], K: int,
                   cfgs: list[dict[str, int]]) -> list[tuple[dict[str, int], str]]:
    """Worker: compile each config for one specialisation; returns (config, "" or error)."""
    out = []
    for c in cfgs:
        cfg = GemmConfig(**c)
        try:
            kernel.warmup(torch_dtype(dtype), strides_, K, cfg, allow_tf32)
            out.append((c, ""))
        except Exception as exc:  # a compile failure is data: recorded as a failure row
            out.append((c, f"compile:{type(exc).__name__}:{str(exc)[:200]}"))
    return out


def run(out_dir: Path, spec_name: str | None = None, settings: GemmSweepSettings = GemmSweepSettings(),
        shard: tuple[int, int] = (0, 1), progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    device = torch.device("cuda", torch.cuda.current_device())
    spec, live = resolve_spec(spec_name)
    header = device_header(live, spec) | {"schema_version": SCHEMA_VERSION, "kernel_hash": kernel.kernel_source_hash(),
                                          "sweep": {"seed": settings.seed, "n_random": settings.n_random,
                                                    "configs_per_group": settings.configs_per_group,
                                                    "timing": vars(settings.timing),
                                                    "only_units": units_digest(settings.only_units)}}
    problems = gemm_problems(settings.n_random, spec, settings.seed, settings.budget)
    if settings.only_units is not None:
        missing = settings.only_units - {problem_id(p) for p in problems}
        if missing:
            raise ValueError(f"only_units: {len(missing)} of the {len(settings.only_units)} problems are not in this "
                             f"sweep's problem list (was it made with another --n-random or --seed?)")
    i, n = shard
    problems = [p for j, p in enumerate(problems) if j % n == i]
    from .shards import ShardWriter

    writer = ShardWriter(out_dir, KIND, header, shard=f"{i:02d}of{n:02d}")
    todo = [p for p in problems if problem_id(p) not in writer.done
            and (settings.modes is None or mode_name(p) in settings.modes)]
    if settings.only_units is not None:
        todo = [p for p in todo if problem_id(p) in settings.only_units]
    if settings.max_problems is not None:
        todo = todo[: settings.max_problems]
    groups: dict[tuple, list[GemmProblem]] = {}
    for p in sorted(todo, key=problem_id):  # a fixed pseudo-random mix of real-model and random shapes
        groups.setdefault(spec_key(p), []).append(p)
    if settings.max_per_group is not None:
        groups = {k: v[: settings.max_per_group] for k, v in groups.items()}
        todo = [p for v in groups.values() for p in v]
    # Largest groups first (their compile is amortised over the most problems), interleaved with the
    # unaligned groups so that a time-limited run covers both.
    aligned = sorted((k for k in groups if is_aligned(k)), key=lambda k: -len(groups[k]))
    unaligned = sorted((k for k in groups if not is_aligned(k)), key=lambda k: -len(groups[k]))
    rest = iter(unaligned)
    order = [k for chunk in itertools.zip_longest(aligned, rest, rest, rest) for k in chunk if k]
    assert len(order) == len(set(order)) == len(groups)

    stats = {"problems": 0, "rows": 0, "ok_rows": 0, "failed_rows": 0, "rejected_rows": 0,
             "kernels_compiled": 0, "compile_s": 0.0, "timing_s": 0.0, "timed_configs": 0,
             "resumed_existing_rows": writer.n_existing_rows, "host_stalls": 0}
    if not todo:
        writer.close()
        return stats
    bench = Bench(device, live.get("l2_bytes") or spec.l2_bytes, settings.timing)
    from perfmodel.devices import ClockReader

    clock = ClockReader(torch.cuda.current_device())
    # Niced, so that the timing process keeps a core and its launches are not delayed by compiles.
    pool = cf.ProcessPoolExecutor(settings.compile_workers, mp_context=mp.get_context("spawn"),
                                  initializer=os.nice, initargs=(10,))
    t_compile0 = time.perf_counter()
    futures: dict[tuple, list[cf.Future]] = {}
    for key in order:
        p0 = groups[key][0]
        cfgs = config_sample(p0.dtype, p0.allow_tf32, (p0.transpose_left, p0.transpose_right), spec,
                             settings.configs_per_group if is_aligned(key) else settings.configs_unaligned)
        chunks = [cfgs[j:j + 4] for j in range(0, len(cfgs), 4)]
        futures[key] = [pool.submit(_compile_chunk, p0.dtype, p0.allow_tf32, strides(p0), p0.k,
                                    [c.as_dict() for c in ch]) for ch in chunks]
    bar = tqdm(total=len(todo), desc=f"gemm sweep {i}/{n}", unit="problem", disable=not progress, smoothing=0.05)
    try:
        for key in order:
            if stats.get("stopped_at_time_limit"):
                break
            compile_errors: dict[GemmConfig, str] = {}
            for fut in futures[key]:
                for c, err in fut.result():
                    compile_errors[GemmConfig(**c)] = err
            stats["kernels_compiled"] += len(compile_errors)
            stats["compile_s"] = time.perf_counter() - t_compile0  # until the last group needed is ready
            for p in groups[key]:
                if settings.time_limit_s is not None and time.perf_counter() - t_compile0 > settings.time_limit_s:
                    stats["stopped_at_time_limit"] = True
                    break
                t0 = time.perf_counter()
                rows = measure_problem(p, list(compile_errors.items()), bench, spec, clock)
                stats["timing_s"] += time.perf_counter() - t0
                writer.write_unit(problem_id(p), rows)
                stats["problems"] += 1
                stats["rows"] += len(rows)
                stats["host_stalls"] += sum(r.get("host_stalls", 0) for r in rows)
                for r in rows:
                    if r["kind"] != "triton":
                        continue
                    stats["timed_configs"] += r["status"] in ("ok", "rejected_peak")
                    stats["ok_rows"] += r["status"] == "ok"
                    stats["failed_rows"] += r["status"].startswith("fail")
                    stats["rejected_rows"] += r["status"] == "rejected_peak"
                bar.update(1)
                bar.set_postfix(rows_s=f"{stats['timed_configs'] / max(stats['timing_s'], 1e-9):.0f}",
                                rows=stats["rows"])
    finally:
        bar.close()
        writer.close()
        pool.shutdown(cancel_futures=True)
    stats["timed_configs_per_s"] = stats["timed_configs"] / max(stats["timing_s"], 1e-9)
    stats["wall_s"] = time.perf_counter() - t_compile0
    return stats


def units_digest(units: frozenset[str] | None) -> str | None:
    """A short digest of a problem-id set (the sweep header records which problems it was limited to)."""
    if units is None:
        return None
    import hashlib

    return f"{len(units)}:" + hashlib.sha1(",".join(sorted(units)).encode()).hexdigest()[:12]


def measure_problem(p: GemmProblem, cfgs: list[tuple[GemmConfig, str]], bench: Bench, spec: DeviceSpec,
                    clock) -> list[dict[str, Any]]:
    """Rows for one problem: one cuBLAS row and one row per config (ok, failed or rejected)."""
    a, b = make_operands(p, bench.device)
    ref = reference(p, a, b)
    ref_norm = torch.linalg.vector_norm(ref)
    c = torch.empty((p.m, p.n), device=bench.device, dtype=a.dtype)
    base = p.as_dict()

    with cublas_tf32(p.allow_tf32):
        cublas = lambda: torch.mm(a, b)  # noqa: E731
        err_cublas = relative_error(cublas(), ref, ref_norm)
        runnable, rows, errs = [], [], []
        for cfg, cerr in cfgs:
            row = {**base, "kind": "triton", **cfg.as_dict()}
            if cerr:
                rows.append({**row, "status": "fail:" + cerr[:120], "ms": None})
                continue
            c.fill_(float("nan"))  # poison: every element must be written
            try:
                kernel.launch(a, b, c, cfg, p.allow_tf32)
            except Exception as exc:  # out of resources at launch: a failure row
                rows.append({**row, "status": f"fail:launch:{type(exc).__name__}", "ms": None})
                continue
            errs.append(relative_error(c, ref, ref_norm))
            runnable.append((cfg, row))
        fns = [(lambda cfg=cfg: kernel.launch(a, b, c, cfg, p.allow_tf32)) for cfg, _ in runnable]
        clocks: list[float | None] = []
        timed = bench.time_many([cublas, *fns], on_busy=lambda: clocks.append(clock.sm_clock_mhz()))
    sm_clock = clocks[0] if clocks else None
    stalls = bench.last_stalls
    err_values = torch.stack([err_cublas, *errs]).tolist() if errs else [err_cublas.item()]

    out = [timed_row(p, {**base, "kind": "cublas"}, *timed[0], err_values[0], spec, sm_clock, stalls[0])]
    for (cfg, row), (ms, reps), err, st in zip(runnable, timed[1:], err_values[1:], stalls[1:]):
        out.append(timed_row(p, row, ms, reps, err, spec, sm_clock, st))
    return out + rows


def reference(p: GemmProblem, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The correctness reference of a problem: fp64 mm, or an fp32 one (tf32 off) for the largest."""
    if p.m * p.n * p.k <= 2**30:
        return torch.mm(a.double(), b.double()).float()
    with cublas_tf32(False):
        return torch.mm(a.float(), b.float())


def timed_row(p: GemmProblem, row: dict[str, Any], ms: float, reps: int, err: float, spec: DeviceSpec,
              sm_clock: float | None, host_stalls: int = 0) -> dict[str, Any]:
    """row completed with a timing: physical-limit status and flag at the measured clock, and a
    wrong result (error above the mode's tolerance) as a failure. host_stalls: runs the GPU reached
    before the host had enqueued them, left out of the median (Bench.last_stalls, data_gen/measure.py)."""
    frac = fraction_of_peak(p.flops, p.min_bytes, ms, p.dtype, p.allow_tf32, spec, sm_clock)
    status, flag = validate(frac)
    if not err <= TOLERANCE[(p.dtype, p.allow_tf32)]:
        status = "fail:wrong_result"
    return {**row, "status": status, "flag": flag, "ms": round(ms, 6), "reps": reps,
            "rel_err": float(f"{err:.3g}"), "frac_peak": round(frac, 5), "sm_clock_mhz": sm_clock,
            "host_stalls": host_stalls}
