"""The Inductor hook's cublas_margin on held-out problems (CPU): how often the Triton mm choices are
kept (each kept set costs compiles) and what dropping them costs in kernel time.

For each held-out problem of a dataset (the model's split) the hook drops every Triton choice when the
cuBLAS head's time x (1 + margin) is below the gemm head's best predicted Triton time; else autotuning
benchmarks cuBLAS and the model's top-k Triton configs and keeps the fastest. With the measured times of
cuBLAS and of the dataset's sampled configs (a stand-in for the configs Inductor offers), this reports per
margin the fraction of problems that keep Triton and the geomean of the chosen kernel's time over the
best measured (cuBLAS or any sampled config).

    python -m benchmarks.studies.cublas_margin [--model models/h100] [--data data/h100] [--top-k 5] [--kernel inductor]

--kernel inductor judges the hook as it runs under torch.compile: the Triton configs ranked with the
static head against their static times (the gemm_static rows, cuBLAS timed in the same run).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch


MARGINS = (-0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.5, None)  # None: never drop Triton


def main(argv: list[str] | None = None) -> int:
    from perfmodel import artifact
    from perfmodel.locations import default_data_dir, default_model_dir
    from perfmodel.serve.inductor import triton_dropped
    from perfmodel.train.data import load_device_dataset, split_problems
    from perfmodel.train.evaluate import head_outputs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=default_model_dir())
    ap.add_argument("--data", type=Path, default=default_data_dir())
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--kernel", choices=("autotune", "inductor"), default="autotune",
                    help="autotune: the dataset's times and the gemm head; inductor: static times and the static head")
    ap.add_argument("--out", type=Path, default=None, help="JSON result (default: print only)")
    args = ap.parse_args(argv)
    ds = load_device_dataset(args.data)
    bundle = artifact.load(args.model)
    bundle = bundle.for_device(ds.device if ds.device in bundle.devices else bundle.devices[0])
    seed = int(bundle.metadata.get("settings", {}).get("seed", 0))
    test = ds.gemm.subset(split_problems(ds.gemm.modes, seed) == 2)
    if args.kernel == "inductor":
        from perfmodel.train.static_head import load_static, split_static, static_outputs

        test = split_static(ds.gemm, load_static(args.data), split_problems(ds.gemm.modes, seed))
        pred = static_outputs(bundle, artifact.inductor_mode(bundle.heads), test)["log_ms"]
    else:
        P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
        _, pred = head_outputs(bundle.heads["gemm"], bundle.encoders["gemm"].encode(P, C))
    _, cub = head_outputs(bundle.heads["cublas"], bundle.encoders["cublas"].encode(torch.from_numpy(test.problems)))
    rows = test.problem_rows()
    ok = [i for i, r in enumerate(rows) if len(r) and np.isfinite(test.cublas_ms[i])]
    out = {"model": str(args.model), "data": str(args.data), "device": bundle.spec.name, "kernel": args.kernel,
           "problems": len(ok),
           "top_k": args.top_k, "margins": []}
    for m in MARGINS:
        kept, ratio, lost = 0, [], []
        for i in ok:
            r = rows[i]
            order = r[np.argsort(pred[r], kind="stable")]
            oracle = min(test.cublas_ms[i], test.ms[r].min())
            drop = triton_dropped(np.exp(cub[i]), np.exp(pred[order[0]]), m)
            chosen = test.cublas_ms[i] if drop else min(test.cublas_ms[i], test.ms[order[:args.top_k]].min())
            kept += not drop
            ratio.append(chosen / oracle)
            if drop and test.ms[r].min() < test.cublas_ms[i]:
                lost.append(test.cublas_ms[i] / test.ms[r].min())
        out["margins"].append({"margin": m, "keeps_triton": kept / len(ok),
                               "chosen_vs_best_geomean": float(np.exp(np.mean(np.log(ratio)))),
                               "worst": float(max(ratio)), "dropped_but_triton_faster": len(lost)})
    print(f"{out['problems']} held-out problems of {args.data} ({bundle.spec.name}), model {args.model}, top-{args.top_k}, "
          f"kernel {args.kernel}")
    print("| cublas_margin | keeps Triton | chosen / best (geomean) | worst | Triton dropped where faster |")
    print("|---|---:|---:|---:|---:|")
    for r in out["margins"]:
        m = "never drop" if r["margin"] is None else f"{r['margin']:g}"
        print(f"| {m} | {r['keeps_triton']:.3f} | {r['chosen_vs_best_geomean']:.4f} | {r['worst']:.3f} | "
              f"{r['dropped_but_triton_faster']} |")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
