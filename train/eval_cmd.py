"""`perfmodel eval`: the held-out evaluation table of a model folder, with baselines."""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.analytic import estimate_ms

from . import evaluate as ev
from .data import PadTable, load_gemm, load_pad, split_problems



def evaluate_bundle(bundle: artifact.ModelBundle, data, plots=None) -> dict:
    """The held-out metrics of a model folder (the test split of `data` by the model's split seed), with
    baselines. plots: a folder to write the held-out plots into (train/plots.py), or None."""
    seed = int(bundle.metadata.get("settings", {}).get("seed", 0))
    gemm = load_gemm(data)
    split = split_problems(gemm.modes, seed)
    test = gemm.subset(split == 2)
    P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
    with torch.inference_mode():
        x = bundle.encoders["gemm"].encode(P, C)
        score, pred = head_outputs(bundle.heads["gemm"], x)
        screen = head_outputs(bundle.heads["screen"], x)[0] if "screen" in bundle.heads else None
        keep = bundle.screen_keep
        results = {"perfmodel": ev.rank_path(test, pred, screen, keep, score)}
        if screen is not None:
            results["perfmodel, gemm head on every config"] = ev.summarize(test, pred, score)
            full_space = full_space_agreement(bundle, test, keep)
        if "PR 156851 model" in bundle.metadata.get("baselines", {}):
            results["PR 156851 model (training run)"] = bundle.metadata["baselines"]["PR 156851 model"]
        results["analytic (Triton-style)"] = ev.summarize(test, np.log(estimate_ms(P, C, bundle.spec).numpy()))
        results["random choice"] = ev.random_choice(test)
        d = ev.inductor_defaults(test)
        results["Inductor defaults, best measured"] = {k.replace("best_of_defaults_eff", "top1_eff"): v for k, v in d.items()}
        best_pred = np.full(len(test.problems), np.inf)
        np.minimum.at(best_pred, test.problem_idx, pred)
        cx = bundle.encoders["cublas"].encode(torch.from_numpy(test.problems))
        cmet = ev.cublas_metrics(test, bundle.heads["cublas"](cx).double().numpy(), best_pred)
        pmet = {}
        if "pad" in bundle.heads:
            pads = load_pad(data)
            ps = split_problems(pads.modes, seed) == 2
            pt = PadTable(pads.pads[ps], pads.orig_ms[ps], pads.padded_ms[ps], pads.modes[ps])
            px = bundle.encoders["pad"].encode_pad(torch.from_numpy(pt.pads))
            pmet = ev.pad_metrics(pt, bundle.heads["pad"](px).double().numpy(), bundle.pad_threshold)
        if screen is not None:
            cmet.update(full_space)
    if plots is not None:
        from .plots import model_plots

        rank_score = ev.screened(test, pred, screen, keep) if screen is not None else None
        model_plots(test, pred, plots, rank_score, results)
    return {"results": results, "cublas": cmet, "pad": pmet, "test_problems": int(len(test.problems))}


def full_space_agreement(bundle: artifact.ModelBundle, test, keep: int) -> dict[str, float]:
    """Over each test problem's whole pruned config space (1,199-1,431 configs, most never measured):
    the gemm head's predicted time of its own best config / of the rank path's pick (screen, then the
    gemm head on the screen's best `keep`). 1.0 = the screen never costs the rank path anything, in the
    gemm head's own terms; measured efficiency on the space is not available."""
    from perfmodel.configs import pruned_space
    from perfmodel.features import configs_tensor

    enc, gemm, screen = bundle.encoders["gemm"], bundle.heads["gemm"], bundle.heads["screen"]
    ratios = []
    spaces = {}
    for prob, mode in zip(test.problems, test.modes):
        dtype = "float32" if mode == "tf32" else str(mode)
        if dtype not in spaces:
            spaces[dtype] = configs_tensor(pruned_space(dtype, bundle.spec))
        ct = spaces[dtype]
        x = enc.encode_cross(torch.from_numpy(prob[None, :]), ct)
        (z, g), s = head_outputs(gemm, x), head_outputs(screen, x)[0]
        best = ev.rank_rows(z, g, None, keep, 1)[1][0]           # the gemm head on every config
        pick = ev.rank_rows(z, g, s, keep, 1)[1][0]              # the rank path
        ratios.append(np.exp(best - pick))
    r = np.asarray(ratios)
    return {"screen/full_space_top1_vs_gemm_head": float(np.exp(np.log(r).mean())),
            "screen/full_space_worst": float(r.min()), "screen/full_space_same_pick": float((r == 1.0).mean())}


def head_outputs(head, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(score, log ms) of a head on rows x, float64 (PerfMLP.score: what ranking sorts by)."""
    with torch.inference_mode():
        z = head.score(x)
        return z.double().numpy(), head.floor(z, x).double().numpy()


def run_eval(args: argparse.Namespace) -> int:
    bundle = artifact.load(args.model)
    out = evaluate_bundle(bundle, args.data, args.plots)
    if args.log_mlflow:
        import mlflow

        from .pipeline import DEFAULT_TRACKING_URI, _mlflow_key
        import os

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
