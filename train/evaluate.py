"""Evaluation on held-out problems: ranking quality, runtime error, cuBLAS and pad decisions."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from perfmodel.configs import inductor_default_configs
from perfmodel import artifact
from perfmodel.ranking import refines, screened_rank, screens

from .data import GemmTable, PadTable

MODES = ("float16", "bfloat16", "tf32", "float32")
# The columns of the evaluation table (model card, `perfmodel eval`).
TABLE_KEYS = ["float16/top1_eff", "float16/top5_eff", "bfloat16/top1_eff", "bfloat16/top5_eff", "fp32_all/top1_eff",
              "fp32_all/top5_eff", "all/spearman_median", "all/mape", "all/worst_top1"]


def _geomean(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.exp(np.mean(np.log(x)))) if len(x) else float("nan")


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3:
        return float("nan")
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def per_problem(table: GemmTable, score: np.ndarray) -> dict[str, np.ndarray]:
    """Per problem: top-1/top-5 efficiency (oracle ms / ms of the best of the k lowest-scored configs),
    Spearman(score, ms). Lower score = predicted faster."""
    P = len(table.problems)
    top1, top5, rho = np.full(P, np.nan), np.full(P, np.nan), np.full(P, np.nan)
    for i, rows in enumerate(table.problem_rows()):
        if len(rows) == 0:
            continue
        ms, s = table.ms[rows], score[rows]
        rank = np.argsort(s, kind="stable")
        oracle = ms.min()
        top1[i] = oracle / ms[rank[0]]
        top5[i] = oracle / ms[rank[:5]].min()
        rho[i] = _spearman(s, ms)
    return {"top1": top1, "top5": top5, "spearman": rho}


def screened(table: GemmTable, gemm_score: np.ndarray, gemm_log_ms: np.ndarray, screen_score: np.ndarray | None,
             keep: int, lead: np.ndarray | None = None, lead_keep: int = 0) -> np.ndarray:
    """Per row, its place in the serving rank path's order (perfmodel.ranking.screened_rank, as the
    Predictor and the ONNX graph rank): 0 for the pick, 1 for the next, ...; rows the screen drops
    (problems with more than 2 * keep rows) rank last (inf). With a lead (lead: the lead member's score
    per row, lead_outputs), a screened problem's ranking is the rule's for top_k = lead_keep: its first
    lead_keep places (what rank(top_k <= lead_keep) returns), the other rows inf."""
    out = np.full(len(gemm_score), np.inf)
    for rows in table.problem_rows():
        if len(rows) == 0:
            continue
        k = len(rows)
        if lead is not None and screen_score is not None and screens(True, k, keep) and refines(lead_keep, keep, lead_keep):
            k = lead_keep
        idx, _ = rank_rows(gemm_score[rows], gemm_log_ms[rows], None if screen_score is None else screen_score[rows],
                           keep, k, None if lead is None else lead[rows], lead_keep)
        out[rows[idx]] = np.arange(len(idx))
    return out


def rank_rows(gemm_score: np.ndarray, gemm_log_ms: np.ndarray, screen_score: np.ndarray | None, keep: int,
              k: int, lead: np.ndarray | None = None, lead_keep: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """screened_rank of one problem's rows, from the heads' outputs on every row: (row indices, log ms).
    lead: the gemm ensemble's lead member's score per row (lead_outputs), or None (no lead)."""
    n = len(gemm_score)
    z, lm = torch.from_numpy(np.asarray(gemm_score)), torch.from_numpy(np.asarray(gemm_log_ms))
    screen = torch.from_numpy(np.asarray(screen_score)).reshape(1, n) \
        if screen_score is not None and screens(True, n, keep) else None
    lead_fn = None
    if lead is not None:
        ld = torch.from_numpy(np.asarray(lead))
        lead_fn = lambda r: (ld[r], ld[r])  # noqa: E731
    # the ensemble's outputs on every row are computed already: the lead's outputs are not needed again
    idx, log_ms = screened_rank(lambda r, _lead: (z, lm) if r is None else (z[r], lm[r]), 1, n, screen, keep, k,
                                lead=lead_fn, lead_keep=lead_keep)
    return idx[0].numpy(), log_ms[0].numpy()


def summarize(table: GemmTable, pred_log_ms: np.ndarray, score: np.ndarray | None = None) -> dict[str, float]:
    """Metrics of one model's predictions (log ms per row), overall and per dtype mode. score: what
    ranks the rows (default the log ms; a head's score before its floors, PerfMLP.score)."""
    pp = per_problem(table, pred_log_ms if score is None else score)
    pred = np.exp(np.minimum(pred_log_ms, 50.0))
    ape = np.abs(pred - table.ms) / table.ms
    out: dict[str, float] = {}
    masks = {"all": np.ones(len(table.problems), bool)} | {m: table.modes == m for m in MODES}
    for name, mask in masks.items():
        if not mask.any():
            continue
        rows = mask[table.problem_idx]
        out[f"{name}/top1_eff"] = _geomean(pp["top1"][mask])
        out[f"{name}/top5_eff"] = _geomean(pp["top5"][mask])
        out[f"{name}/spearman_median"] = float(np.nanmedian(pp["spearman"][mask]))
        out[f"{name}/mape"] = float(ape[rows].mean())
        out[f"{name}/worst_top1"] = float(np.nanmin(pp["top1"][mask]))
        out[f"{name}/worst_top5"] = float(np.nanmin(pp["top5"][mask]))
        out[f"{name}/problems"] = int(mask.sum())
    # the "fp32" targets cover both fp32 modes
    fp32 = (table.modes == "tf32") | (table.modes == "float32")
    if fp32.any():
        out["fp32_all/top1_eff"] = _geomean(pp["top1"][fp32])
        out["fp32_all/top5_eff"] = _geomean(pp["top5"][fp32])
    return out


def rank_path(table: GemmTable, pred_log_ms: np.ndarray, screen_score: np.ndarray | None, keep: int,
              gemm_score: np.ndarray | None = None, lead: np.ndarray | None = None,
              lead_keep: int = 0) -> dict[str, float]:
    """summarize() of the gemm head, with the top-k efficiencies (and worst problems) of the serving
    rank path -- the screen head, then the gemm head on its best `keep` (through the lead's best
    lead_keep, with a lead) -- when there is a screen.
    gemm_score: the gemm head's score (PerfMLP.score; default its log ms)."""
    gemm_score = pred_log_ms if gemm_score is None else gemm_score
    out = summarize(table, pred_log_ms, gemm_score)
    if screen_score is not None:
        path = summarize(table, pred_log_ms, screened(table, gemm_score, pred_log_ms, screen_score, keep, lead, lead_keep))
        out.update({k: v for k, v in path.items() if "/top1" in k or "/top5" in k or "/worst" in k})
    return out


def random_choice(table: GemmTable) -> dict[str, float]:
    """Expected efficiency of picking configs uniformly at random (exact expectation of log-ratio for
    top-1; top-5 by 200 seeded draws)."""
    rng = np.random.default_rng(0)
    P = len(table.problems)
    best = np.full(P, np.inf)
    np.minimum.at(best, table.problem_idx, table.ms)
    out: dict[str, float] = {}
    t1 = np.zeros(P)
    np.add.at(t1, table.problem_idx, np.log(best[table.problem_idx] / table.ms))
    t1 = np.exp(t1 / np.bincount(table.problem_idx, minlength=P))
    t5 = np.ones(P)
    for i, rows in enumerate(table.problem_rows()):
        ms = table.ms[rows]
        draws = [ms[rng.choice(len(ms), size=min(5, len(ms)), replace=False)].min() for _ in range(200)]
        t5[i] = best[i] / np.exp(np.mean(np.log(draws)))
    for name in ("all",) + MODES:
        mask = np.ones(P, bool) if name == "all" else table.modes == name
        if mask.any():
            out[f"{name}/top1_eff"] = _geomean(t1[mask])
            out[f"{name}/top5_eff"] = _geomean(t5[mask])
    fp32 = (table.modes == "tf32") | (table.modes == "float32")
    out["fp32_all/top1_eff"], out["fp32_all/top5_eff"] = _geomean(t1[fp32]), _geomean(t5[fp32])
    return out


def inductor_defaults(table: GemmTable) -> dict[str, float]:
    """'Benchmark Inductor's default mm configs and take the best', restricted to the defaults that the
    sweep measured for each problem (coverage reported: the sweep sampled the space, so not all are)."""
    defaults = {tuple(c.triton_kwargs()[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps"))
                for c in inductor_default_configs()}
    is_default = np.array([tuple(int(v) for v in row) in defaults for row in table.configs])
    P = len(table.problems)
    best = np.full(P, np.inf)
    np.minimum.at(best, table.problem_idx, table.ms)
    best_def = np.full(P, np.inf)
    np.minimum.at(best_def, table.problem_idx[is_default], table.ms[is_default])
    covered = np.isfinite(best_def)
    n_def = np.bincount(table.problem_idx[is_default], minlength=P)
    eff = best / best_def
    out = {"coverage_problems": float(covered.mean()), "mean_defaults_measured": float(n_def[covered].mean()) if covered.any() else 0.0}
    for name in ("all",) + MODES:
        mask = covered & (np.ones(P, bool) if name == "all" else table.modes == name)
        if mask.any():
            out[f"{name}/best_of_defaults_eff"] = _geomean(eff[mask])
    return out


def cublas_metrics(table: GemmTable, pred_cublas_log_ms: np.ndarray, pred_best_triton_log_ms: np.ndarray,
                   call_score: np.ndarray | None = None) -> dict[str, float]:
    """The cuBLAS head's MAPE and the cuBLAS call: whether cuBLAS beats the best measured Triton config,
    per problem. The call is the call head's (call_score < 0: cuBLAS wins; train/call_head.py) when
    given, else the cuBLAS head's time below the best predicted Triton time; "choice_accuracy_times"
    is always the latter."""
    ok = np.isfinite(table.cublas_ms)
    best = np.full(len(table.problems), np.inf)
    np.minimum.at(best, table.problem_idx, table.ms)
    pred = np.exp(pred_cublas_log_ms)
    truth_cublas_wins = table.cublas_ms < best
    by_times = pred_cublas_log_ms < pred_best_triton_log_ms
    pred_cublas_wins = by_times if call_score is None else call_score < 0
    return {
        "cublas/mape": float((np.abs(pred - table.cublas_ms) / table.cublas_ms)[ok].mean()),
        "cublas/faster_than_best_triton_frac": float(truth_cublas_wins[ok].mean()),
        "cublas/choice_accuracy": float((truth_cublas_wins == pred_cublas_wins)[ok].mean()),
        "cublas/choice_accuracy_times": float((truth_cublas_wins == by_times)[ok].mean()),
    }


def pad_metrics(table: PadTable, pred_log: np.ndarray, threshold: float = 1.0) -> dict[str, float]:
    """Total time of the model's pad decisions vs the oracle's (and always/never pad)."""
    should_pad = np.exp(pred_log[:, 1]) * threshold < np.exp(pred_log[:, 0])
    chosen = np.where(should_pad, table.padded_ms, table.orig_ms)
    oracle = np.minimum(table.orig_ms, table.padded_ms)
    out = {"pad/total_vs_oracle": float(chosen.sum() / oracle.sum()),
           "pad/never_pad_vs_oracle": float(table.orig_ms.sum() / oracle.sum()),
           "pad/always_pad_vs_oracle": float(table.padded_ms.sum() / oracle.sum()),
           "pad/decision_accuracy": float((should_pad == (table.padded_ms < table.orig_ms)).mean()),
           "pad/mape_orig": float((np.abs(np.exp(pred_log[:, 0]) - table.orig_ms) / table.orig_ms).mean()),
           "pad/mape_padded": float((np.abs(np.exp(pred_log[:, 1]) - table.padded_ms) / table.padded_ms).mean()),
           "pad/problems": int(len(table.orig_ms))}
    for mode in MODES:
        mk = table.modes == mode
        if mk.any():
            out[f"pad/{mode}/total_vs_oracle"] = float(chosen[mk].sum() / oracle[mk].sum())
    return out


def format_table(results: dict[str, dict[str, float]], keys: list[str]) -> str:
    """A markdown table: one row per method, one column per metric key."""
    head = "| method | " + " | ".join(keys) + " |"
    sep = "|---|" + "---|" * len(keys)
    lines = [head, sep]
    for method, metrics in results.items():
        cells = []
        for k in keys:
            v = metrics.get(k)
            cells.append("—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
        screen = head_outputs(bundle.heads["screen"], x)[0] if "screen" in bundle.heads else None
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
        call = bundle.heads.get(artifact.CALL)
        cmet = cublas_metrics(test, bundle.heads["cublas"].eval()(cx).double().numpy(), best_pred,
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

    enc, gemm, screen = bundle.encoders["gemm"], bundle.heads["gemm"], bundle.heads["screen"]
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
