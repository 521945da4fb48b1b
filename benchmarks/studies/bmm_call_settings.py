"""The bmm call head's settings (CPU): 5-fold cross-validation by shape and the val split's accuracy of the
aten-or-Triton call for a few settings of the call head alone, on a model folder's bmm split.

    python -m benchmarks.studies.bmm_call_settings [SETTING ...]      # default: every setting below

Each trial fits the call head (train/bmm_head.py fit_call, the folder's [bmm] settings but for the one changed)
on the other folds' problems for each fold, and on the train split for the val and test figures (settings are
chosen on val). docs/model.md ("Batched GEMMs") has the results.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from perfmodel.train.bmm_head import (BmmHeadSettings, call_targets, encode, fit_call, load_bmm, score, shape_folds,
                                      split_by_shape)
from perfmodel.train.loop import fit_ensemble
from perfmodel.train.refit import load_model, model_seed

TRIALS = {"default": {}, "h128x2": {"call_hidden": (128, 128)}, "h128x3": {"call_hidden": (128, 128, 128)},
          "ep800": {"call_epochs": 800}, "ep200": {"call_epochs": 200}, "wd1e-3": {"weight_decay": 1e-3},
          "huber0.01": {"huber_beta": 0.01}, "lr1e-3": {"lr": 1e-3}}


def _fit(xa: torch.Tensor, yc: np.ndarray, rows: np.ndarray, s: BmmHeadSettings):
    tr = torch.from_numpy(rows)
    return fit_ensemble(lambda i: fit_call(xa[tr], torch.from_numpy(yc).float()[tr], s, s.seed + i),
                        s.call_members, "before_floor", single_as_is=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("settings", nargs="*", help=f"trials to run, of {', '.join(TRIALS)} (default: all)")
    ap.add_argument("--model", type=Path, default=Path("models/h100"))
    ap.add_argument("--data", type=Path, default=Path("data/h100"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    bad = [n for n in args.settings if n not in TRIALS]
    if bad:
        ap.error(f"settings: unknown {bad}; choose from {', '.join(TRIALS)}")
    bundle = load_model(args.model, args.threads)
    t = load_bmm(args.data)
    _, xa = encode(t, bundle.spec, bundle.encoders["gemm"].version)
    ok, yc = call_targets(t)
    truth = yc < 0  # aten::bmm measured faster than the best config (where ok; nan elsewhere, never used)
    fold, split = shape_folds(t, 5, model_seed(bundle)), split_by_shape(t, model_seed(bundle))
    for name in args.settings or list(TRIALS):
        s, t0 = replace(BmmHeadSettings(), **TRIALS[name]), time.perf_counter()
        cv = np.zeros(len(t.problems))
        for f in range(5):
            cv[fold == f] = score(_fit(xa, yc, ok & (fold != f), s), xa[torch.from_numpy(fold == f)])
        fitted = score(_fit(xa, yc, ok & (split == 0), s), xa)
        right_cv, right = (cv < 0) == truth, (fitted < 0) == truth
        print(f"{name:10s} cv call {right_cv[ok].mean():.4f}  val {right[ok & (split == 1)].mean():.4f}  "
              f"test {right[ok & (split == 2)].mean():.4f}  |log err| cv {np.abs(cv - yc)[ok].mean():.4f}  "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
