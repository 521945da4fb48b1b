"""aten::bmm's time from a bmm_aten head against the time the bmm call head implies (CPU): mean, median and
90th percentile |log error| per split of a model folder's bmm problems.

    python -m benchmarks.studies.bmm_aten_implied --model FOLDER [--data data/h100]

FOLDER must have a bmm_aten head (a folder fitted with `perfmodel bmm-head --aten-head`; models/h100 had one
up to commit 3e673ec: `mkdir old && git archive 3e673ec models/h100 | tar -x -C old`). The implied time is the
best predicted config's time x exp(the call's output), over Inductor's DEFAULT list of each problem and over
all its timed configs. docs/model.md ("Batched GEMMs") has the results.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from perfmodel import artifact
from perfmodel.train.bmm_head import encode, implied_aten_log_ms, load_bmm, predict_log_ms, score, split_by_shape
from perfmodel.train.refit import load_model, model_seed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("data/h100"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    b = load_model(args.model, args.threads)
    if artifact.BMM_ATEN not in b.heads:
        ap.error(f"--model: {args.model} has no bmm_aten head (fit one with perfmodel bmm-head --aten-head)")
    t = load_bmm(args.data)
    split = split_by_shape(t, model_seed(b))
    x, xa = encode(t, b.spec, b.encoders["gemm"].version)
    pred = predict_log_ms(b.heads[artifact.BMM], x)
    head = predict_log_ms(b.heads[artifact.BMM_ATEN], xa)
    call = score(b.heads[artifact.BMM_CALL], xa)
    for name, rows in (("Inductor's list", t.inductor), ("all timed", np.ones(len(t.ms), bool))):
        implied = implied_aten_log_ms(t, np.where(rows, pred, np.inf), call)  # the best over `rows` only
        ok = np.isfinite(t.aten_ms) & np.isfinite(implied)
        la = np.log(np.where(ok, t.aten_ms, 1.0))
        for part, which in (("train", 0), ("val", 1), ("test", 2)):
            m = ok & (split == which)
            e1, e2 = np.abs(head - la)[m], np.abs(implied - la)[m]
            print(f"{name:15s} {part:5s} {int(m.sum()):4d} problems  bmm_aten head |log err| mean {e1.mean():.4f} "
                  f"median {np.median(e1):.4f} p90 {np.quantile(e1, 0.9):.4f}  |  implied mean {e2.mean():.4f} "
                  f"median {np.median(e2):.4f} p90 {np.quantile(e2, 0.9):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
