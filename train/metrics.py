"""Pure metric functions of held-out predictions: ranking efficiency, Spearman, MAPE, the serving rank
path's order, the cuBLAS call and the pad decisions. Arrays in, numbers out: no head, no file."""
from __future__ import annotations

import math

import numpy as np
import torch

from perfmodel.configs import inductor_default_configs
from perfmodel.ranking import refines, screened_rank, screens

from .data import GemmTable, PadTable

MODES = ("float16", "bfloat16", "tf32", "float32")


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


LAYOUTS = ("NN", "NT", "TN", "TT")


def layout_masks(table: GemmTable) -> dict[str, np.ndarray]:
    """Per operand layout ("layout/NT": A row-major, B column-major), the problems of table that have it (only the
    layouts present)."""
    left, right = table.problems[:, 6] > 0.5, table.problems[:, 7] > 0.5
    out = {}
    for name in LAYOUTS:
        mask = (left == (name[0] == "T")) & (right == (name[1] == "T"))
        if mask.any():
            out[f"layout/{name}"] = mask
    return out


def worst_problems(table: GemmTable, score: np.ndarray, n: int = 5) -> list[dict[str, object]]:
    """The n problems of table whose top-1 efficiency by score (lower = predicted faster) is lowest: key, dtype
    mode, layout, top-1 and top-5."""
    pp = per_problem(table, score)
    out = []
    for i in np.argsort(np.nan_to_num(pp["top1"], nan=np.inf), kind="stable")[:n]:
        lay = "".join("T" if table.problems[i, c] > 0.5 else "N" for c in (6, 7))
        out.append({"problem": table.problem_keys[i], "mode": str(table.modes[i]), "layout": lay,
                    "m": int(table.problems[i, 0]), "n": int(table.problems[i, 1]), "k": int(table.problems[i, 2]),
                    "top1": float(pp["top1"][i]), "top5": float(pp["top5"][i])})
    return out


def summarize(table: GemmTable, pred_log_ms: np.ndarray, score: np.ndarray | None = None) -> dict[str, float]:
    """Metrics of one model's predictions (log ms per row), overall, per dtype mode and per layout. score: what
    ranks the rows (default the log ms; a head's score before its floors, PerfMLP.score)."""
    pp = per_problem(table, pred_log_ms if score is None else score)
    pred = np.exp(np.minimum(pred_log_ms, 50.0))
    ape = np.abs(pred - table.ms) / table.ms
    out: dict[str, float] = {}
    masks = {"all": np.ones(len(table.problems), bool)} | {m: table.modes == m for m in MODES} | layout_masks(table)
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
