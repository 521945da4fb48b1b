"""The model's ranking judged on Inductor's own timings: the configs Inductor compiled and benchmarked
under max-autotune for the 26 shapes of benchmarks/studies/kernel_fidelity.py (captured on the H100 through its
feedback saver), ranked by the shipped model for each kernel mode side by side -- kernel="autotune" (the
dataset kernel's times) and kernel="inductor" (with the static head). CPU only; reads the committed
capture.

    python -m benchmarks.studies.inductor_rank_check [--fidelity benchmarks/results/fidelity/kernel_fidelity_h100.json]
        [--model models/h100] [--out benchmarks/results/inductor_rank_check_h100.json]

Per shape: top-1 efficiency (Inductor's fastest time / Inductor's time of the model's pick), the best of
the model's top 3, and the Spearman of the model's times with Inductor's. Some of these shapes (4096^3,
the Llama widths) are also problems of data/h100, so this is agreement with Inductor's template, not a
held-out score.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import REPO

FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fidelity", type=Path, default=REPO / "benchmarks/results/fidelity/kernel_fidelity_h100.json")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from perfmodel import GemmConfig, GemmProblem, Predictor

    shapes = json.loads(args.fidelity.read_text())["shapes"]
    preds = {k: Predictor.load(args.model, kernel=k) for k in ("autotune", "inductor")}
    rows, lines = [], []
    for s in shapes:
        cs = [c for c in s["configs"] if c.get("inductor_ms")]
        if len(cs) < 3:
            continue
        prob = GemmProblem(m=s["M"], n=s["N"], k=s["K"], dtype="float32" if s["mode"] == "tf32" else s["mode"],
                           allow_tf32=s["mode"] == "tf32", transpose_left=s["transpose_left"],
                           transpose_right=s["transpose_right"])
        cfgs = [GemmConfig(**dict(zip(FIELDS, c["config"]))) for c in cs]
        t = np.array([c["inductor_ms"] for c in cs])
        row = {"name": s["name"], "configs": len(cs)}
        for kname, p in preds.items():
            ms = p.predict(prob, cfgs)
            ranked = p.rank(prob, cfgs, top_k=3)
            pick = [cfgs.index(c) for c, _ in ranked]
            row[kname] = {"top1_eff": float(t.min() / t[pick[0]]), "top3_eff": float(t.min() / t[pick].min()),
                          "spearman": _spearman(ms, t)}
        rows.append(row)
    out: dict = {"fidelity": str(args.fidelity.relative_to(REPO) if args.fidelity.is_relative_to(REPO) else args.fidelity),
                 "model": str(args.model or "shipped default"), "shapes": rows}
    for kname in preds:
        e1 = np.array([r[kname]["top1_eff"] for r in rows])
        e3 = np.array([r[kname]["top3_eff"] for r in rows])
        out[kname] = {"top1_eff_geomean": float(np.exp(np.log(e1).mean())), "top1_eff_min": float(e1.min()),
                      "top3_eff_geomean": float(np.exp(np.log(e3).mean())),
                      "spearman_median": float(np.median([r[kname]["spearman"] for r in rows])),
                      "shapes_top1_at_least_0.97": int((e1 >= 0.97).sum())}
    lines.append("| shape | configs | top-1 autotune | top-1 inductor | top-3 autotune | top-3 inductor | Spearman autotune | Spearman inductor |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        a, i = r["autotune"], r["inductor"]
        lines.append(f"| {r['name']} | {r['configs']} | {a['top1_eff']:.3f} | {i['top1_eff']:.3f} | {a['top3_eff']:.3f} | "
                     f"{i['top3_eff']:.3f} | {a['spearman']:.2f} | {i['spearman']:.2f} |")
    a, i = out["autotune"], out["inductor"]
    lines.append(f"| **geomean** ({len(rows)} shapes) | | **{a['top1_eff_geomean']:.3f}** | **{i['top1_eff_geomean']:.3f}** | "
                 f"{a['top3_eff_geomean']:.3f} | {i['top3_eff_geomean']:.3f} | {a['spearman_median']:.2f} (median) | "
                 f"{i['spearman_median']:.2f} (median) |")
    text = "\n".join(lines)
    print(text)
    print(json.dumps({k: out[k] for k in preds}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
