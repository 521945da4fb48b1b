"""Which best config should aten::bmm's implied time come from? (CPU)

Without a bmm_aten head a model's aten::bmm time is the one its bmm call head implies: a best predicted config
time x exp(the call, log(aten::bmm ms / the best config's ms)). Two references:

- "space": the best config of the model device's whole config space (what Predictor.predict_cublas,
  Candidates and, since one rule serves them all, both hooks and the whole-model set-up use);
- "list": the best of the configs the hook is offered (Inductor's DEFAULT list; the hooks' rule before):
  aten then wins exactly where the call is below 0, whatever the list.

On the folder's held-out bmm problems (val and test of its split by shape) with the measured times of
Inductor's default configs among each problem's rows and of aten::bmm, this prints per reference the
whole-model set-up's decision (keep the bmm head's best default config beside aten where it is predicted no
slower than aten's time; alone, unbenchmarked, where aten's time is >= (1 + BMM_SURE_GAIN) x it): the share
kept, the share kept alone, and the chosen kernel's measured time over the better of aten and the measured
defaults (geomean, worst).

    python -m benchmarks.studies.bmm_aten_reference [--model models/h100] [--data data/h100]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks import REPO


def main(argv: list[str] | None = None) -> int:
    import warnings

    from perfmodel import GemmProblem, artifact
    from perfmodel.domain import OutsideDomainWarning
    from perfmodel.serve.decisions import BMM_SURE_GAIN
    from perfmodel.serve.predictor import Predictor
    from perfmodel.train import bmm_head as bh

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models/h100")
    ap.add_argument("--data", type=Path, default=REPO / "data/h100")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", OutsideDomainWarning)
    torch.set_num_threads(2)
    b = artifact.load(args.model)
    p = Predictor.load(args.model, backend="torch")
    t = bh.load_bmm(args.data)
    split = bh.split_by_shape(t, int(b.metadata.get("bmm_settings", {}).get("split_seed", 0)))
    x, xa = bh.encode(t, p.spec, b.encoders["gemm"].version)
    pred = bh.predict_log_ms(b.heads[artifact.BMM], x)
    call = bh.score(b.heads[artifact.BMM_CALL], xa)
    dtypes = {(2, 0): "float16", (2, 1): "bfloat16", (4, 0): "float32", (4, 1): "float32"}
    for part, which in (("val", 1), ("test", 2)):
        sel = np.flatnonzero((split == which) & np.isfinite(t.aten_ms))
        probs, pick_pred, pick_ms, best_def = [], [], [], []
        keep_idx = []
        for i in sel:
            rows = np.flatnonzero((t.problem_idx == i) & t.inductor)
            if not len(rows):
                continue
            r = rows[np.argsort(pred[rows], kind="stable")[0]]
            c = t.problems[i]
            probs.append(GemmProblem(m=int(c[0]), n=int(c[1]), k=int(c[2]), dtype=dtypes[(int(c[3]), int(c[4]))],
                                     allow_tf32=bool(c[5]), transpose_left=bool(c[6]), transpose_right=bool(c[7]),
                                     batch=int(c[8])))
            pick_pred.append(np.exp(pred[r]))
            pick_ms.append(t.ms[r])
            best_def.append(t.ms[rows].min())
            keep_idx.append(i)
        idx = np.array(keep_idx)
        pick_pred, pick_ms, best_def = map(np.array, (pick_pred, pick_ms, best_def))
        aten = t.aten_ms[idx]
        space = np.concatenate([p.space_best_ms([q]) for q in probs])
        refs = {"space": space * np.exp(call[idx]), "list": pick_pred * np.exp(call[idx])}
        oracle = np.minimum(aten, best_def)
        print(f"{args.model.name} {part}: {len(idx)} bmm problems with aten and default configs measured")
        for name, aten_pred in refs.items():
            keep = pick_pred <= aten_pred
            alone = keep & (aten_pred >= pick_pred * (1 + BMM_SURE_GAIN))
            chosen = np.where(alone, pick_ms, np.where(keep, np.minimum(aten, pick_ms), aten))
            ratio = chosen / oracle
            print(f"  {name:5s}: keeps Triton {keep.mean():.3f} (alone {alone.mean():.3f}); chosen / best "
                  f"{np.exp(np.log(ratio).mean()):.4f} (worst {ratio.max():.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
