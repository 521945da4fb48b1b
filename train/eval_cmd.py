"""`perfmodel eval`: the held-out evaluation table of a model folder, with baselines (the evaluation
itself is train/evaluate.py's evaluate_bundle, the one `perfmodel train` runs too)."""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from perfmodel import artifact

from . import evaluate as ev


def run_eval(args: argparse.Namespace) -> int:
    bundle = artifact.load(args.model)
    out = ev.evaluate_bundle(bundle, args.data, plots=args.plots)
    if args.log_mlflow:
        import mlflow

        import os

        from .pipeline import DEFAULT_TRACKING_URI, _mlflow_key

        mlflow.set_tracking_uri(args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)
        mlflow.set_experiment("perfmodel-eval")
        with mlflow.start_run(run_name="eval"):
            flat = {f"{m}/{k}": v for m, mm in out["results"].items() for k, v in mm.items()}
            mlflow.log_metrics({_mlflow_key(k): float(v) for k, v in {**flat, **out["cublas"], **out["pad"]}.items()
                                if v is not None and np.isfinite(v)})
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"Held-out problems: {out['test_problems']} (split seed from the model's metadata)\n")
    print(ev.format_table(out["results"], ev.TABLE_KEYS))
    print()
    for k, v in {**out["cublas"], **out["pad"]}.items():
        print(f"{k:32s} {v:.4f}")
    return 0
