"""GPU: does host launch latency leak into the timings? Side by side in one run.

Times tiny GEMMs (and one large control) with the sweep's Bench as the v1 dataset did (no pre-sleep)
and with a GPU spin before each timed run (pre_sleep_us), on an idle CPU and with the CPU saturated
by busy processes (as during the sweep's parallel compilation).
    python -m benchmarks.studies.launch_gap_check [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import torch

from perfmodel.data_gen import kernel
from perfmodel.data_gen.measure import Bench, TimingSettings
from perfmodel import GemmConfig

CASES = [((2, 256, 16), torch.bfloat16), ((1, 128, 128), torch.bfloat16), ((64, 64, 64), torch.float16),
         ((256, 192, 71), torch.float16), ((4096, 4096, 4096), torch.float16)]  # (M, N, K)
CFGS = [GemmConfig(32, 16, 16, 8, 4, 2), GemmConfig(32, 16, 32, 8, 1, 4), GemmConfig(64, 64, 32, 8, 3, 4),
        GemmConfig(128, 128, 64, 8, 3, 4)]


def _busy(stop) -> None:
    while not stop.is_set():
        pass


def measure(pre_sleep_us: float) -> list[dict]:
    dev = torch.device("cuda")
    bench = Bench(dev, torch.cuda.get_device_properties(0).L2_cache_size,
                  TimingSettings(budget_ms=0.6, pre_sleep_us=pre_sleep_us))
    out = []
    for (M, N, K), dt in CASES:
        a = torch.randn(M, K, device=dev, dtype=dt)
        b = torch.randn(K, N, device=dev, dtype=dt)
        c = torch.empty(M, N, device=dev, dtype=dt)
        fns = [lambda: torch.mm(a, b)] + [(lambda cfg=cfg: kernel.launch(a, b, c, cfg)) for cfg in CFGS]
        for f in fns:
            f()
        t = bench.time_many(fns)
        out.append({"M": M, "N": N, "K": K, "dtype": str(dt), "cublas_ms": t[0][0], "triton_ms": [x[0] for x in t[1:]]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--busy", type=int, default=(os.cpu_count() or 2) - 1)
    args = ap.parse_args()
    results = {}
    for load in ("idle", "busy"):
        stop, procs = mp.Event(), []
        if load == "busy":
            procs = [mp.Process(target=_busy, args=(stop,)) for _ in range(args.busy)]
            for p in procs:
                p.start()
            time.sleep(0.5)
        try:
            for sleep_us in (0.0, 100.0):
                results[f"{load}/pre_sleep_{sleep_us:g}us"] = measure(sleep_us)
        finally:
            stop.set()
            for p in procs:
                p.join()
    print("| M x N x K | dtype | setting | cuBLAS ms | Triton ms per config |")
    print("|---|---|---|---|---|")
    for i, ((M, N, K), dt) in enumerate(CASES):
        for key, res in results.items():
            r = res[i]
            tri = " ".join(f"{x:.4f}" for x in r["triton_ms"])
            print(f"| {M}x{N}x{K} | {str(dt).removeprefix('torch.')} | {key} | {r['cublas_ms']:.4f} | {tri} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
