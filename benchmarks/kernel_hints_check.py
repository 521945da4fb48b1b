"""GPU: the NN-layout effect of kernel v2's contiguity hints, side by side in one run.

For seed-table shapes in the NN layout (B row-major), times the kernel with the hints off (as the
shipped v1 dataset measured it) and on (v2), for a handful of configs, plus cuBLAS.
    python benchmarks/kernel_hints_check.py [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from perfmodel.data_gen import kernel  # noqa: E402
from perfmodel.data_gen.measure import Bench, TimingSettings  # noqa: E402
from perfmodel import GemmConfig  # noqa: E402

SHAPES = [(2048, 768, 3072), (2048, 3072, 768), (1024, 768, 768), (4096, 4096, 4096)]  # (M, K, N)
CONFIGS = [GemmConfig(128, 128, 64, 8, 3, 4), GemmConfig(128, 128, 64, 8, 4, 8), GemmConfig(128, 256, 64, 8, 3, 8),
           GemmConfig(64, 128, 64, 8, 4, 4), GemmConfig(128, 64, 64, 8, 4, 4), GemmConfig(256, 128, 64, 8, 3, 8)]


def launch(a, b, c, cfg, hints: bool) -> None:
    kernel.launch(a, b, c, cfg, hints=hints)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    bench = Bench(dev, torch.cuda.get_device_properties(0).L2_cache_size, TimingSettings(budget_ms=2.0, min_reps=10))
    rows = []
    print("| M | N | K | best v1 (no hints) ms | best v2 ms | cuBLAS ms | v1/v2 |")
    print("|---|---|---|---|---|---|---|")
    for M, K, N in SHAPES:
        a = torch.randn(M, K, device=dev, dtype=torch.float16)
        b = torch.randn(K, N, device=dev, dtype=torch.float16)
        ref = (a.double() @ b.double()).float()
        c = torch.empty(M, N, device=dev, dtype=torch.float16)
        fns = {}
        for cfg in CONFIGS:
            for hints in (False, True):
                c.fill_(float("nan"))
                launch(a, b, c, cfg, hints)
                err = ((c.float() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    raise SystemExit(f"wrong result {err} for {cfg} hints={hints}")
                fns[(cfg, hints)] = (lambda cfg=cfg, hints=hints: launch(a, b, c, cfg, hints))
        keys = list(fns)
        times = bench.time_many([lambda: torch.mm(a, b)] + [fns[k] for k in keys])
        cub = times[0][0]
        v1 = min(t for (k, (t, _)) in zip(keys, times[1:]) if not k[1])
        v2 = min(t for (k, (t, _)) in zip(keys, times[1:]) if k[1])
        rows.append({"M": M, "N": N, "K": K, "v1_ms": v1, "v2_ms": v2, "cublas_ms": cub})
        print(f"| {M} | {N} | {K} | {v1:.4f} | {v2:.4f} | {cub:.4f} | {v1 / v2:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
