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
from .problems import row_problem
from .runtime import cublas_tf32, device_header, make_operands, resolve_spec
from .shards import ONLY_KIND, iter_rows

KIND = "cublas"


def dataset_problems(folder: Path) -> list[tuple[str, GemmProblem]]:
    """(unit id, problem) for every GEMM problem of the dataset folder, in file order."""
    seen: dict[str, GemmProblem] = {}
    for r in iter_rows(folder, "gemm"):
        if r["unit"] not in seen:
            seen[r["unit"]] = row_problem(r)
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


def _time_units(out_dir: Path, kind: str, header: dict[str, Any], units: list[tuple[str, GemmProblem]], spec,
                live: dict[str, Any], timing: TimingSettings, progress: bool, stats: dict[str, Any],
                time_limit_s: float | None = None) -> dict[str, Any]:
    """Time torch.mm on each (unit id, problem) not yet in out_dir's `kind` parts, one unit a problem,
    counting rows into stats; stops cleanly after time_limit_s (stats["stopped_at_limit"])."""
    from tqdm import tqdm

    from perfmodel.devices import ClockReader

    from .shards import ShardWriter

    device = torch.device("cuda", torch.cuda.current_device())
    bench = Bench(device, live.get("l2_bytes") or spec.l2_bytes, timing)
    clock = ClockReader(torch.cuda.current_device())
    t0 = time.perf_counter()
    with ShardWriter(out_dir, kind, header) as writer:
        todo = [(u, p) for u, p in units if u not in writer.done]
        for unit, p in tqdm(todo, desc=kind.replace("_", "-"), unit="problem", disable=not progress):
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


def _header(spec, live: dict[str, Any], sweep: dict[str, Any]) -> dict[str, Any]:
    from .kernel import kernel_mode, kernel_source_hash

    return device_header(live, spec) | {"schema_version": SCHEMA_VERSION, "kernel_hash": kernel_source_hash(),
                                        "kernel_mode": kernel_mode(), "sweep": sweep}


def run(out_dir: Path, source: Path, spec_name: str | None = None, timing: TimingSettings = TimingSettings(),
        progress: bool = True) -> dict[str, Any]:
    spec, live = resolve_spec(spec_name)
    header = _header(spec, live, {"source": "gemm problems of the folder", "timing": vars(timing)})
    return _time_units(out_dir, KIND, header, dataset_problems(source), spec, live, timing, progress,
                       {"rows": 0, "ok_rows": 0, "wall_s": 0.0})


def run_only(out_dir: Path, n: int, seed: int = 0, spec_name: str | None = None,
             timing: TimingSettings = TimingSettings(), progress: bool = True, exclude_from: Path | None = None,
             time_limit_s: float | None = None) -> dict[str, Any]:
    """Time torch.mm on problems.cublas_only_problems(n, seed) (without the GEMM problems of exclude_from)
    into `cublas_only` parts of out_dir, one unit per problem; resumes past the units already there and
    stops cleanly after time_limit_s."""
    from .problems import cublas_only_problems, problem_id

    spec, live = resolve_spec(spec_name)
    exclude = frozenset(u for u, _ in dataset_problems(exclude_from)) if exclude_from is not None else frozenset()
    header = _header(spec, live, {"source": "cublas_only_problems", "n": n, "seed": seed, "excluded": len(exclude),
                                  "timing": vars(timing)})
    problems = cublas_only_problems(n, spec, seed, exclude=exclude)
    return _time_units(out_dir, ONLY_KIND, header, [(problem_id(p), p) for p in problems], spec, live, timing,
                       progress, {"problems": len(problems), "rows": 0, "ok_rows": 0, "wall_s": 0.0,
                                  "stopped_at_limit": False}, time_limit_s)
