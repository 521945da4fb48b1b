"""The plots of README.md and docs/, made from committed results only (CPU; needs the `bench` extra).

    python -m benchmarks.plots [--out docs/img] [--model models/h100] [--data data/h100]
                               [--inductor benchmarks/results/inductor_bench_h100_unseen_v8.json]
                               [--triton benchmarks/results/triton_hook_bench_h100_v9.json]

Model quality (`perfmodel eval --plots DIR` writes the same files): the shipped model evaluated on the
test split of its dataset, as `perfmodel eval` does --
  pred_vs_measured.png     predicted vs measured ms of every held-out row, per dtype, log-log
  ranking_efficiency.png   top-1/top-5 efficiency per dtype, the model beside the baselines
  per_problem_top1.png     each held-out problem's top-1 efficiency, sorted (where the ranking fails)
  topk_efficiency.png      the histogram of the same (as logged to MLflow by `perfmodel train`)
The hooks on the H100, from the benchmark JSON files (no GPU needed here) --
  inductor_hook.png        torch.compile max-autotune: compile time and kernel speed, stock vs perfmodel-pad
  triton_hook.png          Triton @autotune: autotune time and kernel time, full vs pruned vs model-space
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import REPO as ROOT


def _short_dtype(dtype: str) -> str:
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)


def inductor_plot(plt, path_json: Path, out: Path) -> Path:
    """Per shape: compile time of stock max-autotune and of the hook (log), and stock kernel ms / ours."""
    run = json.loads(path_json.read_text())
    by = {v["variant"]: {s["name"]: s for s in v.get("shapes", [])} for v in run["variants"] if v.get("shapes")}
    ours_name = next(v for v in by if v != "stock")
    names = [n for n in by["stock"] if n in by[ours_name]]
    stock, ours = by["stock"], by[ours_name]
    y = np.arange(len(names))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 0.36 * len(names) + 1.6), sharey=True)
    h = 0.38
    a1.barh(y - h / 2, [stock[n]["compile_s"] for n in names], h, label="stock max-autotune")
    a1.barh(y + h / 2, [ours[n]["compile_s"] for n in names], h, label=f"{ours_name} (top 5)")
    a1.set(xscale="log", xlabel="compile time of the first call, s (log)")
    a1.set_yticks(y, [_inductor_label(stock[n]) for n in names], fontsize=7)
    a1.invert_yaxis()
    a1.legend(fontsize=7, loc="lower right")
    ratio = [stock[n]["kernel_ms"] / ours[n]["kernel_ms"] for n in names]
    a2.barh(y, ratio, 0.6, color=["tab:green" if r >= 1 else "tab:red" for r in ratio])
    a2.axvline(1.0, color="k", lw=0.8)
    for yi, r in zip(y, ratio):
        a2.annotate(f"{r:.3f}", (r, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    a2.set(xlim=(min(0.9, min(ratio) - 0.02), max(ratio) + 0.12),
           xlabel="kernel speed: stock ms / ours (> 1: ours faster)")
    fig.suptitle(f"torch.compile max-autotune of torch.mm (M x K x N) on the H100 ({path_json.name})",
                 fontsize=10)
    return _save(plt, fig, out)


def _inductor_label(s: dict) -> str:
    """'BERT ffn up 2048x768x3072 fp16' (M x K x N, as inductor_bench names shapes); odd shapes carry theirs."""
    dims = f"{s['m']}x{s['k']}x{s['n']}"
    name = s["name"] if s["name"].startswith("odd") else f"{s['name']} {dims}"
    return f"{name} {_short_dtype(s['dtype'])}"


def triton_plot(plt, path_json: Path, out: Path) -> Path:
    """Per shape: autotune wall time and the chosen kernel's time for the three variants."""
    run = json.loads(path_json.read_text())
    variants = [v["variant"] for v in run["variants"]]
    shapes = run["variants"][0]["shapes"]
    labels = [f"{s['m']}x{s['n']}\nx{s['k']} {_short_dtype(s['dtype'])}" for s in shapes]
    x = np.arange(len(shapes))
    w = 0.8 / len(variants)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    for j, v in enumerate(run["variants"]):
        off = (j - (len(variants) - 1) / 2) * w
        a1.bar(x + off, [s["autotune_s"] for s in v["shapes"]], w, label=f"{v['variant']}")
        full = run["variants"][0]["shapes"]
        a2.bar(x + off, [s["kernel_ms"] / f["kernel_ms"] for s, f in zip(v["shapes"], full)], w,
               label=v["variant"])
    cublas = [s["cublas_ms"] / s["kernel_ms"] for s in run["variants"][0]["shapes"]]
    a2.scatter(x, cublas, marker="_", s=300, color="k", label="cuBLAS", zorder=3)
    a1.set(ylabel="autotune wall time of the first launch, s", title=f"{run['n_configs']} configs vs the model's top {run['top_k']}")
    a2.set(ylabel="kernel ms / the full autotune's kernel ms", title="chosen kernel's time (< 1: faster than full)")
    a2.axhline(1.0, color="k", lw=0.5)
    for a in (a1, a2):
        a.set_xticks(x, labels, fontsize=7)
    a1.legend(fontsize=7)
    a2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"Triton @autotune of the canonical GEMM kernel (M x N x K) on the H100 ({path_json.name})",
                 fontsize=10)
    return _save(plt, fig, out)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "h100")
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "h100")
    ap.add_argument("--inductor", type=Path, default=ROOT / "benchmarks/results/inductor_bench_h100_unseen_v8.json")
    ap.add_argument("--triton", type=Path, default=ROOT / "benchmarks/results/triton_hook_bench_h100_v9.json")
    ap.add_argument("--no-model", action="store_true", help="only the hook plots (skips the ~1 min evaluation)")
    args = ap.parse_args(argv)

    from perfmodel.train import plots

    plt = plots._pyplot()
    if plt is None:
        sys.exit("matplotlib is missing: pip install -e '.[bench]'")
    args.out.mkdir(parents=True, exist_ok=True)
    written = [inductor_plot(plt, args.inductor, args.out / "inductor_hook.png"),
               triton_plot(plt, args.triton, args.out / "triton_hook.png")]
    if not args.no_model:
        from perfmodel import artifact
        from perfmodel.train.evaluate import evaluate_bundle

        evaluate_bundle(artifact.load(args.model), args.data, plots=args.out)
        written += [args.out / f for f in ("pred_vs_measured.png", "ranking_efficiency.png", "per_problem_top1.png",
                                           "topk_efficiency.png")]
    for p in written:
        print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
