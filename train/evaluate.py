"""Evaluation of a model on held-out problems: its heads' outputs, then train/metrics.py's figures."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from perfmodel import artifact

from .data import GemmTable, PadTable
from .folder import TABLE_KEYS, format_table  # noqa: F401  (the evaluation table, re-exported)
from .metrics import (MODES, _geomean, _spearman, cublas_metrics, inductor_defaults, pad_metrics,  # noqa: F401
                      per_problem, random_choice, rank_path, rank_rows, screened, summarize, worst_problems)


ScoreFn = Callable[[GemmTable], np.ndarray]


def evaluate_bundle(bundle, data, *, seed: int | None = None,
                    baselines: dict[str, tuple] | None = None, plots=None, full_space: bool = True,
                    split: np.ndarray | None = None, pad_split: np.ndarray | None = None) -> dict:
    """The held-out metrics of a model (its heads on the test split of `data`), with baselines: the one
    evaluation that `perfmodel train` (before writing the folder) and `perfmodel eval` (on a folder) run.

    data: the dataset folder, or its loaded (GemmTable, PadTable). seed: the split seed (default: the
    model's metadata, settings.seed). baselines: {name: (head, encoder)} of trained baselines to evaluate
    alike; None: the baselines recorded in the model's metadata at training ("... (training run)").
    plots: a folder to write the held-out plots into (train/plots.py), or None. full_space: also the
    screen's agreement over each test problem's whole config space (the slowest part).
    The bundle encodes for its own spec: for a model of several devices pass bundle.for_device(the data's).
    split / pad_split: the split of the data's problems / pad rows (2 = test) when it is not
    split_problems(modes, seed) -- a later device's of a joint split (train/data.py joint_split).
    Returns {"results": {method: metrics}, "cublas": ..., "pad": ..., "test_problems": n}."""
    from perfmodel.analytic import estimate_ms

    from .data import load_gemm, load_pad, split_problems

    if seed is None:
        seed = int(bundle.metadata.get("settings", {}).get("seed", 0))
    gemm, pads = data if isinstance(data, tuple) else (load_gemm(data), None)
    split = split_problems(gemm.modes, seed) if split is None else split
    test = gemm.subset(split == 2)
    P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
    with torch.inference_mode():
        x = bundle.encoders["gemm"].encode(P, C)
        score, pred = head_outputs(bundle.heads["gemm"], x)
        screen = head_outputs(bundle.heads[bundle.screen_name], x)[0] if bundle.screen_name else None
        keep, lead_keep = bundle.screen_keep, bundle.lead_keep
        lead = lead_outputs(bundle.heads["gemm"], x) if lead_keep else None
        results = {"perfmodel": rank_path(test, pred, screen, keep, score, lead, lead_keep)}
        full_space = full_space_agreement(bundle, test, keep) if screen is not None and full_space else {}
        if screen is not None:
            results["perfmodel, gemm head on every config"] = summarize(test, pred, score)
        if baselines is None:
            if "PR 156851 model" in bundle.metadata.get("baselines", {}):
                results["PR 156851 model (training run)"] = bundle.metadata["baselines"]["PR 156851 model"]
        else:
            for name, (head, enc) in baselines.items():
                results[name] = summarize(test, head.eval()(enc.encode(P, C)).double().numpy())
        results["analytic (Triton-style)"] = summarize(test, np.log(estimate_ms(P, C, bundle.spec).numpy()))
        results["random choice"] = random_choice(test)
        d = inductor_defaults(test)
        results["Inductor defaults, best measured"] = {k.replace("best_of_defaults_eff", "top1_eff"): v for k, v in d.items()}
        best_pred = np.full(len(test.problems), np.inf)
        np.minimum.at(best_pred, test.problem_idx, pred)
        cx = bundle.encoders["cublas"].encode(torch.from_numpy(test.problems))
        call = artifact.problem_output(bundle, artifact.CALL)
        cmet = cublas_metrics(test, artifact.problem_output(bundle, "cublas").eval()(cx).double().numpy(), best_pred,
                              None if call is None else call.eval().score(cx).double().numpy())
        pmet = {}
        if "pad" in bundle.heads:
            pads = pads if pads is not None else load_pad(data)
            ps = (split_problems(pads.modes, seed) if pad_split is None else pad_split) == 2
            pt = PadTable(pads.pads[ps], pads.orig_ms[ps], pads.padded_ms[ps], pads.modes[ps])
            px = bundle.encoders["pad"].encode_pad(torch.from_numpy(pt.pads))
            pmet = pad_metrics(pt, bundle.heads["pad"].eval()(px).double().numpy(), bundle.pad_threshold)
        if screen is not None:
            cmet.update(full_space)
    if plots is not None:
        from .plots import model_plots

        rank_score = screened(test, score, pred, screen, keep, lead, lead_keep) if screen is not None else None
        model_plots(test, pred, plots, rank_score, results)
    return {"results": results, "cublas": cmet, "pad": pmet, "test_problems": int(len(test.problems))}


def full_space_agreement(bundle: artifact.ModelBundle, test, keep: int) -> dict[str, float]:
    """Over each test problem's whole pruned config space (1,199-1,431 configs, most never measured):
    the gemm head's predicted time of its own best config / of the rank path's pick (screen, then the
    gemm head on the screen's best `keep`). 1.0 = the screen never costs the rank path anything, in the
    gemm head's own terms; measured efficiency on the space is not available."""
    from perfmodel.configs import pruned_space
    from perfmodel.features import configs_tensor

    enc, gemm, screen = bundle.encoders["gemm"], bundle.heads["gemm"], bundle.heads[bundle.screen_name]
    lead_keep = bundle.lead_keep
    ratios = []
    spaces = {}
    for prob, mode in zip(test.problems, test.modes):
        dtype = "float32" if mode == "tf32" else str(mode)
        if dtype not in spaces:
            spaces[dtype] = configs_tensor(pruned_space(dtype, bundle.spec))
        ct = spaces[dtype]
        x = enc.encode_cross(torch.from_numpy(prob[None, :]), ct)
        (z, g), s = head_outputs(gemm, x), head_outputs(screen, x)[0]
        best = rank_rows(z, g, None, keep, 1)[1][0]           # the gemm head on every config
        lead = lead_outputs(gemm, x) if lead_keep else None
        pick = rank_rows(z, g, s, keep, 1, lead, lead_keep)[1][0]   # the rank path
        ratios.append(np.exp(best - pick))
    r = np.asarray(ratios)
    return {"screen/full_space_top1_vs_gemm_head": float(np.exp(np.log(r).mean())),
            "screen/full_space_worst": float(r.min()), "screen/full_space_same_pick": float((r == 1.0).mean())}


def lead_outputs(head, x: torch.Tensor) -> np.ndarray:
    """The lead member's score per row of an ensemble head (PerfMLP.lead_score), float64."""
    with torch.inference_mode():
        return head.lead_score(x)[0].double().numpy()


def head_outputs(head, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(score, log ms) of a head on rows x, float64 (PerfMLP.score: what ranking sorts by)."""
    with torch.inference_mode():
        z = head.score(x)
        return z.double().numpy(), head.floor(z, x).double().numpy()
