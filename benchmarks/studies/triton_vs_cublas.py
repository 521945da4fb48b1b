"""Best measured Triton config vs cuBLAS (torch.mm), in TFLOP/s, for problems of the shipped dataset.

Both from the same GPU and dataset: Triton from the sweep, cuBLAS from its quiet re-time (`gen cublas`).
    python -m benchmarks.studies.triton_vs_cublas [--data data/h100] [--all]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from perfmodel.data_gen.problems import SEED_SHAPES
from perfmodel.locations import default_data_dir
from perfmodel.train.data import load_gemm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=default_data_dir())
    ap.add_argument("--all", action="store_true", help="every problem, not the seed-table and LLM samples")
    args = ap.parse_args()
    g = load_gemm(args.data)
    best = np.full(len(g.problems), np.inf)
    np.minimum.at(best, g.problem_idx, g.ms)
    seed = {(m, k, n) for m, k, n in SEED_SHAPES}
    print("| M | N | K | mode | layout | best Triton ms | TFLOP/s | cuBLAS ms | TFLOP/s | cuBLAS/Triton time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for i, (m, n, k, _, _, _, tl, tr) in enumerate(g.problems):
        m, n, k = int(m), int(n), int(k)
        pick = args.all or (m, k, n) in seed or (m in (16, 4096) and k in (4096, 8192) and n in (4096, 6144, 8192))
        if pick and np.isfinite(g.cublas_ms[i]):
            rows.append((g.modes[i], m, n, k, tl, tr, best[i], g.cublas_ms[i]))
    for mode, m, n, k, tl, tr, t, c in sorted(rows, key=lambda r: (r[0], r[1] * r[2] * r[3])):
        fl = 2 * m * n * k
        lay = ("T" if tl else "N") + ("T" if tr else "N")
        print(f"| {m} | {n} | {k} | {mode} | {lay} | {t:.4f} | {fl / t / 1e9:.0f} | {c:.4f} | {fl / c / 1e9:.0f} | {c / t:.2f} |")
    ratio = g.cublas_ms / best
    print(f"\nAll {len(best)} problems: cuBLAS faster than the best measured Triton config on "
          f"{(ratio < 1).mean():.0%}; median cuBLAS/Triton time {np.nanmedian(ratio):.2f}.")
    for mode in np.unique(g.modes):
        mk = g.modes == mode
        print(f"  {mode:9s} problems {mk.sum():4d}  cuBLAS faster on {(ratio[mk] < 1).mean():.0%}  "
              f"median ratio {np.nanmedian(ratio[mk]):.2f}")


if __name__ == "__main__":
    main()
