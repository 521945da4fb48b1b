"""The bmm sweep (`perfmodel gen bmm`): Inductor's bmm template, aten::bmm and the padded aten::bmm.

Per problem (data_gen/bmm.py's draw): every config of Inductor's DEFAULT bmm list and a few of its
EXHAUSTIVE space, each compiled for the problem's own shape (bmm_kernel: every size and stride a
constant, as Inductor compiles it), timed with the GEMM sweep's protocol (data_gen/measure.py: the
correctness check on the first timed run, L2 flush, GPU spin, stall check, slow configs kept at one
run, the physical-limit check at the measured clock); torch.bmm with the problem's tf32 setting; and,
where Inductor's pad_mm pass would pad the bmm, pad + torch.bmm + slice (pad_bmm). Worker processes
compile the problems' kernels in order while the main process times the problems already compiled;
problems that differ only in batch share their kernels. One problem is one crash-safe unit of a `bmm`
shard; an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from perfmodel.devices import DeviceSpec
from perfmodel.schema import SCHEMA_VERSION, GemmConfig, GemmProblem

from . import bmm_kernel
from .bmm import KIND, BmmSweepSettings, bmm_problems, estimate, needs_padding, padded_dims, problem_id, \
    shape_key, strides, sweep_configs
from .measure import Bench, TimingSettings, relative_error
from .runtime import cublas_tf32, device_header, resolve_spec, torch_dtype

CHUNK = 2  # configs per compile task: one problem's configs spread over the workers


def make_operands(p: GemmProblem, device: torch.device, gen: torch.Generator | None = None):
    """Random A (b, m, k) and B (b, k, n) in the problem's layout (a transposed matrix: a transposed
    view of a contiguous (b, k, m) / (b, n, k) tensor)."""
    dt = torch_dtype(p.dtype)
    a = (torch.randn(p.batch, p.k, p.m, device=device, dtype=dt, generator=gen).transpose(1, 2) if p.transpose_left
         else torch.randn(p.batch, p.m, p.k, device=device, dtype=dt, generator=gen))
    b = (torch.randn(p.batch, p.n, p.k, device=device, dtype=dt, generator=gen).transpose(1, 2) if p.transpose_right
         else torch.randn(p.batch, p.k, p.n, device=device, dtype=dt, generator=gen))
    return a, b


def reference(p: GemmProblem, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The correctness reference: an fp64 bmm, or an fp32 one (tf32 off) for the largest."""
    if p.batch * p.m * p.n * p.k <= 2**32:
        return torch.bmm(a.double(), b.double()).float()
    with cublas_tf32(False):
        return torch.bmm(a.float(), b.float())


def pad_bmm(a: torch.Tensor, b: torch.Tensor, padded: tuple[int, int, int]) -> torch.Tensor:
    """Inductor's pad_bmm (fx_passes/pad_mm.py): zero-pad A (b, m, k) to (b, m', k') and B (b, k, n) to
    (b, k', n') (constant_pad_nd), torch.bmm, slice the output back to (b, m, n). padded: (m', k', n')."""
    (_, m, k), n = a.shape, b.shape[2]
    mp_, kp, np_ = padded
    pa = F.pad(a, (0, kp - k, 0, mp_ - m)) if (mp_, kp) != (m, k) else a
    pb = F.pad(b, (0, np_ - n, 0, kp - k)) if (kp, np_) != (k, n) else b
    return torch.bmm(pa, pb)[:, :m, :n]


def _compile_chunk(dtype: str, allow_tf32: bool, M: int, N: int, K: int, strides_: tuple[int, ...],
                   cfgs: list[dict[str, int]]) -> list[tuple[dict[str, int], str]]:
    """Worker: compile each config for one shape into Triton's cache; (config, "" or the error)."""
    out = []
    for c in cfgs:
        try:
            bmm_kernel.warmup(torch_dtype(dtype), M, N, K, strides_, GemmConfig(**c), allow_tf32)
            out.append((c, ""))
        except Exception as exc:  # a compile failure is data: a failure row
            out.append((c, f"compile:{type(exc).__name__}:{str(exc)[:200]}"))
    return out


class Compiles:
    """The kernels of the problems, compiled by worker processes in submission order, one per (shape,
    config). A worker that dies (a crash inside the compiler) fails the configs of the task it ran,
    and the other pending tasks go to a fresh pool."""

    def __init__(self, workers: int, max_restarts: int = 5, compile_chunk=None) -> None:
        self.workers, self.max_restarts, self.restarts = workers, max_restarts, 0
        self.compile_chunk = compile_chunk or _compile_chunk  # a module-level function (workers import it)
        self.tasks: dict[tuple, tuple] = {}            # kernel key -> its shape's task arguments
        self.futures: dict[tuple, cf.Future] = {}      # kernel key -> the future of its task
        self.errors: dict[tuple, str] = {}             # kernel key -> "" or the error, once known
        self._start()

    def _start(self) -> None:
        # Niced, so that the timing process keeps a core and its launches are not delayed by compiles.
        self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                           initializer=os.nice, initargs=(10,))

    def _submit(self, args: tuple, keys: list[tuple]) -> None:
        fut = self.pool.submit(self.compile_chunk, *args)
        for key in keys:
            self.futures[key] = fut

    def submit(self, p: GemmProblem, cfgs: list[GemmConfig]) -> int:
        """Queue the problem's configs not yet queued for its shape; how many new kernels."""
        new = [c for c in cfgs if (shape_key(p), c) not in self.tasks]
        for j in range(0, len(new), CHUNK):
            chunk = new[j:j + CHUNK]
            args = (p.dtype, p.allow_tf32, p.m, p.n, p.k, strides(p), [c.as_dict() for c in chunk])
            keys = [(shape_key(p), c) for c in chunk]
            for key in keys:
                self.tasks[key] = args[:6]
            self._submit(args, keys)
        return len(new)

    def error(self, p: GemmProblem, cfg: GemmConfig, timeout: float | None) -> str:
        """"" or the compile error of one of the problem's configs, waiting up to timeout seconds
        (cf.TimeoutError past it)."""
        key = (shape_key(p), cfg)
        while key not in self.errors:
            fut = self.futures[key]
            try:
                results = fut.result(timeout=timeout)
            except BrokenProcessPool:
                self._restart(fut)
                continue
            for c, err in results:
                self.errors[(shape_key(p), GemmConfig(**c))] = err
        return self.errors[key]

    def _restart(self, broken: cf.Future) -> None:
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise RuntimeError(f"compile workers died {self.restarts} times; stopping the sweep")
        for key, fut in self.futures.items():  # the task that was awaited is the suspect: its configs fail
            if fut is broken:
                self.errors[key] = "compile:BrokenProcessPool:a compile worker died"
        # every other task without a result goes to the new pool, the configs of a task together
        pending: dict[tuple, list[tuple]] = {}
        for key, fut in self.futures.items():
            if key not in self.errors and (fut.cancelled() or not fut.done() or fut.exception() is not None):
                pending.setdefault(self.tasks[key], []).append(key)
        self.shutdown()
        self._start()
        for args, keys in pending.items():
            for j in range(0, len(keys), CHUNK):
                self._submit((*args, [c.as_dict() for _, c in keys[j:j + CHUNK]]), keys[j:j + CHUNK])

    def shutdown(self) -> None:
        """Stop the workers now (a compile task can take seconds: they are terminated, not awaited)."""
        workers = list(getattr(self.pool, "_processes", {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for w in workers:
            w.terminate()


def measure_problem(p: GemmProblem, family: str, cfgs: list[tuple[GemmConfig, str, str]], bench: Bench,
                    bench_aten: Bench, spec: DeviceSpec, clock) -> list[dict[str, Any]]:
    """Rows for one problem: one per config (ok, failed or rejected), the aten::bmm row and, where
    pad_mm would pad, the padded aten::bmm row. cfgs: (config, source list, compile error or "").

    Each config's correctness launch (into a NaN-poisoned output, checked against the reference) is its
    first timed run, as in gemm_sweep.measure_problem; aten::bmm and the padded variant get an untimed
    correctness call each and a spin of their own (bench_aten)."""
    from .gemm_sweep import timed_row

    a, b = make_operands(p, bench.device)
    ref = reference(p, a, b)
    ref_norm = torch.linalg.vector_norm(ref)
    c = torch.empty((p.batch, p.m, p.n), device=bench.device, dtype=a.dtype)
    base = {**p.as_dict(), "batch": p.batch, "family": family}
    rows: list[dict[str, Any]] = []
    runnable, errs, fns, first_runs = [], [], [], []
    for cfg, source, cerr in cfgs:
        row = {**base, "kind": "triton", **cfg.as_dict(), "source": source, "even_k": p.k % cfg.block_k == 0}
        if cerr:
            rows.append({**row, "status": "fail:" + cerr[:120], "ms": None})
            continue
        fn = lambda cfg=cfg: bmm_kernel.launch(a, b, c, cfg, p.allow_tf32)  # noqa: E731
        try:
            # Load the module first: a config out of resources fails here, before any event is recorded.
            bmm_kernel.prepare(a, b, c, cfg, p.allow_tf32)
            c.fill_(float("nan"))  # poison: every element must be written
            first = bench.timed_run(fn)  # the correctness launch is the config's first timed run
        except Exception as exc:  # out of resources: a failure row
            rows.append({**row, "status": f"fail:launch:{type(exc).__name__}", "ms": None})
            continue
        errs.append(relative_error(c, ref, ref_norm))
        runnable.append(row)
        fns.append(fn)
        first_runs.append(first)
    clocks: list[float | None] = []
    timed = bench.time_many(fns, on_busy=lambda: clocks.append(clock.sm_clock_mhz()), first_runs=first_runs,
                            peers=[True] * len(fns)) if fns else []
    stalls = list(bench.last_stalls) if fns else []
    err_values = torch.stack(errs).tolist() if errs else []
    out = [timed_row(p, row, ms, reps, err, spec, clocks[0] if clocks else None, st)
           for row, (ms, reps), err, st in zip(runnable, timed, err_values, stalls)]

    # aten::bmm (cuBLAS) and, where pad_mm would pad, the padded bmm: pad, bmm, slice
    with cublas_tf32(p.allow_tf32):
        aten = lambda: torch.bmm(a, b)  # noqa: E731
        calls, kinds = [aten], [{**base, "kind": "aten"}]
        if needs_padding(p):
            mp_, kp, np_ = padded_dims(p)
            calls.append(lambda: pad_bmm(a, b, (mp_, kp, np_)))
            kinds.append({**base, "kind": "aten_pad", "padded_m": mp_, "padded_k": kp, "padded_n": np_})
        aten_errs = [relative_error(fn(), ref, ref_norm) for fn in calls]  # also the warm-up
        aten_clocks: list[float | None] = []
        aten_timed = bench_aten.time_many(calls, on_busy=lambda: aten_clocks.append(clock.sm_clock_mhz()))
    for row, (ms, reps), err, st in zip(kinds, aten_timed, torch.stack(aten_errs).tolist(), bench_aten.last_stalls):
        out.append(timed_row(p, row, ms, reps, err, spec, aten_clocks[0] if aten_clocks else None, st))
    return out + rows


def header(spec: DeviceSpec, live: dict[str, Any], settings: BmmSweepSettings) -> dict[str, Any]:
    return device_header(live, spec) | {
        "schema_version": SCHEMA_VERSION, "kernel_hash": bmm_kernel.kernel_source_hash(),
        "kernel_mode": bmm_kernel.kernel_mode(), "torch": torch.__version__,
        "sweep": {"seed": settings.seed, "n": settings.n, "extra_configs": settings.extra_configs,
                  "rebatch": settings.rebatch, "excluded": len(settings.exclude), "budget": vars(settings.budget),
                  "modes": list(settings.modes) if settings.modes else None,
                  "problem_spec": settings.problem_spec or spec.name,
                  "timing": vars(settings.timing), "aten_pre_sleep_us": settings.aten_pre_sleep_us}}


def run(out_dir: Path, spec_name: str | None = None, settings: BmmSweepSettings = BmmSweepSettings(),
        progress: bool = True) -> dict[str, Any]:
    """The sweep on the current CUDA device (`perfmodel gen bmm`)."""
    from perfmodel.devices import ClockReader

    device = torch.device("cuda", torch.cuda.current_device())
    spec, live = resolve_spec(spec_name)
    l2 = live.get("l2_bytes") or spec.l2_bytes
    aten_timing = TimingSettings(**{**vars(settings.timing), "pre_sleep_us": settings.aten_pre_sleep_us,
                                    "slow_factor": None})
    return sweep(out_dir, spec, live, settings, Bench(device, l2, settings.timing), Bench(device, l2, aten_timing),
                 ClockReader(torch.cuda.current_device()), progress)


def sweep(out_dir: Path, spec: DeviceSpec, live: dict[str, Any], settings: BmmSweepSettings, bench: Bench,
          bench_aten: Bench, clock, progress: bool = True) -> dict[str, Any]:
    """Draw the problems, leave out those already in out_dir, compile and time the rest into a new
    `bmm` part, stopping cleanly (between problems, or while waiting for a problem's compiles) at the
    time limit. bench times the Triton configs, bench_aten aten::bmm and the padded variant."""
    from tqdm import tqdm

    from .shards import ShardWriter

    from perfmodel.devices import get_spec

    t0 = time.perf_counter()
    draw = get_spec(settings.problem_spec) if settings.problem_spec else spec
    drawn = bmm_problems(settings.n, draw, settings.seed, settings.budget, settings.rebatch, settings.exclude,
                         settings.modes)
    writer = ShardWriter(out_dir, KIND, header(spec, live, settings))
    todo = [(p, f) for p, f in drawn if problem_id(p) not in writer.done]
    plan = {p: sweep_configs(p, draw, settings.extra_configs) for p, _ in todo}
    est = estimate([p for p, _ in todo], plan, spec, settings.compile_workers, settings.timing)
    print(f"bmm sweep: {len(todo)} of {len(drawn)} problems to time ({len(drawn) - len(todo)} already in {out_dir}); "
          f"estimate {json.dumps(est)}", file=sys.stderr, flush=True)
    stats: dict[str, Any] = {"problems": 0, "rows": 0, "ok_rows": 0, "failed_rows": 0, "rejected_rows": 0,
                             "aten_rows": 0, "aten_pad_rows": 0, "kernels_compiled": 0, "compile_wait_s": 0.0,
                             "timing_s": 0.0, "host_stalls": 0, "slow_single_run": 0, "estimate": est,
                             "resumed_existing_rows": writer.n_existing_rows, "stopped_at_time_limit": False,
                             "compile_restarts": 0}
    if not todo:
        writer.close()
        stats["wall_s"] = time.perf_counter() - t0
        return stats
    compiles = Compiles(settings.compile_workers)
    stats["kernels_to_compile"] = sum(compiles.submit(p, [c for c, _ in plan[p]]) for p, _ in todo)
    bar = tqdm(total=len(todo), desc="bmm sweep", unit="problem", disable=not progress, smoothing=0.05)
    try:
        for p, family in todo:
            left = None if settings.time_limit_s is None else settings.time_limit_s - (time.perf_counter() - t0)
            if left is not None and left <= 0:
                stats["stopped_at_time_limit"] = True
                break
            tw = time.perf_counter()
            try:  # the limit also bounds the wait for a problem's compiles
                cfgs = [(cfg, source, compiles.error(p, cfg, left)) for cfg, source in plan[p]]
            except cf.TimeoutError:
                stats["stopped_at_time_limit"] = True
                break
            stats["compile_wait_s"] += time.perf_counter() - tw
            tt = time.perf_counter()
            rows = measure_problem(p, family, cfgs, bench, bench_aten, spec, clock)
            stats["timing_s"] += time.perf_counter() - tt
            writer.write_unit(problem_id(p), rows)
            torch.cuda.empty_cache()  # operands of up to gigabytes, each size once
            stats["problems"] += 1
            stats["rows"] += len(rows)
            stats["host_stalls"] += sum(r.get("host_stalls", 0) for r in rows)
            stats["slow_single_run"] += sum(bench.last_single_run)
            for r in rows:
                stats["aten_rows"] += r["kind"] == "aten" and r["status"] == "ok"
                stats["aten_pad_rows"] += r["kind"] == "aten_pad" and r["status"] == "ok"
                if r["kind"] == "triton":
                    stats["ok_rows"] += r["status"] == "ok"
                    stats["failed_rows"] += r["status"].startswith("fail")
                    stats["rejected_rows"] += r["status"] == "rejected_peak"
            bar.update(1)
            bar.set_postfix(rows=stats["rows"], kernels=len(compiles.errors), wait=f"{stats['compile_wait_s']:.0f}s")
    finally:
        bar.close()
        writer.close()
        compiles.shutdown()
    stats["kernels_compiled"] = len(compiles.errors)
    stats["compile_restarts"] = compiles.restarts
    stats["wall_s"] = time.perf_counter() - t0
    stats["kernels_per_wall_s"] = stats["kernels_compiled"] / max(stats["wall_s"], 1e-9)
    return stats
