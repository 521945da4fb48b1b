"""The Triton tutorial's matmul kernel, as an `@triton.autotune` user writes it, timed over configs of the model's
space on problems the project's data does not hold (GPU), and the model's ranking of those times (CPU).

The kernel is the matmul of Triton's tutorial 03 (grouped program order, K-masked loads, fp32 accumulator), with
the operands' strides as arguments (so NN and NT run one kernel) and tl.dot's input precision as a constexpr (TF32
or IEEE for fp32). It is compiled as Triton's autotuner compiles it: sizes and strides run-time arguments, Triton's
own specialisation (divisibility by 16, strides of 1). Per problem: `--configs` configs (the device's pruned space,
perfmodel.configs.stratified_sample, seeded per problem), each compiled in a pool of worker processes, then timed
with the dataset's protocol (perfmodel.data_gen.measure.Bench: L2 flushed, median of >= 10 clean runs), its output
checked against a float64 torch.mm and its time against the physical floor (perfmodel.devices roofline_ms). A config
Triton refuses (shared memory, threads) is recorded as failed. Rows are written after each problem; --time-limit
stops between problems.

    python -m benchmarks.studies.tutorial_kernel time --out benchmarks/results/tutorial_h200.json [--time-limit 400]   # GPU
    python -m benchmarks.studies.tutorial_kernel eval benchmarks/results/tutorial_h200.json [--model models/h200]     # CPU
    python -m benchmarks.studies.tutorial_kernel sweep --problems benchmarks/results/tutorial_sweep_h200/problems.json \
        --out DIR [--skip-done DIR...] [--time-limit 500]                                                              # GPU
    python -m benchmarks.studies.tutorial_kernel dataset --data data/h200 --model models/h200 --out PROBLEMS.json      # CPU
    python -m benchmarks.studies.tutorial_kernel unaligned --data data/h200 --out PROBLEMS.json                        # CPU

sweep: training data for the kernel's own mode. The dataset's problems (a list of units with their fields, made on
the CPU from a data folder by `dataset`), each timed over a fixed list of configs per dtype mode and layout (`--configs` of the
pruned space, stratified, seeded by mode and layout: an `@autotune` user's list is fixed too, and the compiles are
shared by every problem of one specialisation), with the same protocol and checks as `time`. Rows go to
DIR/static_rows.jsonl.gz in the dataset's row format, one problem's rows at a time (a stopped sweep keeps what it
timed; --skip-done leaves out the units of earlier runs); `perfmodel gen static --kind gemm_tutorial DIR --out data/h200`
writes them into the data folder. A launch that leaves the process's CUDA context unusable (an illegal address: the
tutorial kernel has configs that crash on unaligned strides) is recorded in DIR/crashes.jsonl and the sweep exits
with status 3; run again, it writes that config as failed for its problem and launches it no more in that dtype mode
and layout (a problem whose launches crashed three processes is given up). Run it in a loop while it exits 3.

unaligned: a problems file of weight shapes the data folder does not hold, one of K and N off a multiple of 16 (the
strides the first list barely holds), with their own config lists (the file's "config_seed") and their own held-out
keys (train/families.py extra_key_side): the tutorial head fits them beside the dataset's problems.

eval: per problem, the model's top-1 and top-5 (Predictor.rank over the configs that ran; `--kernel`: the dataset
kernel's "autotune" mode by default -- the tutorial kernel is compiled as the autotuner compiles the dataset's -- or
"tutorial", the model's tutorial head, fitted on the sweep's rows) against the best timed:
top-1 / top-5 efficiency (best ms / ms of the pick, best of the five), per dtype mode and layout, the worst problems,
and how many configs that ran the model calls unrunnable.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

from perfmodel.data_gen.problems import PROBLEM_FIELDS
from perfmodel.features import CONFIG_COLUMNS

# (M, N, K) x dtype mode x layout: sizes the data does not hold (odd M, unaligned N/K, LLM widths at small M).
SIZES = [(16, 4096, 4096), (64, 11008, 4096), (128, 5120, 5120), (333, 3072, 1024), (1000, 2304, 768),
         (2047, 2047, 2047), (4096, 1024, 4096), (3000, 4097, 1000), (512, 14336, 4096), (8192, 768, 3072),
         (256, 1000, 2000), (1536, 6144, 1536)]
MODES = ("float16", "bfloat16", "tf32", "float32")
LAYOUTS = ("NN", "NT")


@triton.jit
def tutorial_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                    GROUP_SIZE_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    c = accumulator.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


KERNEL_MODE = "triton tutorial 03 matmul"  # the gemm_tutorial parts' kernel_mode


def kernel_hash() -> str:
    """The kernel source's hash (the gemm_tutorial parts' kernel_hash: a part refuses another kernel's rows)."""
    import hashlib
    import inspect

    return hashlib.sha256(inspect.getsource(tutorial_matmul.fn).encode()).hexdigest()[:16]


def problems() -> list[dict[str, Any]]:
    """Every size in every dtype mode and layout."""
    return [{"m": m, "n": n, "k": k, "mode": mode, "layout": lay} for (m, n, k) in SIZES for mode in MODES
            for lay in LAYOUTS]


def gemm_problem(p: dict[str, Any]) -> Any:
    from perfmodel.schema import GemmProblem

    return GemmProblem(m=p["m"], n=p["n"], k=p["k"], dtype="float32" if p["mode"] in ("tf32", "float32") else p["mode"],
                       allow_tf32=p["mode"] == "tf32", transpose_right=p["layout"] == "NT")


def configs_for(p: dict[str, Any], n: int, spec: Any) -> list[Any]:
    from perfmodel.configs import pruned_space, stratified_sample

    gp = gemm_problem(p)
    seed = random.Random(json.dumps(p, sort_keys=True)).randrange(2**31)
    return stratified_sample(pruned_space(gp.dtype, spec), n, seed)


def _operands(p: dict[str, Any]) -> tuple[Any, Any, Any]:
    import torch

    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(p["mode"], torch.float32)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(p["m"], p["k"], device="cuda", dtype=dt, generator=g)
    b = torch.randn(p["n"], p["k"], device="cuda", dtype=dt, generator=g).t() if p["layout"] == "NT" else \
        torch.randn(p["k"], p["n"], device="cuda", dtype=dt, generator=g)
    c = torch.empty(p["m"], p["n"], device="cuda", dtype=dt)
    return a, b, c


def _launch_args(p: dict[str, Any], a: Any, b: Any, c: Any, cfg: Any) -> tuple[tuple, dict]:
    grid = (triton.cdiv(p["m"], cfg.block_m) * triton.cdiv(p["n"], cfg.block_n),)
    ints = (p["m"], p["n"], p["k"], a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    meta = dict(BLOCK_SIZE_M=cfg.block_m, BLOCK_SIZE_N=cfg.block_n, BLOCK_SIZE_K=cfg.block_k,
                GROUP_SIZE_M=cfg.group_m, INPUT_PRECISION="ieee" if p["mode"] == "float32" else "tf32",
                num_stages=cfg.num_stages, num_warps=cfg.num_warps)
    return grid, (ints, meta)


def _compile(job: tuple[dict[str, Any], tuple]) -> str | None:
    """A worker: compile (no launch) one (problem, config) into Triton's cache; None or the error."""
    import torch

    from perfmodel.schema import GemmConfig

    p, c = job
    cfg = GemmConfig(*c)
    try:
        a, b, out = _operands(p)
        grid, (ints, meta) = _launch_args(p, a, b, out, cfg)
        tutorial_matmul.warmup(a, b, out, *ints, **meta, grid=grid)
        torch.cuda.synchronize()
        return None
    except Exception as exc:  # any compile failure is the row's outcome
        return f"{type(exc).__name__}: {str(exc)[:200]}"


TOL = {"float16": 2e-2, "bfloat16": 3e-2, "tf32": 1e-2, "float32": 1e-4}


def time_problems(out: Path, n_configs: int, time_limit: float, workers: int) -> dict[str, Any]:
    """Time every problem() over its own sampled configs (GPU), the results JSON rewritten after each problem; an
    existing --out is resumed (its problems are kept and not timed again)."""
    import multiprocessing as mp

    import torch

    from perfmodel.data_gen.measure import Bench, TimingSettings
    from perfmodel.devices import get_spec

    t0 = time.perf_counter()
    spec = get_spec("h200" if "H200" in torch.cuda.get_device_name(0) else "h100-sxm")
    bench = Bench(torch.device("cuda"), torch.cuda.get_device_properties(0).L2_cache_size, TimingSettings())
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                               "triton": triton.__version__, "spec": spec.name, "configs": n_configs, "problems": []}
    if out.is_file():
        results = json.loads(out.read_text())
        if results.get("spec") != spec.name or results.get("configs") != n_configs:
            raise ValueError(f"--out: {out} was timed on {results.get('spec')} with {results.get('configs')} configs "
                             f"a problem, not {spec.name} with {n_configs}")
    key = lambda p: tuple(p[f] for f in ("m", "n", "k", "mode", "layout"))  # noqa: E731
    done = {key(p) for p in results["problems"]}
    todo = [p for p in problems() if key(p) not in done]
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        for i, p in enumerate(todo):
            if time.perf_counter() - t0 > time_limit:
                print(f"[tutorial] time limit: {i} problems done", flush=True)
                break
            cfgs = configs_for(p, n_configs, spec)
            errors = pool.map(_compile, [(p, dataclasses.astuple(c)) for c in cfgs])
            rows = _time_one(p, cfgs, errors, bench, spec)
            floor = float(spec.roofline_ms(p["m"], p["n"], p["k"], gemm_problem(p).dtype, p["mode"] == "tf32"))
            results["problems"].append({**p, "floor_ms": floor, "rows": rows})
            ok = [r["ms"] for r in rows if r.get("ms")]
            print(f"[tutorial] {len(done) + i + 1}: {p} {len(ok)}/{len(rows)} ran, best "
                  f"{min(ok) if ok else float('nan'):.4f} ms ({time.perf_counter() - t0:.0f} s)", flush=True)
            out.write_text(json.dumps(results) + "\n")
    return results


def study_problem(p: dict[str, Any]) -> dict[str, Any]:
    """A dataset problem (its row fields) as this study's problem (mode and layout); A must be row-major."""
    if p["transpose_left"]:
        raise ValueError(f"problem {p.get('unit')}: transpose_left is not a layout this kernel study times")
    mode = "tf32" if p["dtype"] == "float32" and p["allow_tf32"] else p["dtype"]
    return {"m": p["m"], "n": p["n"], "k": p["k"], "mode": mode, "layout": "NT" if p["transpose_right"] else "NN"}


def fixed_configs(mode: str, layout: str, n: int, spec: Any, list_seed: str = "") -> list[Any]:
    """The sweep's config list of one dtype mode and layout: n of the pruned space, stratified, seeded by both (and
    by list_seed, a problems file's "config_seed", where it names one: another list for another sweep)."""
    from perfmodel.configs import pruned_space, stratified_sample

    dtype = "float32" if mode in ("tf32", "float32") else mode
    seed = random.Random(f"{list_seed}/{mode}/{layout}" if list_seed else f"{mode}/{layout}").randrange(2**31)
    return stratified_sample(pruned_space(dtype, spec), n, seed)


class DeviceCrash(Exception):
    """A launch left the process's CUDA context unusable (an illegal address, say): nothing more can run in it."""

    def __init__(self, config: list[int] | None, error: str):
        super().__init__(f"config {config}: {error}")
        self.config, self.error = config, error


def _device_error(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, getattr(torch, "AcceleratorError", ())) or str(exc).startswith("CUDA error")


def _time_one(p: dict[str, Any], cfgs: list[Any], errors: list[str | None], bench: Any, spec: Any,
              crashed: dict[tuple, str] | None = None) -> list[dict]:
    """One problem's rows: each config checked against a float64 torch.mm, then timed (bench.time_many); a config
    Triton refuses is "unrunnable", one that fails otherwise "failed" -- as is one that crashed an earlier process
    on this problem (crashed: config tuple -> its error), which is not launched again. DeviceCrash where a launch
    leaves the CUDA context unusable (the caller's process must end)."""
    import torch
    from triton.runtime.errors import OutOfResources

    a, b, c = _operands(p)
    ref = a.double() @ b.double()
    rows, fns, idx = [], [], []
    for cfg, err in zip(cfgs, errors):
        row: dict[str, Any] = {"config": list(dataclasses.astuple(cfg))}
        grid, (ints, meta) = _launch_args(p, a, b, c, cfg)
        if crashed and tuple(row["config"]) in crashed:  # measured already: its launch lost a process's context
            rows.append({**row, "status": "failed", "error": f"device error: {crashed[tuple(row['config'])][:200]}"})
            continue
        try:
            if err:
                raise RuntimeError(err)
            k = tutorial_matmul.warmup(a, b, c, *ints, **meta, grid=grid)
            k._init_handles()
            c.zero_()
            tutorial_matmul[grid](a, b, c, *ints, **meta)
            torch.cuda.synchronize()
            rel = float((c.double() - ref).norm() / ref.norm())
            if not rel <= TOL[p["mode"]]:
                raise RuntimeError(f"output check: relative error {rel:.3g}")
            row["rel_err"] = rel
            fns.append(lambda grid=grid, ints=ints, meta=meta, a=a, b=b, c=c:
                       tutorial_matmul[grid](a, b, c, *ints, **meta))
            idx.append(len(rows))
            row["status"] = "ok"
        except OutOfResources as exc:
            row.update(status="unrunnable", error=str(exc)[:200])
        except Exception as exc:  # a failed config is the row's outcome
            if _device_error(exc):
                raise DeviceCrash(row["config"], f"{type(exc).__name__}: {str(exc)[:200]}") from exc
            row.update(status="failed", error=f"{type(exc).__name__}: {str(exc)[:200]}")
        rows.append(row)
    try:
        timed = bench.time_many(fns, peers=[True] * len(fns)) if fns else []
    except Exception as exc:
        if _device_error(exc):
            raise DeviceCrash(None, f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        raise
    floor = float(spec.roofline_ms(p["m"], p["n"], p["k"], gemm_problem(p).dtype, p["mode"] == "tf32"))
    for j, (ms, runs) in zip(idx, timed):
        rows[j].update(ms=ms, runs=runs, below_floor=bool(ms < floor))
    del a, b, c, ref
    return rows


def done_units(runs: list[Path]) -> set[str]:
    """The units already in earlier sweeps' rows files."""
    import gzip

    out: set[str] = set()
    for run in runs:
        path = run / "static_rows.jsonl.gz" if run.is_dir() else run
        if path.is_file():
            with gzip.open(path, "rt") as fh:
                out.update(json.loads(line)["unit"] for line in fh if line.strip())
    return out


CRASHES_FILE = "crashes.jsonl"  # a sweep folder's launches that lost the CUDA context: unit, config, error
CRASH_EXIT = 3  # the sweep's exit status after such a launch: run it again (it resumes, without that config)
MAX_CRASHES = 3  # a problem whose launches crashed this many processes is given up


def read_crashes(runs: list[Path]) -> dict[str, list[tuple[list[int] | None, str]]]:
    """unit -> [(config or None, error)] from the runs' crashes files."""
    out: dict[str, list[tuple[list[int] | None, str]]] = {}
    for run in runs:
        path = run / CRASHES_FILE
        if run.is_dir() and path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    out.setdefault(r["unit"], []).append((r["config"], r["error"]))
    return out


def sweep(problems_file: Path, out: Path, n_configs: int, time_limit: float, workers: int,
          skip: list[Path]) -> dict[str, int]:
    """Time the listed dataset problems over the fixed config lists (GPU); rows appended per problem to
    out/static_rows.jsonl.gz (dataset row format, kind "triton"); returns counts."""
    import gzip
    import multiprocessing as mp

    import torch

    from perfmodel.data_gen.measure import Bench, TimingSettings
    from perfmodel.devices import get_spec

    t0 = time.perf_counter()
    listing = json.loads(problems_file.read_text())
    listed, list_seed = listing["problems"], listing.get("config_seed", "")
    done = done_units([*skip, out])
    crashes = read_crashes([*skip, out])
    given_up = {u for u, cs in crashes.items() if len(cs) >= MAX_CRASHES}
    crashed = {u: {tuple(c): e for c, e in cs if c is not None} for u, cs in crashes.items()}  # unit -> config -> error
    by_unit = {p["unit"]: study_problem(p) for p in listed}
    banned: dict[tuple[str, str], set[tuple]] = {}  # a config that crashed a process is not launched again
    for u, cfgs in crashed.items():
        if u in by_unit:
            banned.setdefault((by_unit[u]["mode"], by_unit[u]["layout"]), set()).update(cfgs)
    todo = [p for p in listed if p["unit"] not in done | given_up]
    if given_up:
        print(f"[sweep] {len(given_up)} problem(s) given up after {MAX_CRASHES} device errors: {sorted(given_up)}",
              flush=True)
    spec = get_spec("h200" if "H200" in torch.cuda.get_device_name(0) else "h100-sxm")
    bench = Bench(torch.device("cuda"), torch.cuda.get_device_properties(0).L2_cache_size, TimingSettings())
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                              "triton": triton.__version__, "spec": spec.name,
                                              "configs": n_configs, "config_seed": list_seed, "kernel": KERNEL_MODE,
                                              "kernel_hash": kernel_hash()}) + "\n")
    counts = {"problems": 0, "rows": 0, "ok": 0, "unrunnable": 0, "failed": 0, "below_floor": 0}
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        def submit(q: dict[str, Any]) -> tuple[dict, list, Any]:
            sp = study_problem(q)
            own, ban = crashed.get(q["unit"], {}), banned.get((sp["mode"], sp["layout"]), set())
            cfgs = [c for c in fixed_configs(sp["mode"], sp["layout"], n_configs, spec, list_seed)
                    if dataclasses.astuple(c) in own or dataclasses.astuple(c) not in ban]
            return sp, cfgs, pool.map_async(_compile, [(sp, dataclasses.astuple(c)) for c in cfgs])

        pending = submit(todo[0]) if todo else None
        for i, q in enumerate(todo):
            sp, cfgs, job = pending
            errors = job.get()
            if i + 1 < len(todo):
                pending = submit(todo[i + 1])  # the next problem compiles while this one is timed
            try:
                rows = _time_one(sp, cfgs, errors, bench, spec, crashed.get(q["unit"]))
            except DeviceCrash as exc:  # recorded; this process can run nothing more (exit CRASH_EXIT, resume)
                with open(out / CRASHES_FILE, "a") as fh:
                    fh.write(json.dumps({"unit": q["unit"], "config": exc.config, "error": exc.error}) + "\n")
                print(f"[sweep] {q['unit']} {sp}: device error, config {exc.config}: {exc.error}", flush=True)
                raise SystemExit(CRASH_EXIT) from exc
            with gzip.open(out / "static_rows.jsonl.gz", "at") as fh:
                for r in rows:
                    cfg = dict(zip(CONFIG_COLUMNS, r["config"]))
                    row = {**{k: q[k] for k in PROBLEM_FIELDS}, "kind": "triton", **cfg,
                           "status": r["status"] if not r.get("below_floor") else "failed",
                           "flag": "below_floor" if r.get("below_floor") else "", "unit": q["unit"]}
                    for key in ("ms", "runs", "rel_err", "error"):
                        if key in r:
                            row["reps" if key == "runs" else key] = r[key]
                    fh.write(json.dumps(row) + "\n")
                    counts["rows"] += 1
                    counts["below_floor" if r.get("below_floor") else r["status"]] += 1
            counts["problems"] += 1
            ok = [r["ms"] for r in rows if r.get("ms")]
            print(f"[sweep] {i + 1}/{len(todo)} {q['unit']} {sp} {len(ok)}/{len(rows)} ran, best "
                  f"{min(ok) if ok else float('nan'):.4f} ms ({time.perf_counter() - t0:.0f} s)", flush=True)
            if time.perf_counter() - t0 > time_limit:
                print(f"[sweep] time limit: {i + 1} problems done", flush=True)
                break
    print(f"[sweep] {counts}", flush=True)
    return counts


def dataset_problems(data: Path, model: Path, device: str, max_floor_ms: float = 0.6, seed: int = 0) -> dict[str, Any]:
    """A sweep's problems file of the data folder's own gemm problems (CPU): every unit whose physical floor on
    `device` is at most max_floor_ms, its family (train/families.py family_key) and side taken from the family split
    that `model`'s inductor head records (the tutorial head is fitted on the same split). Each side is shuffled
    (random.Random(seed), train, test, val in that order); the held-out problems alternate test and val, and the list
    interleaves three train problems with one held out, so a stopped sweep covers every side. It rebuilds
    benchmarks/results/tutorial_sweep_h200/problems.json exactly from data/h200 and models/h200."""
    from perfmodel.data_gen.shards import read_dataset
    from perfmodel.devices import get_spec
    from perfmodel.train.families import family_key, family_names

    meta = json.loads((Path(model) / "metadata.json").read_text())
    split = (meta.get("inductor_metrics") or {}).get("family_split")
    if not split:
        raise ValueError(f"--model: {model} records no inductor head's family split (metadata inductor_metrics)")
    rows, _ = read_dataset(data, "gemm")
    if not rows:
        raise FileNotFoundError(f"--data: no gemm rows in {data}")
    spec, names = get_spec(device), family_names()
    test, val = set(split["test_keys"]), set(split["val_keys"])
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        first.setdefault(r["unit"], r)
    sides: dict[str, list[dict[str, Any]]] = {"train": [], "test": [], "val": []}
    for unit, r in first.items():
        floor = float(spec.roofline_ms(r["m"], r["n"], r["k"], r["dtype"], r["allow_tf32"]))
        if floor > max_floor_ms:
            continue
        key = family_key(r["k"], r["n"], names)
        side = "test" if key in test else "val" if key in val else "train"
        sides[side].append({"unit": unit, **{f: r[f] for f in PROBLEM_FIELDS}, "family": key, "floor_ms": floor})
    rng = random.Random(seed)
    for group in sides.values():
        rng.shuffle(group)
    held = [p for pair in itertools.zip_longest(sides["test"], sides["val"]) for p in pair if p is not None]
    where = lambda f: f"{Path(f).parent.name}/{Path(f).name}"  # noqa: E731  (as given, without the machine's root)
    return {"source": f"{where(data)} gemm problems (units), family split of {where(model)}'s inductor head (seed "
                      f"{split.get('seed', 0)}); problems whose physical floor is above {max_floor_ms:g} ms left out; "
                      f"order: 3 train-family problems, then one held-out (test / val alternately)",
            "problems": _interleave(sides["train"], held)}


def _interleave(train: list[Any], held: list[Any]) -> list[Any]:
    """Three train problems, then one held out, to the end of both: a stopped sweep covers every side."""
    order: list[Any] = []
    while train or held:
        order += train[:3] + held[:1]
        train, held = train[3:], held[1:]
    return order


UNALIGNED_CLASSES = ("8 mod 16", "4 mod 8", "2 mod 4", "any")  # data_gen/problems.py ALIGNMENT_CLASSES, less "aligned"
MODE_WEIGHTS = (("float16", 0.3), ("bfloat16", 0.3), ("tf32", 0.2), ("float32", 0.2))  # data_gen/problems.py MODES


def unaligned_problems(data: Path, device: str, n_keys: int, per_key: int, seed: int = 0, max_floor_ms: float = 0.3,
                       split_seed: int = 0) -> dict[str, Any]:
    """A sweep's problems file of unaligned weight shapes (CPU): n_keys new family keys (K, N), at least one of them
    not a multiple of 16 (each dim log-uniform, K in [32, 16384], N in [32, 32768], in an alignment class of
    data_gen/problems.py), none a key of the folder `data`'s gemm problems nor of this study's SIZES (they stay
    unseen), and per key per_key problems: a dtype mode (the data's weights), a layout and M (log-uniform in [1, 8192],
    any alignment class), M halved until the physical floor is at most max_floor_ms. Each key's side (train / val /
    test) is train/families.py extra_key_side's -- the tutorial head's split of keys the gemm rows do not hold --
    and the list interleaves three train problems with one held out, so a stopped sweep covers every side. The
    file names its config list seed ("unaligned"): the sweep times these over another fixed list than the first."""
    from perfmodel.data_gen.problems import ALIGNMENT_CLASSES, aligned_dim, problem_id
    from perfmodel.data_gen.shards import read_dataset
    from perfmodel.devices import get_spec
    from perfmodel.schema import GemmProblem
    from perfmodel.train.families import extra_key_side, family_key, family_names

    spec = get_spec(device)
    rows, _ = read_dataset(data, "gemm")
    if not rows:
        raise FileNotFoundError(f"--data: no gemm rows in {data}")
    names = family_names()
    taken = {family_key(r["k"], r["n"], names) for r in rows} | {family_key(k, n, names) for _, n, k in SIZES}
    study_dims = {d for size in SIZES for d in size if d % 16}
    ids = {r["unit"] for r in rows}
    rng = random.Random(seed)
    keys: list[tuple[int, int]] = []
    while len(keys) < n_keys:
        k = aligned_dim(rng, 32, 16384, rng.choice(("aligned",) + UNALIGNED_CLASSES))
        n = aligned_dim(rng, 32, 32768, rng.choice(("aligned",) + UNALIGNED_CLASSES))
        key = family_key(k, n, names)
        if (k % 16 == 0 and n % 16 == 0) or key in taken or k in study_dims or n in study_dims:
            continue
        taken.add(key)
        keys.append((k, n))
    sides: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for k, n in keys:
        key = family_key(k, n, names)
        side = extra_key_side(key, split_seed)
        for _ in range(per_key):
            mode = rng.choices([m for m, _ in MODE_WEIGHTS], [w for _, w in MODE_WEIGHTS])[0]
            m = aligned_dim(rng, 1, 8192, rng.choices([c for c, _ in ALIGNMENT_CLASSES],
                                                     [w for _, w in ALIGNMENT_CLASSES])[0])
            dtype = "float32" if mode in ("tf32", "float32") else mode
            while m > 1 and float(spec.roofline_ms(m, n, k, dtype, mode == "tf32")) > max_floor_ms:
                m //= 2
            floor = float(spec.roofline_ms(m, n, k, dtype, mode == "tf32"))
            if floor > max_floor_ms:
                continue
            gp = GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=mode == "tf32", transpose_right=rng.random() < 0.5)
            unit = problem_id(gp)
            if unit in ids:
                continue
            ids.add(unit)
            sides[min(side, 1)].append({"unit": unit, **{f: getattr(gp, f) for f in PROBLEM_FIELDS}, "family": key,
                                        "side": ("train", "val", "test")[side], "floor_ms": floor})
    for group in sides.values():
        rng.shuffle(group)
    order = _interleave(sides[0], sides[1])
    return {"source": f"{n_keys} unaligned weight shapes (K, N) not in {data.name}'s gemm problems nor in the study's "
                      f"sizes, {per_key} problems each (seed {seed}), physical floor at most {max_floor_ms} ms; "
                      f"side: train/families.py extra_key_side (seed {split_seed}); order: 3 train, then one held out",
            "config_seed": "unaligned", "device": spec.name, "problems": order}


def sweep_results(runs: list[Path], model: str | None, split: str | None) -> dict[str, Any]:
    """Sweep folders' rows as a time run's results (evaluate's input), one problem per unit; split "test" / "val" /
    "train": only the problems whose family (train/families.py family_key) the model's tutorial head -- else its
    inductor head -- held out as that split (its metadata's family_split; "train": neither test nor val)."""
    import gzip

    from perfmodel.train.families import family_key, family_names

    by_unit: dict[str, dict[str, Any]] = {}
    spec = None
    for run in runs:
        meta = json.loads((run / "run.json").read_text())
        spec = spec or meta["spec"]
        with gzip.open(run / "static_rows.jsonl.gz", "rt") as fh:
            for line in fh:
                r = json.loads(line)
                p = by_unit.setdefault(r["unit"], {**study_problem(r), "unit": r["unit"], "rows": []})
                p["rows"].append({"config": [r[f] for f in CONFIG_COLUMNS], "status": r["status"], "ms": r.get("ms")})
    problems = list(by_unit.values())
    if split is not None:
        from perfmodel.locations import default_model_dir

        folder = Path(model) if model else default_model_dir(spec.split("-")[0])
        meta = json.loads((folder / "metadata.json").read_text())
        rec = (meta.get("tutorial_metrics") or meta.get("inductor_metrics") or {}).get("family_split")
        if not rec:
            raise ValueError(f"--split: {model} records no family split (a tutorial or inductor head's)")
        test, val = set(rec["test_keys"]), set(rec["val_keys"])
        names = family_names()
        side = lambda p: "test" if family_key(p["k"], p["n"], names) in test else \
            "val" if family_key(p["k"], p["n"], names) in val else "train"  # noqa: E731
        problems = [p for p in problems if side(p) == split]
    return {"spec": spec, "problems": problems}


def evaluate(results: dict[str, Any], model: str | None, kernel: str = "autotune") -> dict[str, Any]:
    import numpy as np

    from perfmodel import Predictor
    from perfmodel.schema import GemmConfig

    dev = results.get("spec", "h200")
    pred = Predictor.load(model, device=dev, kernel=kernel) if model else \
        Predictor.load(device=dev.split("-")[0], kernel=kernel)
    per = []
    called_inf = 0
    for p in results["problems"]:
        ran = [r for r in p["rows"] if r.get("status") == "ok" and not r.get("below_floor")]
        if len(ran) < 10:
            continue
        cfgs = [GemmConfig(*r["config"]) for r in ran]
        ms = np.array([r["ms"] for r in ran])
        prob = gemm_problem(p)
        pm = np.asarray(pred.predict_many([prob], cfgs))[0]
        called_inf += int(np.isinf(pm).sum())
        order = [cfgs.index(c) for c, _ in pred.rank(prob, cfgs, top_k=5)]
        per.append({"m": p["m"], "n": p["n"], "k": p["k"], "mode": p["mode"], "layout": p["layout"],
                    "configs": len(ran), "top1": float(ms.min() / ms[order[0]]),
                    "top5": float(ms.min() / ms[order].min())})
    geo = lambda xs: float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")  # noqa: E731
    out: dict[str, Any] = {"model": str(getattr(pred, "source", "")), "kernel": kernel, "problems": len(per),
                           "ran_called_unrunnable": called_inf}
    aligned = lambda r: r["k"] % 8 == 0 and r["n"] % 8 == 0  # noqa: E731
    groups = {"all": per} | {m: [r for r in per if r["mode"] == m] for m in MODES} | \
        {f"layout/{lay}": [r for r in per if r["layout"] == lay] for lay in LAYOUTS} | \
        {"K and N multiples of 8": [r for r in per if aligned(r)], "K or N not": [r for r in per if not aligned(r)]}
    for name, rs in groups.items():
        out[name] = {"problems": len(rs), "top1": geo([r["top1"] for r in rs]), "top5": geo([r["top5"] for r in rs]),
                     "worst_top1": min((r["top1"] for r in rs), default=float("nan"))}
    out["worst"] = sorted(per, key=lambda r: r["top1"])[:8]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time", help="GPU: time the tutorial kernel")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--configs", type=int, default=40)
    t.add_argument("--time-limit", type=float, default=400.0, help="seconds; no problem starts past it")
    t.add_argument("--workers", type=int, default=12, help="compile processes")
    w = sub.add_parser("sweep", help="GPU: time dataset problems over fixed config lists (training rows)")
    w.add_argument("--problems", type=Path, required=True, help="a problems file (benchmarks/results/tutorial_sweep_*)")
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--configs", type=int, default=40)
    w.add_argument("--time-limit", type=float, default=400.0, help="seconds; no problem starts past it")
    w.add_argument("--workers", type=int, default=12, help="compile processes")
    w.add_argument("--skip-done", type=Path, nargs="*", default=[], help="earlier sweeps' folders: their units are left out")
    d = sub.add_parser("dataset", help="CPU: a sweep's problems file of a data folder's own gemm problems")
    d.add_argument("--data", type=Path, required=True, help="the data folder whose gemm problems are listed")
    d.add_argument("--model", type=Path, required=True, help="the model folder whose inductor head's family split sides them")
    d.add_argument("--device", default="h200", help="the device spec whose physical floor bounds the problems")
    d.add_argument("--max-floor-ms", type=float, default=0.6)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", type=Path, required=True)
    u = sub.add_parser("unaligned", help="CPU: a sweep's problems file of unaligned weight shapes new to a data folder")
    u.add_argument("--data", type=Path, required=True, help="the data folder whose gemm problems' shapes are left out")
    u.add_argument("--device", default="h200", help="the device spec whose physical floor bounds the problems")
    u.add_argument("--keys", type=int, default=100, help="weight shapes (family keys)")
    u.add_argument("--per-key", type=int, default=8, help="problems per weight shape")
    u.add_argument("--seed", type=int, default=0)
    u.add_argument("--max-floor-ms", type=float, default=0.3)
    u.add_argument("--out", type=Path, required=True)
    e = sub.add_parser("eval", help="CPU: the model's ranking of a time run (or of sweep folders)")
    e.add_argument("results", type=Path, nargs="+", help="a time run's JSON, or sweep folders")
    e.add_argument("--split", choices=("train", "val", "test"), default=None,
                   help="sweep folders: only the problems of the families the model's head held out as this split")
    e.add_argument("--model", default=None, help="a model folder (default: the shipped one for the run's device)")
    e.add_argument("--split-model", default=None,
                   help="--split by the family split this model folder records (default: --model's): an earlier "
                        "model scored on a later one's held-out problems")
    e.add_argument("--out", type=Path, default=None)
    e.add_argument("--kernel", default="autotune", choices=("autotune", "inductor", "tutorial"),
                   help="the model's kernel mode ranked (tutorial: its tutorial head)")
    args = ap.parse_args(argv)
    if args.cmd == "time":
        time_problems(args.out, args.configs, args.time_limit, args.workers)
        return 0
    if args.cmd == "dataset":
        listing = dataset_problems(args.data, args.model, args.device, args.max_floor_ms, args.seed)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(listing) + "\n")
        print(f"[dataset] {len(listing['problems'])} problems -> {args.out}")
        return 0
    if args.cmd == "unaligned":
        listing = unaligned_problems(args.data, args.device, args.keys, args.per_key, args.seed, args.max_floor_ms)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(listing, indent=0) + "\n")
        sides = [p["side"] for p in listing["problems"]]
        print(f"[unaligned] {len(sides)} problems ({', '.join(f'{s} {sides.count(s)}' for s in ('train', 'val', 'test'))}) "
              f"-> {args.out}")
        return 0
    if args.cmd == "sweep":
        sweep(args.problems, args.out, args.configs, args.time_limit, args.workers, args.skip_done)
        return 0
    try:
        if all(r.is_dir() for r in args.results):
            res = sweep_results(args.results, args.split_model or args.model, args.split)
        elif len(args.results) == 1 and args.split is None:
            res = json.loads(args.results[0].read_text())
        else:
            raise ValueError("expected one time run's JSON, or sweep folders (--split: sweep folders only)")
    except (OSError, ValueError, KeyError) as exc:
        print(f"results: cannot read {' '.join(map(str, args.results))}: {exc}", file=sys.stderr)
        return 2
    ev = evaluate(res, args.model, args.kernel)
    text = json.dumps(ev, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
