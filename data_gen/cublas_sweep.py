"""The cuBLAS (torch.mm) time of every GEMM problem of a dataset, measured on its own.

The GEMM sweep times torch.mm beside the problem's Triton configs while worker processes compile the
next groups. This pass re-times torch.mm for each problem of a dataset folder in a quiet process (no
compiles running), with its own GPU spin before each run, and writes `cublas-*` parts (one unit per
problem, keyed by the GEMM problem's unit id). Loaders take these rows over the in-sweep ones.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from perfmodel.schema import SCHEMA_VERSION, GemmProblem

from .measure import Bench, TimingSettings, relative_error
from .runtime import cublas_tf32, device_header, make_operands, resolve_spec
from .shards import iter_rows

KIND = "cublas"
ONLY_KIND = "cublas_only"
_FIELDS = ("m", "n", "k", "dtype", "allow_tf32", "transpose_left", "transpose_right")


def dataset_problems(folder: Path) -> list[tuple[str, GemmProblem]]:
    """(unit id, problem) for every GEMM problem of the dataset folder, in file order."""
    seen: dict[str, GemmProblem] = {}
    for r in iter_rows(folder, "gemm"):
        if r["unit"] not in seen:
            seen[r["unit"]] = GemmProblem(**{f: r[f] for f in _FIELDS})
    return list(seen.items())


def measure(p: GemmProblem, bench: Bench, spec, clock) -> dict[str, Any]:
    from .gemm_sweep import reference, timed_row

    a, b = make_operands(p, bench.device)
    ref = reference(p, a, b)
    with cublas_tf32(p.allow_tf32):
        fn = lambda: torch.mm(a, b)  # noqa: E731
        err = relative_error(fn(), ref, torch.linalg.vector_norm(ref)).item()
        clocks: list[float | None] = []
        (ms, reps), = bench.time_many([fn], on_busy=lambda: clocks.append(clock.sm_clock_mhz()))
    return timed_row(p, {**p.as_dict(), "kind": "cublas"}, ms, reps, err, spec, clocks[0], bench.last_stalls[0])


def run(out_dir: Path, source: Path, spec_name: str | None = None, timing: TimingSettings = TimingSettings(),
        progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    from perfmodel.devices import ClockReader

    from .kernel import kernel_mode, kernel_source_hash
    from .shards import ShardWriter

    spec, live = resolve_spec(spec_name)
    header = device_header(live, spec) | {"schema_version": SCHEMA_VERSION, "kernel_hash": kernel_source_hash(),
                                          "kernel_mode": kernel_mode(),
                                          "sweep": {"source": "gemm problems of the folder", "timing": vars(timing)}}
    problems = dataset_problems(source)
    device = torch.device("cuda", torch.cuda.current_device())
    bench = Bench(device, live.get("l2_bytes") or spec.l2_bytes, timing)
    clock = ClockReader(torch.cuda.current_device())
    stats = {"rows": 0, "ok_rows": 0, "wall_s": 0.0}
    t0 = time.perf_counter()
    with ShardWriter(out_dir, KIND, header) as writer:
        todo = [(u, p) for u, p in problems if u not in writer.done]
        for unit, p in tqdm(todo, desc="cublas", unit="problem", disable=not progress):
            row = measure(p, bench, spec, clock)
            writer.write_unit(unit, [row])
            stats["rows"] += 1
            stats["ok_rows"] += row["status"] == "ok"
    stats["wall_s"] = time.perf_counter() - t0
    return stats


def run_only(out_dir: Path, n: int, seed: int = 0, spec_name: str | None = None,
             timing: TimingSettings = TimingSettings(), progress: bool = True, exclude_from: Path | None = None,
             time_limit_s: float | None = None) -> dict[str, Any]:
    """Time torch.mm on problems.cublas_only_problems(n, seed) (without the GEMM problems of exclude_from)
    into `cublas_only` parts of out_dir, one unit per problem; resumes past the units already there and
    stops cleanly after time_limit_s."""
    from tqdm import tqdm

    from perfmodel.devices import ClockReader

    from .kernel import kernel_mode, kernel_source_hash
    from .problems import cublas_only_problems, problem_id
    from .shards import ShardWriter

    spec, live = resolve_spec(spec_name)
    exclude = frozenset(u for u, _ in dataset_problems(exclude_from)) if exclude_from is not None else frozenset()
    header = device_header(live, spec) | {"schema_version": SCHEMA_VERSION, "kernel_hash": kernel_source_hash(),
                                          "kernel_mode": kernel_mode(),
                                          "sweep": {"source": "cublas_only_problems", "n": n, "seed": seed,
                                                    "excluded": len(exclude), "timing": vars(timing)}}
    problems = cublas_only_problems(n, spec, seed, exclude=exclude)
    device = torch.device("cuda", torch.cuda.current_device())
    bench = Bench(device, live.get("l2_bytes") or spec.l2_bytes, timing)
    clock = ClockReader(torch.cuda.current_device())
    stats = {"problems": len(problems), "rows": 0, "ok_rows": 0, "wall_s": 0.0, "stopped_at_limit": False}
    t0 = time.perf_counter()
    with ShardWriter(out_dir, ONLY_KIND, header) as writer:
        todo = [(problem_id(p), p) for p in problems]
        todo = [(u, p) for u, p in todo if u not in writer.done]
        for unit, p in tqdm(todo, desc="cublas-only", unit="problem", disable=not progress):
            if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                stats["stopped_at_limit"] = True
                break
            row = measure(p, bench, spec, clock)
            torch.cuda.empty_cache()  # operands of up to gigabytes, each size once
            writer.write_unit(unit, [row])
            stats["rows"] += 1
            stats["ok_rows"] += row["status"] == "ok"
    stats["wall_s"] = time.perf_counter() - t0
    return stats
