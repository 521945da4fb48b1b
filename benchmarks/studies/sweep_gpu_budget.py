"""GPU time of the GEMM sweep's timing protocol over a dataset's whole problem list, old and new (CPU).

AN ESTIMATE FROM THE RECORDED MEDIANS, NOT A MEASUREMENT: every run of a config is taken to last its
row's median `ms`, and a row's `reps` (runs in its median) to be the runs it got. Host time, compile
waits and the re-runs of stalled runs are left out (the stalled runs' share is printed apart). The
GPU run of `perfmodel gen gemm` measures the real throughput.

- old: per config a correctness launch (no flush, no spin), then `reps` timed runs, each behind an L2
  flush and the GPU spin: (reps + 1) * ms + reps * (flush + spin).
- new: the correctness launch is the first timed run: reps * (ms + flush + spin); a Triton config kept
  at its single run (data_gen.measure.slow_single_runs on the problem's medians: above slow_factor
  times the problem's fastest Triton config and above slow_min_ms; the sweep decides on first runs)
  costs ms + flush + spin.
- cuBLAS rows cost the same in both, (reps + 1) * ms + reps * (flush + spin): a warm-up/correctness
  call and its repetitions; printed apart and added in the last column.

A check of the old estimate against measured time: data/h100's parts p001-p003 are the sweep runs whose
statistics are benchmarks/results/fidelity/gemm_stats_part2.json, _part3.json and _part4.json. Their
measured timing_s (the timing loop's wall time: 123, 483, 188 s) against this script's old-protocol
estimate for the same parts (118, 449, 152 s): the estimate leaves out 4-19 % (host work, stalls).

    python -m benchmarks.studies.sweep_gpu_budget [--data data/h100] [--flush-ms 0.033] > benchmarks/results/sweep_gpu_budget.txt
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from perfmodel.data_gen.measure import TimingSettings, slow_single_runs
from perfmodel.data_gen.shards import part_files, read_dataset, read_part


def old_cost(ms: float, reps: int, overhead: float) -> float:
    return (reps + 1) * ms + reps * overhead


def new_costs(units: dict[str, list[dict]], timing: TimingSettings, overhead: float
              ) -> tuple[float, float, int]:
    """(GPU ms of the Triton rows, of those above 1 ms, Triton rows kept at one run) under the new protocol."""
    total = large = 0.0
    single_rows = 0
    for rows in units.values():
        single = slow_single_runs([r["ms"] for r in rows], [r["kind"] == "triton" for r in rows], timing)
        for r, one in zip(rows, single):
            if r["kind"] != "triton":
                continue
            cost = (1 if one else r["reps"]) * (r["ms"] + overhead)
            single_rows += one
            total += cost
            large += cost if r["ms"] > 1.0 else 0.0
    return total, large, single_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("data/h100"))
    ap.add_argument("--flush-ms", type=float, default=0.033, help="one L2 flush (Bench.flush_ms on the H100)")
    args = ap.parse_args()
    rows, headers = read_dataset(args.data, "gemm")
    recorded = headers[0]["sweep"]["timing"]
    spin = recorded["pre_sleep_us"] * 1e-3
    overhead = args.flush_ms + spin
    timed = [r for r in rows if r.get("ms") is not None and r.get("reps")]
    units: dict[str, list[dict]] = {}
    for r in timed:
        units.setdefault(r["unit"], []).append(r)
    n_triton = sum(r["kind"] == "triton" for r in timed)
    n_large = sum(r["kind"] == "triton" and r["ms"] > 1.0 for r in timed)

    triton = [r for r in timed if r["kind"] == "triton"]
    old = sum(old_cost(r["ms"], r["reps"], overhead) for r in triton)
    old_large = sum(old_cost(r["ms"], r["reps"], overhead) for r in triton if r["ms"] > 1.0)
    cublas = sum(old_cost(r["ms"], r["reps"], overhead) for r in timed if r["kind"] == "cublas")
    stalled = sum(r.get("host_stalls", 0) * (r["ms"] + overhead) for r in timed)
    print(f"dataset {args.data}: {len(units)} problems, {n_triton} timed Triton rows ({n_large} above 1 ms), "
          f"{len(timed) - n_triton} cuBLAS rows")
    print(f"per run: flush {args.flush_ms} ms + spin {spin} ms (the dataset's pre_sleep_us); "
          f"recorded timing settings {recorded}")
    print("ESTIMATE from the recorded medians (every run = its row's median), not a measurement; "
          "GPU time only, no host time or compile waits.\n")
    print(f"cuBLAS rows (the same in both protocols, in the last column only): {cublas / 1e3:.1f} s")
    print(f"stalled runs re-run (both protocols, left out of every column): {stalled / 1e3:.1f} s")
    print("\n| protocol | GPU s, Triton rows | of it rows > 1 ms | Triton rows at one run | Triton rows / GPU s "
          "| with cuBLAS's GPU s |")
    print("|---|---:|---:|---:|---:|---:|")

    def line(name: str, total: float, large: float, single: int) -> None:
        print(f"| {name} | {total / 1e3:.0f} | {large / 1e3:.0f} | {single} ({100 * single / n_triton:.1f} %) "
              f"| {n_triton / (total / 1e3):.0f} | {n_triton / ((total + cublas) / 1e3):.0f} |")

    line("old: correctness launch + first pass + repetitions", old, old_large, 0)
    default = TimingSettings()
    variants = [("new, first run folded, no slow rule", replace(default, slow_factor=None))]
    for factor in (4.0, 3.0, 2.0, 1.5):
        variants.append((f"new, slow_factor {factor:g}, slow_min_ms {default.slow_min_ms:g}",
                         replace(default, slow_factor=factor)))
    for floor in (0.25, 1.0):
        variants.append((f"new, slow_factor {default.slow_factor:g}, slow_min_ms {floor:g}",
                         replace(default, slow_min_ms=floor)))
    for name, timing in variants:
        line(name + (" (the default)" if timing == default else ""), *new_costs(units, timing, overhead))

    # Per part file (one sweep run each): the old estimate set beside the run's measured timing_s (its
    # --stats file) shows how much of the timing loop's time the estimate leaves out (host time).
    print("\n| part | problems | Triton rows | old GPU s, with cuBLAS | new (default), with cuBLAS |")
    print("|---|---:|---:|---:|---:|")
    for path in part_files(args.data, "gemm"):
        _, part_rows, done = read_part(path)
        part = {u: units[u] for u in done if u in units}
        n = sum(r["kind"] == "triton" for rs in part.values() for r in rs)
        old_part = sum(old_cost(r["ms"], r["reps"], overhead) for rs in part.values() for r in rs)
        new_part = new_costs(part, default, overhead)[0] + sum(
            old_cost(r["ms"], r["reps"], overhead) for rs in part.values() for r in rs if r["kind"] == "cublas")
        print(f"| {path.name} | {len(part)} | {n} | {old_part / 1e3:.0f} | {new_part / 1e3:.0f} |")


if __name__ == "__main__":
    main()
