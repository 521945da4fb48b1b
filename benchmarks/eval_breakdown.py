"""Held-out efficiency of a model folder, broken down by what limits it: tiny (launch-bound) problems
and the NN layout (measured with kernel v1, see README).
    python benchmarks/eval_breakdown.py [--model models/h100] [--data data/h100]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from perfmodel.artifact import load  # noqa: E402
from perfmodel.locations import default_data_dir, default_model_dir  # noqa: E402
from perfmodel.train import evaluate as ev  # noqa: E402
from perfmodel.train.data import load_gemm, split_problems  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=default_model_dir())
    ap.add_argument("--data", type=Path, default=default_data_dir())
    ap.add_argument("--tiny-ms", type=float, default=0.01, help="'tiny': best measured config under this")
    args = ap.parse_args()
    bundle = load(args.model)
    gemm = load_gemm(args.data)
    test = gemm.subset(split_problems(gemm.modes, int(bundle.metadata.get("settings", {}).get("seed", 0))) == 2)
    with torch.inference_mode():
        x = bundle.encoders["gemm"].encode(torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs))
        pred = bundle.heads["gemm"](x).double().numpy()
    pp = ev.per_problem(test, pred)
    best = np.full(len(test.problems), np.inf)
    np.minimum.at(best, test.problem_idx, test.ms)
    nn = (test.problems[:, 6] == 0) & (test.problems[:, 7] == 0)
    tiny = best < args.tiny_ms
    groups = {"all": np.ones(len(best), bool), f"best < {args.tiny_ms * 1e3:g} us": tiny,
              f"best >= {args.tiny_ms * 1e3:g} us": ~tiny, "NN layout": nn, "NT layout": ~nn,
              "NT, not tiny": ~nn & ~tiny}
    for mode in ("float16", "bfloat16", "tf32", "float32"):
        groups[f"{mode}, NT, not tiny"] = (test.modes == mode) & ~nn & ~tiny
    print("| held-out problems | n | top-1 | top-5 |\n|---|---:|---:|---:|")
    for name, mask in groups.items():
        if mask.any():
            t1, t5 = (float(np.exp(np.log(pp[k][mask]).mean())) for k in ("top1", "top5"))
            print(f"| {name} | {int(mask.sum())} | {t1:.3f} | {t5:.3f} |")


if __name__ == "__main__":
    main()
