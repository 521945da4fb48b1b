"""How far the student (what `predict` served before issue 47; now the screen of rank(screened=True)) is from the measured times,
beside the gemm head, on the held-out problems of a model's split (CPU).

    python -m benchmarks.studies.student_fidelity --model models/h100 [--model <another folder>] [--data data/h100]

Prints, per folder and head, the MAPE and the median within-problem Spearman against the measured times of
the held-out (test) problems of the model's own split (by problem, or by family where it was trained so):
the same figures `perfmodel eval` gives the gemm head ("all/mape").
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from perfmodel import artifact
from perfmodel.train.data import load_device_datasets
from perfmodel.train.evaluate import summarize
from perfmodel.train.refit import model_splits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, action="append", required=True, help="model folder (repeatable)")
    ap.add_argument("--data", type=Path, default=Path("data/h100"), help="the models' dataset (their split)")
    args = ap.parse_args(argv)
    datasets = load_device_datasets([args.data])
    for folder in args.model:
        b = artifact.load(folder)
        test = datasets[0].gemm.subset(model_splits(b, datasets)[0] == 2)
        P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
        with torch.inference_mode():
            x = b.encoders["gemm"].encode(P, C)
            for name in ("gemm", artifact.STUDENT):
                if name not in b.heads:
                    continue
                s = summarize(test, b.heads[name](x).double().numpy())
                print(f"{folder} {name} {'x'.join(map(str, b.heads[name].cfg.hidden))}: MAPE {s['all/mape']:.4f}, "
                      f"median Spearman {s['all/spearman_median']:.4f} ({len(test.problems)} test problems)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
