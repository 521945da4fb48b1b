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
from pathlib import Path
from typing import Any

import torch

from perfmodel.configs import inductor_default_configs, pruned_space, stratified_sample
from perfmodel.devices import DeviceSpec
from perfmodel.schema import SCHEMA_VERSION, GemmConfig, GemmProblem

from . import kernel
from .measure import TOLERANCE, Bench, fraction_of_peak, relative_error, validate
from .settings import GemmSweepSettings
from .problems import _cls, estimated_ms, gemm_problems, problem_id, spec_key, strides
from .runtime import cublas_tf32, device_header, make_operands, resolve_spec, torch_dtype

KIND = "gemm"


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


def kernel_key(p: GemmProblem, cfg: GemmConfig) -> tuple:
    """The compiled kernel of one config on one problem: groups with other hint classes share it where the
    config's constexprs agree (e.g. every BLOCK_M <= M)."""
    h = kernel._hints(p.m, p.n, p.k, strides(p), cfg)
    return (p.dtype, p.allow_tf32, p.transpose_left, p.transpose_right, _cls(p.m), _cls(p.n), _cls(p.k),
            cfg, h["EVEN_K"], h["A_HINT"], h["B_HINT"])


def mode_name(p: GemmProblem) -> str:
    return "tf32" if p.allow_tf32 else p.dtype


def is_aligned(key: tuple) -> bool:
    return not any(c.startswith("N") for c in key[5:7])  # N and K (so the strides) multiples of 16


def large_subset(cfgs: list[GemmConfig], n: int) -> list[GemmConfig]:
    """The configs a large problem times: its group's configs with BLOCK_M, BLOCK_N >= 64, Inductor's
    defaults first, then every other config in a fixed spread, up to n."""
    big = [c for c in cfgs if c.block_m >= 64 and c.block_n >= 64]
    defaults = set(inductor_default_configs())
    first = [c for c in big if c in defaults]
    rest = [c for c in big if c not in defaults]
    step = max(1, len(rest) / max(1, n - len(first)))
    return (first + [rest[int(i * step)] for i in range(min(len(rest), max(0, n - len(first))))])[:n]


def _compile_chunk(dtype: str, allow_tf32: bool, M: int, N: int, K: int, strides_: tuple[int, ...],
                   cfgs: list[dict[str, int]], static: bool = False) -> list[tuple[dict[str, int], str]]:
    """Worker: compile each config for one problem's specialisation (static: for its own shape,
    kernel._args); returns (config, "" or error)."""
    out = []
    for c in cfgs:
        cfg = GemmConfig(**c)
        try:
            kernel.warmup(torch_dtype(dtype), M, N, K, strides_, cfg, allow_tf32, static)
            out.append((c, ""))
        except Exception as exc:  # a compile failure is data: recorded as a failure row
            out.append((c, f"compile:{type(exc).__name__}:{str(exc)[:200]}"))
    return out


def compile_plan(order: list[tuple], groups: dict[tuple, list[GemmProblem]], spec: DeviceSpec,
                 settings: GemmSweepSettings) -> dict[tuple, list[GemmConfig]]:
    """The configs each group times (a group of large problems only: large_subset)."""
    plan: dict[tuple, list[GemmConfig]] = {}
    for key in order:
        p0 = groups[key][0]
        plan[key] = config_sample(p0.dtype, p0.allow_tf32, (p0.transpose_left, p0.transpose_right), spec,
                                  settings.configs_per_group if is_aligned(key) else settings.configs_unaligned)
        if all(estimated_ms(p, spec) > settings.large_ms for p in groups[key]):
            plan[key] = large_subset(plan[key], settings.configs_large)
    return plan


def run(out_dir: Path, spec_name: str | None = None, settings: GemmSweepSettings = GemmSweepSettings(),
        shard: tuple[int, int] = (0, 1), progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    from perfmodel.devices import ClockReader, get_spec

    from .shards import ShardWriter

    device = torch.device("cuda", torch.cuda.current_device())
    spec, live = resolve_spec(spec_name)
    draw = get_spec(settings.problem_spec) if settings.problem_spec else spec  # problems and config samples
    problems = gemm_problems(settings.n_random, draw, settings.seed, settings.budget)
    if settings.only_units is not None:
        missing = settings.only_units - {problem_id(p) for p in problems}
        if missing:
            raise ValueError(f"only_units: {len(missing)} of the {len(settings.only_units)} problems are not in this "
                             f"sweep's problem list (was it made with another --n-random or --seed?)")
    i, n = shard
    problems = [p for j, p in enumerate(problems) if j % n == i]
    writer = ShardWriter(out_dir, KIND, _header(live, spec, draw, settings), shard=f"{i:02d}of{n:02d}")
    todo, groups, order = _plan_groups(problems, writer, settings)
    stats = {"problems": 0, "rows": 0, "ok_rows": 0, "failed_rows": 0, "rejected_rows": 0,
             "kernels_compiled": 0, "compile_s": 0.0, "timing_s": 0.0, "timed_configs": 0,
             "resumed_existing_rows": writer.n_existing_rows, "host_stalls": 0,
             # Seconds the timing loop waited for compiles (about 0 where timing sets the pace)
             "compile_wait_s": 0.0,
             # Configs kept at their first run, far slower than their problem's fastest (TimingSettings.slow_factor)
             "slow_single_run": 0}
    if not todo:
        writer.close()
        return stats
    bench = Bench(device, live.get("l2_bytes") or spec.l2_bytes, settings.timing)
    clock = ClockReader(torch.cuda.current_device())
    # Niced, so that the timing process keeps a core and its launches are not delayed by compiles.
    pool = cf.ProcessPoolExecutor(settings.compile_workers, mp_context=mp.get_context("spawn"),
                                  initializer=os.nice, initargs=(10,))
    t_compile0 = time.perf_counter()
    # One compile per kernel key (kernel_key): a group submits only the kernels no earlier group did.
    plan = compile_plan(order, groups, draw, settings)
    futures, done_at = _submit_compiles(pool, order, groups, plan)
    stats["kernels_to_compile"] = len(futures)
    results: dict[cf.Future, dict[GemmConfig, str]] = {}
    bar = tqdm(total=len(todo), desc=f"gemm sweep {i}/{n}", unit="problem", disable=not progress, smoothing=0.05)
    timing = _Timing(settings, draw, spec, bench, clock, writer, bar, stats, t_compile0)
    try:
        for key in order:
            if stats.get("stopped_at_time_limit"):
                break
            compile_errors = _compiled(groups[key][0], plan[key], futures, results, stats)
            stats["compile_s"] = time.perf_counter() - t_compile0  # until the last group needed is ready
            timing.group(groups[key], compile_errors, set(large_subset(plan[key], settings.configs_large)))
    finally:
        bar.close()
        writer.close()
        pool.shutdown(cancel_futures=True)
    return _throughput(stats, results, done_at, t_compile0)


def _header(live: dict[str, Any], spec: DeviceSpec, draw: DeviceSpec, settings: GemmSweepSettings) -> dict[str, Any]:
    """The shard header: the device, the schema and kernel versions and the sweep's settings."""
    return device_header(live, spec) | {"schema_version": SCHEMA_VERSION, "kernel_hash": kernel.kernel_source_hash(),
                                        "kernel_mode": kernel.kernel_mode(),
                                        "sweep": {"seed": settings.seed, "n_random": settings.n_random,
                                                  "configs_large": settings.configs_large, "large_ms": settings.large_ms,
                                                  "configs_per_group": settings.configs_per_group,
                                                  "timing": vars(settings.timing),
                                                  "only_units": units_digest(settings.only_units),
                                                  "problem_spec": draw.name}}


def _plan_groups(problems: list[GemmProblem], writer: Any, settings: GemmSweepSettings
                 ) -> tuple[list[GemmProblem], dict[tuple, list[GemmProblem]], list[tuple]]:
    """(the problems left to time, them by compile group, the groups' timing order)."""
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
    return todo, groups, order


def _submit_compiles(pool: cf.ProcessPoolExecutor, order: list[tuple], groups: dict[tuple, list[GemmProblem]],
                     plan: dict[tuple, list[GemmConfig]]) -> tuple[dict[tuple, cf.Future], dict[cf.Future, float]]:
    """Every kernel the plan needs submitted to the pool, in timing order, four configs a task: ({kernel key: its
    task}, {task: when it finished}, filled by its done callback)."""
    futures: dict[tuple, cf.Future] = {}
    done_at: dict[cf.Future, float] = {}  # when each compile task finished (its done callback)
    for key in order:
        p0 = groups[key][0]
        new = [c for c in plan[key] if kernel_key(p0, c) not in futures]
        for j in range(0, len(new), 4):
            fut = pool.submit(_compile_chunk, p0.dtype, p0.allow_tf32, p0.m, p0.n, p0.k, strides(p0),
                              [c.as_dict() for c in new[j:j + 4]])
            fut.add_done_callback(lambda f: done_at.__setitem__(f, time.perf_counter()))
            for c in new[j:j + 4]:
                futures[kernel_key(p0, c)] = fut
    return futures, done_at


def _compiled(p0: GemmProblem, cfgs: list[GemmConfig], futures: dict[tuple, cf.Future],
              results: dict[cf.Future, dict[GemmConfig, str]], stats: dict[str, Any]) -> dict[GemmConfig, str]:
    """{config: its compile error ('' none)} of a group's configs, waiting for their compile tasks."""
    compile_errors: dict[GemmConfig, str] = {}
    for cfg in cfgs:
        fut = futures[kernel_key(p0, cfg)]
        if fut not in results:
            t_wait = time.perf_counter()
            results[fut] = {GemmConfig(**c): err for c, err in fut.result()}
            stats["compile_wait_s"] += time.perf_counter() - t_wait
            stats["kernels_compiled"] += len(results[fut])
        compile_errors[cfg] = results[fut][cfg]
    return compile_errors


class _Timing:
    """The timing loop's state: times a compiled group's problems, writes their units, counts into stats."""

    def __init__(self, settings: GemmSweepSettings, draw: DeviceSpec, spec: DeviceSpec, bench: Bench, clock: Any,
                 writer: Any, bar: Any, stats: dict[str, Any], t_compile0: float) -> None:
        self.settings, self.draw, self.spec, self.bench, self.clock = settings, draw, spec, bench, clock
        self.writer, self.bar, self.stats, self.t_compile0 = writer, bar, stats, t_compile0

    def group(self, problems: list[GemmProblem], compile_errors: dict[GemmConfig, str], keep_large: set) -> None:
        stats, settings = self.stats, self.settings
        for p in problems:
            if settings.time_limit_s is not None and time.perf_counter() - self.t_compile0 > settings.time_limit_s:
                stats["stopped_at_time_limit"] = True
                break
            cfgs = list(compile_errors.items())
            if estimated_ms(p, self.draw) > settings.large_ms:
                cfgs = [(c, e) for c, e in cfgs if c in keep_large]
            t0 = time.perf_counter()
            rows = measure_problem(p, cfgs, self.bench, self.spec, self.clock)
            stats["timing_s"] += time.perf_counter() - t0
            self.writer.write_unit(problem_id(p), rows)
            stats["problems"] += 1
            stats["rows"] += len(rows)
            stats["host_stalls"] += sum(r.get("host_stalls", 0) for r in rows)
            stats["slow_single_run"] += sum(self.bench.last_single_run)
            for r in rows:
                if r["kind"] != "triton":
                    continue
                stats["timed_configs"] += r["status"] in ("ok", "rejected_peak")
                stats["ok_rows"] += r["status"] == "ok"
                stats["failed_rows"] += r["status"].startswith("fail")
                stats["rejected_rows"] += r["status"] == "rejected_peak"
            self.bar.update(1)
            self.bar.set_postfix(rows_s=f"{stats['timed_configs'] / max(stats['timing_s'], 1e-9):.0f}",
                                 rows=stats["rows"], single=stats["slow_single_run"])


def _throughput(stats: dict[str, Any], results: dict[cf.Future, Any], done_at: dict[cf.Future, float],
                t_compile0: float) -> dict[str, Any]:
    """stats with the run's throughputs added."""
    stats["timed_configs_per_s"] = stats["timed_configs"] / max(stats["timing_s"], 1e-9)
    stats["wall_s"] = time.perf_counter() - t_compile0
    # Throughput over the whole run, compiles included (timed_configs_per_s counts timing time only).
    stats["timed_configs_per_wall_s"] = stats["timed_configs"] / max(stats["wall_s"], 1e-9)
    stats["kernels_per_wall_s"] = stats["kernels_compiled"] / max(stats["wall_s"], 1e-9)
    # The compiles' own throughput. compile_s ends when the timing loop reached the last group, later than
    # its compiles finished where timing sets the pace; compile_done_s ends when the last compile task
    # the run used finished.
    finished = [done_at[f] for f in results if f in done_at]
    stats["compile_done_s"] = max(finished) - t_compile0 if finished else 0.0
    stats["kernels_per_compile_s"] = stats["kernels_compiled"] / max(stats["compile_done_s"], 1e-9)
    return stats


def units_digest(units: frozenset[str] | None) -> str | None:
    """A short digest of a problem-id set (the sweep header records which problems it was limited to)."""
    if units is None:
        return None
    import hashlib

    return f"{len(units)}:" + hashlib.sha1(",".join(sorted(units)).encode()).hexdigest()[:12]


def measure_problem(p: GemmProblem, cfgs: list[tuple[GemmConfig, str]], bench: Bench, spec: DeviceSpec,
                    clock, static: bool = False) -> list[dict[str, Any]]:
    """Rows for one problem: one cuBLAS row and one row per config (ok, failed or rejected).

    Each config's correctness launch (into a NaN-poisoned output, checked against the reference) is its
    first timed run; configs far slower than the problem's fastest keep that run alone
    (TimingSettings.slow_factor, `bench.last_single_run`). cuBLAS is warmed up and checked by a call of
    its own, and always gets its repetitions. static: the kernel compiled for the problem's own shape
    (kernel._args; benchmarks/static_retime.py), not the dataset's specialisation."""
    a, b = make_operands(p, bench.device)
    ref = reference(p, a, b)
    ref_norm = torch.linalg.vector_norm(ref)
    c = torch.empty((p.m, p.n), device=bench.device, dtype=a.dtype)
    base = p.as_dict()

    with cublas_tf32(p.allow_tf32):
        cublas = lambda: torch.mm(a, b)  # noqa: E731
        err_cublas = relative_error(cublas(), ref, ref_norm)  # also cuBLAS's warm-up
        runnable, rows, errs, fns, first_runs = [], [], [], [], []
        for cfg, cerr in cfgs:
            row = {**base, "kind": "triton", **cfg.as_dict()}
            if cerr:
                rows.append({**row, "status": "fail:" + cerr[:120], "ms": None})
                continue
            fn = lambda cfg=cfg: kernel.launch(a, b, c, cfg, p.allow_tf32, static)  # noqa: E731
            try:
                # Load the module first: a config out of resources fails here, before any event is
                # recorded, and the cold load stays out of the timed first run.
                kernel.prepare(a, b, c, cfg, p.allow_tf32, static)
                c.fill_(float("nan"))  # poison: every element must be written
                # The correctness launch is the config's first timed run (time_many's first pass).
                first = bench.timed_run(fn)
            except Exception as exc:  # out of resources: a failure row
                rows.append({**row, "status": f"fail:launch:{type(exc).__name__}", "ms": None})
                continue
            errs.append(relative_error(c, ref, ref_norm))
            runnable.append((cfg, row))
            fns.append(fn)
            first_runs.append(first)
        clocks: list[float | None] = []
        timed = bench.time_many([cublas, *fns], on_busy=lambda: clocks.append(clock.sm_clock_mhz()),
                                first_runs=[None, *first_runs], peers=[False] + [True] * len(fns))
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
