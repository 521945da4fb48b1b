"""The bmm heads' held-out figures (train/bmm_head.py): per problem top-1 / top-5 efficiency, per dtype mode and
family, the aten-or-Triton call, and the mm heads' zero-shot figures on one matrix."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from perfmodel import artifact

from .bmm_data import BmmTable

MODES = ("float16", "bfloat16", "tf32", "float32")  # the dtype modes the figures are given per


def problem_figures(table: BmmTable, pred: np.ndarray, pred_aten: np.ndarray,
                    rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per problem of table: top-1 and top-5 efficiency of the ranking by pred (over the rows `rows`, a bool
    mask of the Triton rows; default all), the call by the times (aten predicted below the predicted best
    config's time) and its truth (aten measured below the best measured config). nan where a problem has no
    such row."""
    n = len(table.problems)
    top1, top5 = np.full(n, np.nan), np.full(n, np.nan)
    best_pred, best_true = np.full(n, np.inf), np.full(n, np.inf)
    sel = np.ones(len(table.ms), bool) if rows is None else rows
    order = np.lexsort((pred, table.problem_idx))                      # by problem, then predicted time
    order = order[sel[order]]
    starts = np.flatnonzero(np.r_[True, table.problem_idx[order][1:] != table.problem_idx[order][:-1]])
    for a, b in zip(starts, np.r_[starts[1:], len(order)]):
        rows_p = order[a:b]
        i = table.problem_idx[rows_p[0]]
        t = table.ms[rows_p]
        best_true[i], best_pred[i] = t.min(), pred[rows_p[0]]
        top1[i], top5[i] = t.min() / t[0], t.min() / t[:5].min()
    call_ok = np.isfinite(table.aten_ms) & np.isfinite(best_true)
    return {"top1": top1, "top5": top5, "call": pred_aten < best_pred, "truth": table.aten_ms < best_true,
            "call_ok": call_ok}


def _geomean(v: np.ndarray) -> float:
    return float(np.exp(np.log(v).mean()))


def bmm_metrics(table: BmmTable, split: np.ndarray, pred: np.ndarray, pred_aten: np.ndarray,
                pred_call: np.ndarray) -> dict[str, Any]:
    """Figures per split (train, val, test) of the heads' log ms pred (Triton rows) and pred_aten (problems)
    and the call head's output pred_call (problems): top-1 / top-5 efficiency over each problem's timed
    configs (all, per dtype mode, per family; `inductor_list/`: over Inductor's DEFAULT list alone, against
    its own best), the aten-or-Triton call by the call head (`call/accuracy`, per family too) and by the two
    heads' times (`call/accuracy_times`), the fits' mean |log error|."""
    out: dict[str, Any] = {}
    figs = problem_figures(table, pred, pred_aten)
    listed = problem_figures(table, pred, pred_aten, table.inductor)
    err = np.abs(pred - np.log(table.ms))
    aerr = np.abs(pred_aten - np.log(table.aten_ms))
    for name, which in (("train", 0), ("val", 1), ("test", 2)):
        part = (split == which) & np.isfinite(figs["top1"])
        if not part.any():
            continue
        out[f"{name}/problems"] = int(part.sum())
        groups = [("all", part)] + [(m, part & (table.modes == m)) for m in MODES] + \
            [(f"family/{f}", part & (table.families == f)) for f in sorted(set(table.families))]
        for g, sel in groups:
            if sel.any():
                out[f"{name}/{g}/problems"] = int(sel.sum())
                out[f"{name}/{g}/top1_eff"] = _geomean(figs["top1"][sel])
                out[f"{name}/{g}/top5_eff"] = _geomean(figs["top5"][sel])
        lp = part & np.isfinite(listed["top1"])
        if lp.any():
            out[f"{name}/inductor_list/top1_eff"] = _geomean(listed["top1"][lp])
        c = part & figs["call_ok"]
        if c.any():
            out[f"{name}/call/problems"] = int(c.sum())
            right = (pred_call < 0) == figs["truth"]
            out[f"{name}/call/accuracy"] = float(right[c].mean())
            out[f"{name}/call/accuracy_times"] = float((figs["call"] == figs["truth"])[c].mean())
            out[f"{name}/call/accuracy_always_triton"] = float((~figs["truth"])[c].mean())
            for f in sorted(set(table.families)):
                if (c & (table.families == f)).any():
                    out[f"{name}/family/{f}/call_accuracy"] = float(right[c & (table.families == f)].mean())
            out[f"{name}/call/aten_wins_frac"] = float(figs["truth"][c].mean())
            out[f"{name}/aten/mean_abs_log_err"] = float(aerr[c].mean())
        out[f"{name}/triton/mean_abs_log_err"] = float(err[part[table.problem_idx]].mean())
    return out


def _log_figures(m: dict[str, Any], log: Any) -> None:
    for split in ("val", "test"):
        if f"{split}/all/top1_eff" not in m:
            continue
        per = ", ".join(f"{k} {m[f'{split}/{k}/top1_eff']:.4f}/{m[f'{split}/{k}/top5_eff']:.4f}"
                        for k in ("all",) + MODES if f"{split}/{k}/top1_eff" in m)
        call = m.get(f"{split}/call/accuracy")
        log(f"bmm-head: {split} problems ({m[f'{split}/problems']}): top-1/top-5 {per}"
            + (f"; aten-or-Triton call right on {call:.4f} (the two heads' times: "
               f"{m[f'{split}/call/accuracy_times']:.4f}, always Triton: {m[f'{split}/call/accuracy_always_triton']:.4f})"
               if call is not None else ""))


def zero_shot_figures(bundle: artifact.ModelBundle, table: BmmTable, split: np.ndarray) -> dict[str, float]:
    """The test problems ranked by the model's gemm head on one matrix of the batch, beside the bmm head's
    figures."""
    test = split == 2
    P = torch.from_numpy(table.problems[table.problem_idx][:, :8])
    with torch.inference_mode():
        x = bundle.encoders["gemm"].encode(P, torch.from_numpy(table.configs))
        score = bundle.heads["gemm"].score(x)
    figs = problem_figures(table, score.double().numpy(), np.zeros(len(table.problems)))
    out = {}
    for g in ("all",) + MODES:
        sel = test & np.isfinite(figs["top1"]) & ((table.modes == g) if g != "all" else True)
        if sel.any():
            out[f"test/{g}/top1_eff"] = _geomean(figs["top1"][sel])
            out[f"test/{g}/top5_eff"] = _geomean(figs["top5"][sel])
    return out

