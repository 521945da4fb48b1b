"""GPU: what do_not_specialize=["M", "N"] costs the dataset's kernel, side by side in one run.

The sweep's kernel leaves M and N unspecialised (one compile serves every M, N). This times it next to
the same source compiled with Triton's default specialisation (M, N divisible by 16 known to the
compiler: vectorised masked stores), for a few configs on seed-table and square shapes, both layouts,
fp16, plus torch.mm.
    python benchmarks/specialization_check.py [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from perfmodel.data_gen import kernel  # noqa: E402
from perfmodel.data_gen.measure import Bench, TimingSettings  # noqa: E402
from perfmodel import GemmConfig  # noqa: E402

SHAPES = [(2048, 768, 3072), (2048, 3072, 768), (1024, 768, 2304), (4096, 4096, 4096)]  # (M, K, N)
CONFIGS = [GemmConfig(128, 128, 32, 8, 3, 4), GemmConfig(128, 128, 64, 8, 3, 4), GemmConfig(64, 128, 64, 8, 3, 4),
           GemmConfig(128, 256, 64, 8, 3, 8), GemmConfig(128, 128, 64, 8, 4, 8)]
specialised = triton.jit(kernel.matmul_kernel.fn)  # same source, default specialisation


def launch(fn, a, b, c, cfg) -> None:
    kernel.launch(a, b, c, cfg, kernel=fn)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    bench = Bench(dev, torch.cuda.get_device_properties(0).L2_cache_size, TimingSettings(budget_ms=2.0, min_reps=10))
    rows = []
    print("| M | K | N | layout | dataset kernel best ms | specialised best ms | torch.mm ms | ratio | per config (dataset/specialised) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for M, K, N in SHAPES:
        for tr in (False, True):
            a = torch.randn(M, K, device=dev, dtype=torch.float16)
            b = torch.randn(N, K, device=dev, dtype=torch.float16).t() if tr else torch.randn(K, N, device=dev, dtype=torch.float16)
            ref = (a.double() @ b.double()).float()
            c = torch.empty(M, N, device=dev, dtype=torch.float16)
            fns = []
            for cfg in CONFIGS:
                for fn in (kernel.matmul_kernel, specialised):
                    c.fill_(float("nan"))
                    launch(fn, a, b, c, cfg)
                    err = ((c.float() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        raise SystemExit(f"wrong result {err} for {cfg}")
                    fns.append(lambda fn=fn, cfg=cfg: launch(fn, a, b, c, cfg))
            t = [x[0] for x in bench.time_many([lambda: torch.mm(a, b)] + fns)]
            ds, sp = t[1::2], t[2::2]
            rows.append({"M": M, "K": K, "N": N, "transpose_right": tr, "dataset_ms": ds, "specialised_ms": sp,
                         "cublas_ms": t[0], "configs": [c.as_dict() for c in CONFIGS]})
            per = " ".join(f"{x / y:.2f}" for x, y in zip(ds, sp))
            print(f"| {M} | {K} | {N} | {'NT' if tr else 'NN'} | {min(ds):.4f} | {min(sp):.4f} | {t[0]:.4f} | "
                  f"{min(ds) / min(sp):.2f} | {per} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
