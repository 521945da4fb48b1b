"""The pad sweep: orig (torch.mm) vs padded (pad the operands, mm, slice) per PadProblem, with the
semantics of Inductor's pad_mm pass: pad M and K of A, K and N of B to the dtype's alignment (a dim of
size 1 is not padded); the pad of an operand marked prepadded is free (excluded from the time)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from perfmodel.schema import SCHEMA_VERSION, PadProblem

from .measure import TOLERANCE, Bench, TimingSettings, fraction_of_peak, relative_error, validate
from .problems import pad_problems
from .runtime import cublas_tf32, device_header, make_operands, resolve_spec

KIND = "pad"
UNIT_SIZE = 25  # pad problems per crash-safe unit


def pad_key(p: PadProblem) -> str:
    return (f"{p.m}x{p.k}x{p.n}:{p.dtype}:{int(p.allow_tf32)}:{int(p.transpose_left)}{int(p.transpose_right)}"
            f"{int(p.prepadded_left)}{int(p.prepadded_right)}")


def pad_operand(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad a 2-D operand to (rows, cols) (F.pad gives a new tensor; layout as Inductor's pad_mm)."""
    return F.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0])) if (rows, cols) != tuple(x.shape) else x


def measure(p: PadProblem, bench: Bench, spec, clock) -> dict[str, Any]:
    from perfmodel.schema import GemmProblem

    g = GemmProblem(m=p.m, n=p.n, k=p.k, dtype=p.dtype, allow_tf32=p.allow_tf32,
                    transpose_left=p.transpose_left, transpose_right=p.transpose_right)
    a, b = make_operands(g, bench.device)
    mp, kp, np_ = p.padded_dims()
    # A prepadded operand arrives already padded: its pad is done outside the timed function.
    a_in = pad_operand(a, mp, kp) if p.prepadded_left else a
    b_in = pad_operand(b, kp, np_) if p.prepadded_right else b

    def orig() -> torch.Tensor:
        return torch.mm(a, b)

    def padded() -> torch.Tensor:
        pa = a_in if p.prepadded_left else pad_operand(a, mp, kp)
        pb = b_in if p.prepadded_right else pad_operand(b, kp, np_)
        return torch.mm(pa, pb)[: p.m, : p.n]

    with cublas_tf32(p.allow_tf32):
        ref = orig().float()
        err = relative_error(padded(), ref, torch.linalg.vector_norm(ref)).item()  # also the warm-up
        orig()
        clocks: list[float | None] = []
        (orig_ms, n1), (pad_ms, n2) = bench.time_many([orig, padded], on_busy=lambda: clocks.append(clock.sm_clock_mhz()))
    frac = fraction_of_peak(g.flops, g.min_bytes, orig_ms, p.dtype, p.allow_tf32, spec, clocks[0])
    status, flag = validate(frac)
    # padding with zeros changes nothing mathematically; the check catches a wrong pad/slice
    if not err <= TOLERANCE[(p.dtype, p.allow_tf32)]:
        status = "fail:wrong_result"
    return {**p.as_dict(), "padded_m": mp, "padded_k": kp, "padded_n": np_, "orig_ms": round(orig_ms, 6),
            "padded_ms": round(pad_ms, 6), "reps": min(n1, n2), "rel_err": float(f"{err:.3g}"),
            "frac_peak": round(frac, 5), "status": status, "flag": flag, "sm_clock_mhz": clocks[0],
            "host_stalls": sum(bench.last_stalls)}


def run(out_dir: Path, n: int = 3200, seed: int = 0, spec_name: str | None = None, shard: tuple[int, int] = (0, 1),
        timing: TimingSettings = TimingSettings(), progress: bool = True, max_problems: int | None = None,
        n_large: int = 400, problem_spec: str | None = None) -> dict[str, Any]:
    from tqdm import tqdm

    from perfmodel.devices import ClockReader, get_spec

    from .kernel import kernel_mode, kernel_source_hash
    from .shards import ShardWriter

    spec, live = resolve_spec(spec_name)
    # The problem list's size budgets use a device's bandwidth and peak: problem_spec (by name) draws
    # another device's list, so a second GPU times the same problems.
    draw = get_spec(problem_spec) if problem_spec else spec
    header = device_header(live, spec) | {"schema_version": SCHEMA_VERSION, "kernel_hash": kernel_source_hash(),
                                          "kernel_mode": kernel_mode(),
                                          "sweep": {"seed": seed, "n": n, "n_large": n_large, "timing": vars(timing),
                                                    "problem_spec": draw.name}}
    problems = [p for j, p in enumerate(pad_problems(n, draw, seed, n_large=n_large)) if j % shard[1] == shard[0]]
    units = [problems[j:j + UNIT_SIZE] for j in range(0, len(problems), UNIT_SIZE)]
    writer = ShardWriter(out_dir, KIND, header, shard=f"{shard[0]:02d}of{shard[1]:02d}")
    device = torch.device("cuda", torch.cuda.current_device())
    bench = Bench(device, live.get("l2_bytes") or spec.l2_bytes, timing)
    clock = ClockReader(torch.cuda.current_device())
    stats = {"rows": 0, "ok_rows": 0, "wall_s": 0.0}
    t0 = time.perf_counter()
    todo = [u for u in units if f"pad-{pad_key(u[0])}" not in writer.done]
    if max_problems is not None:
        todo = todo[: max(1, max_problems // UNIT_SIZE)]
    with tqdm(total=sum(map(len, todo)), desc="pad sweep", unit="problem", disable=not progress) as bar, writer:
        for unit in todo:
            rows = []
            for p in unit:
                rows.append(measure(p, bench, spec, clock))
                bar.update(1)
            writer.write_unit(f"pad-{pad_key(unit[0])}", rows)
            stats["rows"] += len(rows)
            stats["ok_rows"] += sum(r["status"] == "ok" for r in rows)
    stats["wall_s"] = time.perf_counter() - t0
    return stats
