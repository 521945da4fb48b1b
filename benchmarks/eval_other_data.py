"""A model's ranking, cuBLAS and pad quality on every problem of another dataset folder (CPU).

Used to measure what a model trained on one dataset predicts for timings it never saw: e.g. the
shipped model (trained on kernel v3's data/h100) on the v4 kernel's data/h100, whose timings come
from a different compile of the kernel. All problems of the folder count (no split): the model saw
none of these timings. Per dtype mode, and for the problems above 1e12 FLOP.

    python benchmarks/eval_other_data.py [--model DIR] [--data data/h100] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from perfmodel import artifact  # noqa: E402
from perfmodel.locations import default_model_dir  # noqa: E402
from perfmodel.train import evaluate as ev  # noqa: E402
from perfmodel.train.data import load_gemm, load_pad  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--data", type=Path, default=REPO / "data" / "h100")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    b = artifact.load(args.model or default_model_dir())
    g = load_gemm(args.data)
    P, C = torch.from_numpy(g.problems[g.problem_idx]), torch.from_numpy(g.configs)
    with torch.inference_mode():
        x = b.encoders["gemm"].encode(P, C)
        cublas = b.heads["cublas"](b.encoders["cublas"].encode(torch.from_numpy(g.problems))).double().numpy()
    score, pred = ev.head_outputs(b.heads["gemm"], x)  # one pass: the score and the floored log ms
    screen, _ = ev.head_outputs(b.heads["screen"], x)
    lead = ev.lead_outputs(b.heads["gemm"], x) if b.lead_keep else None
    big = np.array([2.0 * p[0] * p[1] * p[2] > 1e12 for p in g.problems])
    res: dict = {"model": str(args.model or "shipped default"), "data": args.data.name}
    for name, sel in (("all problems", np.ones(len(g.problems), bool)), ("above 1e12 FLOP", big)):
        if sel.any():
            rows = sel[g.problem_idx]
            res[name] = {"problems": int(sel.sum()), **ev.rank_path(g.subset(sel), pred[rows], screen[rows], b.screen_keep,
                                                                   score[rows], None if lead is None else lead[rows],
                                                                   b.lead_keep)}
    best_pred = np.full(len(g.problems), np.inf)
    np.minimum.at(best_pred, g.problem_idx, pred)
    res["cublas"] = ev.cublas_metrics(g, cublas, best_pred)
    pads = load_pad(args.data)
    if len(pads.pads):
        with torch.inference_mode():
            ppred = b.heads["pad"](b.encoders["pad"].encode_pad(torch.from_numpy(pads.pads))).double().numpy()
        res["pad"] = ev.pad_metrics(pads, ppred, b.pad_threshold)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
