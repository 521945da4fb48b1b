"""Plots of a model's held-out predictions: one copy, used by `perfmodel train` (logged to MLflow) and
`perfmodel eval --plots DIR` (written to a folder; `python -m benchmarks.plots` writes docs/img/).

matplotlib is imported here only (an optional dependency: the `bench` extra); without it no plot is made.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import metrics as ev
from .data import GemmTable

# The ranking-efficiency plot's bars: the evaluation table's method names, in this order.
BASELINES = ("perfmodel", "PR 156851 model", "PR 156851 model (training run)", "Inductor defaults, best measured",
             "analytic (Triton-style)", "random choice")
# Dtype groups of the efficiency plots: the table's keys and their labels.
GROUPS = (("float16", "fp16"), ("bfloat16", "bf16"), ("fp32_all", "fp32 (incl. tf32)"))
_MODE_COLOURS = {"float16": "tab:blue", "bfloat16": "tab:orange", "tf32": "tab:green", "float32": "tab:red"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only: no display on the training or CI machines
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def pred_vs_measured(plt, table: GemmTable, pred_log_ms: np.ndarray, path: Path) -> Path:
    """Predicted against measured ms of every held-out row, one log-log panel per dtype mode."""
    modes = [m for m in ev.MODES if (table.modes == m).any()]
    fig, axes = plt.subplots(1, len(modes), figsize=(3.4 * len(modes), 3.6), squeeze=False)
    pred = np.exp(pred_log_ms)
    lo, hi = min(table.ms.min(), pred.min()) / 1.5, max(table.ms.max(), pred.max()) * 1.5
    for ax, mode in zip(axes[0], modes):
        rows = (table.modes == mode)[table.problem_idx]
        ms, p = table.ms[rows], pred[rows]
        mape = float(np.mean(np.abs(p - ms) / ms))
        ax.scatter(ms, p, s=1, alpha=0.25, color=_MODE_COLOURS[mode], rasterized=True)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms",
               title=f"{mode}: {int((table.modes == mode).sum())} problems\n{rows.sum():,} configs, MAPE {mape:.2f}")
    axes[0][0].set_ylabel("predicted ms")
    fig.suptitle("gemm head on held-out problems", y=1.0)
    return _save(plt, fig, path)


def ranking_efficiency(plt, results: dict[str, dict[str, float]], path: Path) -> Path:
    """Top-1 and top-5 efficiency per dtype group for the model and each baseline in `results`."""
    methods = [m for m in BASELINES if m in results]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True)
    width = 0.8 / len(methods)
    x = np.arange(len(GROUPS))
    for ax, k in zip(axes, ("top1", "top5")):
        for j, method in enumerate(methods):
            vals = [results[method].get(f"{g}/{k}_eff", np.nan) for g, _ in GROUPS]
            bars = ax.bar(x + (j - (len(methods) - 1) / 2) * width, vals, width, label=method)
            for b, v in zip(bars, vals):
                if np.isfinite(v) and method == "perfmodel":
                    ax.annotate(f"{v:.3f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [label for _, label in GROUPS])
        ax.set(ylim=(0, 1.08), title=f"top-{k[-1]} efficiency (1.0 = the fastest measured config)")
        ax.axhline(1.0, color="k", lw=0.5)
    axes[0].set_ylabel("geomean over held-out problems")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def per_problem_top1(plt, table: GemmTable, score: np.ndarray, path: Path, label: str = "perfmodel") -> Path:
    """Each held-out problem's top-1 efficiency, sorted: where the ranking fails. The worst problems are named."""
    top1 = ev.per_problem(table, score)["top1"]
    order = np.argsort(top1)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for mode in ev.MODES:
        idx = np.flatnonzero(table.modes[order] == mode)
        if len(idx):
            ax.scatter(idx, top1[order][idx], s=10, color=_MODE_COLOURS[mode], label=mode)
    for rank in range(min(3, len(order))):
        i = order[rank]
        m, n, k = (int(v) for v in table.problems[i, :3])
        ax.annotate(f"{m}x{n}x{k} {table.modes[i]}: {top1[i]:.3f}", (rank, top1[i]), xytext=(60, -6 + 14 * rank),
                    textcoords="offset points", fontsize=7, va="center",
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.4"})
    ax.set(xlabel="held-out problems, sorted (M x N x K)", ylabel="top-1 efficiency",
           title=f"{label}: fastest measured config / the pick's time, per problem (1.0 = best pick)")
    ax.legend(fontsize=7, loc="lower right")
    return _save(plt, fig, path)


def topk_histogram(plt, table: GemmTable, score: np.ndarray, path: Path) -> Path:
    pp = ev.per_problem(table, score)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([pp["top1"], pp["top5"]], bins=30, label=["top-1", "top-5"])
    ax.set(xlabel="efficiency (oracle ms / chosen ms)", ylabel="problems", title="per-problem efficiency")
    ax.legend()
    return _save(plt, fig, path)


def model_plots(table: GemmTable, pred_log_ms: np.ndarray, folder: Path, rank_score: np.ndarray | None = None,
                results: dict[str, dict[str, float]] | None = None) -> list[Path]:
    """Write the held-out plots into folder; returns their paths ([] without matplotlib).
    pred_log_ms: the gemm head's log ms per row of table; rank_score: the serving rank path's scores
    (evaluate.screened), default pred_log_ms; results: the evaluation table (method -> metrics)."""
    plt = _pyplot()
    if plt is None:
        return []
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    score = pred_log_ms if rank_score is None else rank_score
    out = [pred_vs_measured(plt, table, pred_log_ms, folder / "pred_vs_measured.png"),
           per_problem_top1(plt, table, score, folder / "per_problem_top1.png"),
           topk_histogram(plt, table, score, folder / "topk_efficiency.png")]
    if results:
        out.append(ranking_efficiency(plt, results, folder / "ranking_efficiency.png"))
    return out
