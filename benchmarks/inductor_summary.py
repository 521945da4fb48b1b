"""Combine several `inductor_bench.py` runs (H100 JSON files) into one table (CPU; reads the files).

    python -m benchmarks.inductor_summary --stock RUN.json ... --ours RUN.json ...

Stock rows are read from the --stock files, the hook variants' rows from the --ours files (a file in
both lists also gives same-run pairs), so that runs of another model can be left out.

Besides the whole compile, each variant's tuning is summed two ways: the GEMM tuning (Inductor's timers
around precompiling and benchmarking template choices, plus pad_mm's decision; `gemm_tuning_s`), and all
the autotuning in the compile: that, plus the coordinate-descent tuning and config benchmarking of the
pointwise and reduction kernels (`CachingAutotuner.*` timers), which max-autotune also runs and the hook
does not touch.

Stock max-autotune's own choice moves between runs (its in-process benchmark of ~10-30 us kernels),
so each variant is compared with stock in the same run and with the best stock run of that shape.
A variant's error or timeout on a shape leaves that run out for that shape.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--stock", nargs="+", required=True)
    ap.add_argument("--ours", nargs="+", required=True)
    args = ap.parse_args(argv)
    runs = []  # (run label, variant, {shape: row})
    for p in dict.fromkeys(args.stock + args.ours):
        res = json.loads(Path(p).read_text())
        for v in res["variants"]:
            is_stock = v["variant"] == "stock"
            if p not in (args.stock if is_stock else args.ours):
                continue
            runs.append((Path(p).stem, v["variant"], {r["name"]: r for r in v.get("shapes", []) if "kernel_ms" in r}))
    shapes: list[str] = []
    for _, _, rows in runs:
        shapes += [s for s in rows if s not in shapes]
    kernel = defaultdict(list)   # (variant, shape) -> [ms per run]
    compile_ = defaultdict(list)
    tuning = defaultdict(list)    # (variant, shape) -> [(GEMM tuning s, all autotuning s) per run]
    stock_by_run = {label: rows for label, v, rows in runs if v == "stock"}
    same_run = defaultdict(list)  # variant -> [stock ms / variant ms] for shapes in a run with both
    for label, v, rows in runs:
        for s, r in rows.items():
            kernel[v, s].append(r["kernel_ms"])
            compile_[v, s].append(r["compile_s"])
            if "gemm_tuning_s" in r:
                timers = r.get("timers", {})
                tuning[v, s].append((r["gemm_tuning_s"], r["gemm_tuning_s"] + sum(
                    timers.get(k, 0.0) for k in ("CachingAutotuner.coordinate_descent_tuning",
                                                 "CachingAutotuner.benchmark_all_configs"))))
            if v != "stock" and s in stock_by_run.get(label, {}):
                same_run[v].append(stock_by_run[label][s]["kernel_ms"] / r["kernel_ms"])
    variants = [v for v in ("stock", "perfmodel", "perfmodel-cublas", "perfmodel-pad") if any(k[0] == v for k in kernel)]
    print("| shape | " + " | ".join(f"{v} kernel ms (runs)" for v in variants) + " | "
          + " | ".join(f"{v} compile s (mean)" for v in variants) + " |")
    print("|---|" + "---|" * (2 * len(variants)))
    for s in shapes:
        ks = [" / ".join(f"{x:.4f}" for x in kernel[v, s]) or "-" for v in variants]
        cs = [f"{sum(compile_[v, s]) / len(compile_[v, s]):.1f}" if compile_[v, s] else "-" for v in variants]
        print(f"| {s} | " + " | ".join(ks) + " | " + " | ".join(cs) + " |")
    print()
    stock_compile = [sum(compile_["stock", s]) / len(compile_["stock", s]) for s in shapes if compile_["stock", s]]
    for v in variants:
        speed_best = [min(kernel["stock", s]) / (sum(kernel[v, s]) / len(kernel[v, s]))
                      for s in shapes if kernel[v, s] and kernel["stock", s]]
        speed_med = [statistics.median(kernel["stock", s]) / (sum(kernel[v, s]) / len(kernel[v, s]))
                     for s in shapes if kernel[v, s] and kernel["stock", s]]
        comp = sum(sum(compile_[v, s]) / len(compile_[v, s]) for s in shapes if compile_[v, s] and compile_["stock", s])
        n = sum(1 for s in shapes if kernel[v, s])
        line = (f"- {v}: {n} shapes, {sum(len(kernel[v, s]) for s in shapes)} shape-runs; mean compile over shapes "
                f"{comp:.1f} s (stock {sum(stock_compile):.1f} s: {sum(stock_compile) / comp:.1f}x less)")
        if v != "stock":
            if same_run[v]:
                line += (f"; kernel speed vs stock in the same run: geomean {geomean(same_run[v]):.3f}, worst "
                         f"{min(same_run[v]):.3f} over {len(same_run[v])} pairs")
            line += (f"; vs the best stock run of each shape: geomean {geomean(speed_best):.3f}, "
                     f"worst {min(speed_best):.3f}; vs the median stock run: geomean {geomean(speed_med):.3f}")
        else:
            spread = [max(kernel["stock", s]) / min(kernel["stock", s]) for s in shapes if len(kernel["stock", s]) > 1]
            if spread:  # a shape with more than one stock run
                line += f"; slowest/fastest stock run of a shape: geomean {geomean(spread):.3f}, worst {max(spread):.3f}"
        print(line)
    both = [s for s in shapes if all(tuning[v, s] for v in variants)]
    if both and len(variants) > 1:
        def total(v: str, i: int) -> float:
            return sum(sum(t[i] for t in tuning[v, s]) / len(tuning[v, s]) for s in both)

        for v in variants[1:]:
            print(f"- {v} against stock, {len(both)} shapes (mean over runs): GEMM tuning {total('stock', 0):.1f} -> "
                  f"{total(v, 0):.1f} s ({total('stock', 0) / max(total(v, 0), 1e-9):.1f}x less); all autotuning in "
                  f"the compile {total('stock', 1):.1f} -> {total(v, 1):.1f} s "
                  f"({total('stock', 1) / max(total(v, 1), 1e-9):.1f}x less)")


if __name__ == "__main__":
    main()
