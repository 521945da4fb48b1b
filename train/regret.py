"""Regret as a distribution: pure functions of per-problem efficiencies (numpy in, dicts out).

A problem's regret of a method's top-k = (time of the best of its k picks / the fastest measured) - 1 =
1 / efficiency - 1: 0 when the pick is the fastest config, 0.25 when it runs 25 % slower. A geomean
efficiency hides the tail; the median, p90 and worst regret show it, per dtype mode and per layout.
"""
from __future__ import annotations

import numpy as np

MODES = ("float16", "bfloat16", "tf32", "float32")
LAYOUTS = ("NN", "NT", "TN", "TT")
STATS = ("median", "p90", "worst")


def regret(efficiency: np.ndarray) -> np.ndarray:
    """Per problem: 1 / efficiency - 1 (efficiency = fastest ms / the pick's ms, in (0, 1])."""
    eff = np.asarray(efficiency, dtype=np.float64)
    if np.any(~(eff > 0)):
        raise ValueError("efficiency: every value must be > 0 (fastest ms / the pick's ms)")
    return 1.0 / eff - 1.0


def distribution(values: np.ndarray) -> dict[str, float]:
    """median, p90 (linear interpolation between order statistics, numpy's default) and worst (max) of
    per-problem regrets, with their count; NaN values (problems without rows) are left out."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if not len(v):
        return {"median": float("nan"), "p90": float("nan"), "worst": float("nan"), "problems": 0}
    return {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)), "worst": float(v.max()),
            "problems": int(len(v))}


def layouts(transpose_left: np.ndarray, transpose_right: np.ndarray) -> np.ndarray:
    """NN / NT / TN / TT per problem (N: an operand as stored, T: transposed; left operand first)."""
    tl = np.asarray(transpose_left).astype(bool)
    tr = np.asarray(transpose_right).astype(bool)
    return np.array(LAYOUTS, dtype=object)[2 * tl.astype(int) + tr.astype(int)]


def regret_report(top1_eff: np.ndarray, top5_eff: np.ndarray, modes: np.ndarray, layout: np.ndarray
                  ) -> dict[str, dict[str, dict[str, float]]]:
    """{"top1"|"top5": {group: distribution}} over every problem ("all"), each dtype mode present
    (MODES: float16, bfloat16, tf32, float32), "fp32_all" (tf32 and float32 together, as the evaluation
    table's fp32 columns) and each layout present ("layout/NN", ...)."""
    modes, layout = np.asarray(modes), np.asarray(layout)
    groups = {"all": np.ones(len(modes), bool)}
    groups |= {m: modes == m for m in MODES if (modes == m).any()}
    fp32 = (modes == "tf32") | (modes == "float32")
    if fp32.any():
        groups["fp32_all"] = fp32
    groups |= {f"layout/{lay}": layout == lay for lay in LAYOUTS if (layout == lay).any()}
    out = {}
    for name, eff in (("top1", top1_eff), ("top5", top5_eff)):
        r = regret(np.where(np.isnan(eff), 1.0, eff))
        r[np.isnan(np.asarray(eff, dtype=np.float64))] = np.nan
        out[name] = {g: distribution(r[mask]) for g, mask in groups.items()}
    return out


def format_regret(report: dict[str, dict[str, dict[str, float]]]) -> str:
    """A markdown table: one row per group, median / p90 / worst regret of top-1 and top-5 (in %)."""
    head = "| problems | n | " + " | ".join(f"{k} {s}" for k in ("top1", "top5") for s in STATS) + " |"
    lines = [head, "|---|---|" + "---|" * 2 * len(STATS)]
    for group, d in report["top1"].items():
        cells = [f"{100 * report[k][group][s]:.1f} %" for k in ("top1", "top5") for s in STATS]
        lines.append(f"| {group} | {d['problems']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
