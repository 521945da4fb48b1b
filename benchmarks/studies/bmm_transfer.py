"""The bmm heads on a second GPU (CPU): the H100's shipped bmm heads zero-shot on the H200's bmm rows, a
5-fold cross-validation by shape of heads fitted on the H200's own rows beside the same cross-validation on
the H100's rows of the same problems, and a 5-fold cross-validation by shape on the H200's problems of heads
fitted on the H100's rows alone, and on both devices' rows (each encoded for its device), of the shapes
outside the fold.

data/h200's bmm shards time the first 600 of the H100's problems (`perfmodel gen bmm --problems-spec
h100-sxm`, seeds 0 and 1); data/h100's p000 and p001 shards are those problems on the H100. Zero-shot, the
H100 folder's heads (bmm, bmm_call) score the H200 rows through encoders built for the H200's spec (the
roofline, SM count and peak columns are the device's), as a two-device folder serves its second device.
The cross-validations fit one member per fold with the shipped settings (`bmm_settings` of the folder's
metadata), without the batch-1 static rows (data/h200 has none, so neither side gets them): what the H200's
own 600 problems give, against what the same 600 give on the H100.

    python -m benchmarks.studies.bmm_transfer [--model models/h100] [--h100 data/h100] [--h200 data/h200]
        [--out benchmarks/results/bmm_transfer_h200.json] [--no-cv]
    python -m benchmarks.studies.bmm_transfer --judge-h100 --out benchmarks/results/bmm_transfer_h100_joint.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.devices import get_spec
from perfmodel.train import bmm_head as bh

from benchmarks import REPO

SHARDS = ("bmm-s0of1-p000.jsonl.gz", "bmm-s0of1-p001.jsonl.gz")  # the problems both devices timed
KEYS = ["all", *bh.MODES]


def zero_shot(bundle: artifact.ModelBundle, table: bh.BmmTable, device: str,
              split: np.ndarray | None = None) -> dict[str, Any]:
    """bmm_metrics of the folder's bmm and bmm_call heads on the problems of table (split == 2; None: all),
    encoded for `device`."""
    x, xa = bh.encode(table, get_spec(device), bundle.encoders["gemm"].version)
    pred = bh.predict_log_ms(bundle.heads[artifact.BMM], x)
    call = bh.score(bundle.heads[artifact.BMM_CALL], xa)
    aten = bh.implied_aten_log_ms(table, pred, call)
    m = bh.bmm_metrics(table, np.full(len(table.problems), 2) if split is None else split, pred, aten, call)
    return {"zero_shot/" + k.removeprefix("test/"): v for k, v in m.items()}


def held_out_split(bundle: artifact.ModelBundle, full: bh.BmmTable, table: bh.BmmTable) -> np.ndarray:
    """2 for the problems of table whose shape the folder's bmm heads held out (the test split of their fit,
    split_by_shape of every H100 bmm problem, full, with the model's seed, as `perfmodel bmm-head` drew it), -1
    for the others."""
    seed = int(bundle.metadata.get("bmm_settings", {}).get("split_seed", 0))
    test = {tuple(p) for p in full.problems[bh.split_by_shape(full, seed) == 2].tolist()}
    return np.array([2 if tuple(p) in test else -1 for p in table.problems.tolist()])


def _shape_keys(table: bh.BmmTable) -> list[tuple]:
    """Each problem's shape across devices: its columns but the batch (the last)."""
    return [tuple(p[:-1]) for p in table.problems.tolist()]


def transfer_cv(h200: bh.BmmTable, h100: bh.BmmTable, version: int, s: bh.BmmHeadSettings, seed: int,
                joint: bool, specs: tuple[str, str] = ("h200", "h100-sxm")) -> dict[str, Any]:
    """5-fold CV by shape on the H200's problems of heads fitted on the H100's rows (encoded for the H100)
    of the shapes outside the fold -- and, with joint, on the H200's rows outside the fold too (encoded for
    the H200): no held-out shape is seen on either device. bmm_metrics over every H200 problem, "cv/".
    specs: the two tables' devices (swapped, the H100's problems are judged with the H200's rows added)."""
    x2, xa2 = bh.encode(h200, get_spec(specs[0]), version)
    x1, xa1 = bh.encode(h100, get_spec(specs[1]), version)
    y2, y1 = np.log(h200.ms), np.log(h100.ms)
    ok2, yc2 = bh.call_targets(h200)
    ok1, yc1 = bh.call_targets(h100)
    floor = bh.floor_column("bmm", get_spec(specs[0]), version)
    assert floor == bh.floor_column("bmm", get_spec(specs[1]), version)
    fold = bh.shape_folds(h200, s.cv_folds, seed)
    keys2, keys1 = _shape_keys(h200), _shape_keys(h100)
    pred, pred_call = np.zeros(len(h200.ms)), np.zeros(len(h200.problems))
    for f in range(s.cv_folds):
        held = fold == f
        held_keys = {k for k, h in zip(keys2, held) if h}
        keep1 = np.array([k not in held_keys for k in keys1])
        parts = [(x1, y1, h100.problem_idx, keep1, 0)]
        call_parts = [(xa1, yc1, keep1 & ok1)]
        if joint:
            parts.append((x2, y2, h200.problem_idx, ~held, len(h100.problems)))
            call_parts.append((xa2, yc2, ~held & ok2))
        rows = [keep[idx] for _, _, idx, keep, _ in parts]
        xt = torch.cat([x[torch.from_numpy(r)] for (x, *_), r in zip(parts, rows)])
        yt = torch.from_numpy(np.concatenate([y[r] for (_, y, *_), r in zip(parts, rows)])).float()
        group = np.concatenate([idx[r] + off for (_, _, idx, _, off), r in zip(parts, rows)])
        head = bh.fit_ranked(xt, yt, group, s, s.seed, floor)
        xc = torch.cat([xa[torch.from_numpy(m)] for xa, _, m in call_parts])
        yc = torch.from_numpy(np.concatenate([y[m] for _, y, m in call_parts])).float()
        call = bh.fit_ensemble(lambda i: bh.fit_call(xc, yc, s, s.seed + i), s.call_members, "before_floor",
                               single_as_is=False)
        r2 = held[h200.problem_idx]
        pred[r2] = bh.predict_log_ms(head, x2[torch.from_numpy(r2)])
        pred_call[held] = bh.score(call, xa2[torch.from_numpy(held)])
    aten = bh.implied_aten_log_ms(h200, pred, pred_call)
    m = bh.bmm_metrics(h200, np.full(len(h200.problems), 2), pred, aten, pred_call)
    return {"cv/" + k.removeprefix("test/"): v for k, v in m.items()}


def settings(bundle: artifact.ModelBundle, threads: int) -> bh.BmmHeadSettings:
    """The folder's recorded bmm settings, one member per fold, no static rows."""
    rec = bundle.metadata["bmm_settings"]
    names = {f.name for f in fields(bh.BmmHeadSettings)} - {"model", "data"}
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in rec.items() if k in names}
    return replace(bh.BmmHeadSettings(**kw), static_rows=False, cv_members=1, cv_folds=5, threads=threads)


def summary(m: dict[str, Any], prefix: str) -> str:
    top = " · ".join(f"{k} {m[f'{prefix}/{k}/top1_eff']:.3f} / {m[f'{prefix}/{k}/top5_eff']:.3f}"
                     for k in KEYS if f"{prefix}/{k}/top1_eff" in m)
    return f"{top} · call {m[f'{prefix}/call/accuracy']:.3f} (always Triton {m[f'{prefix}/call/accuracy_always_triton']:.3f})"


def judge_h100(bundle: artifact.ModelBundle, h100: bh.BmmTable, h200: bh.BmmTable, args: Any) -> int:
    """--judge-h100: the H100's own CV by shape, beside the same folds fitted on the H200's rows too."""
    s, version = settings(bundle, args.threads), bundle.encoders["gemm"].version
    seed = int(bundle.metadata.get("settings", {}).get("seed", 0))
    out: dict[str, Any] = {"h100_problems": len(h100.problems), "h200_problems": len(h200.problems)}
    m = bh.cross_validate(h100, get_spec("h100-sxm"), version, s, seed, None, lambda *a: None)
    out.update({"h100_own_cv/" + k.removeprefix("cv/"): v for k, v in m.items()})
    print(f"5-fold CV by shape on the H100's problems, its own rows: {summary(out, 'h100_own_cv')}")
    m = transfer_cv(h100, h200, version, s, seed, True, specs=("h100-sxm", "h200"))
    out.update({"h100_joint_cv/" + k.removeprefix("cv/"): v for k, v in m.items()})
    print(f"the same folds, with the H200's rows of the other folds' shapes: {summary(out, 'h100_joint_cv')}")
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models/h100")
    ap.add_argument("--h100", type=Path, default=REPO / "data/h100")
    ap.add_argument("--h200", type=Path, default=REPO / "data/h200")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-cv", action="store_true", help="zero-shot only (seconds, not minutes)")
    ap.add_argument("--judge-h100", action="store_true",
                    help="instead: a CV by shape on the H100's problems of heads fitted on its own rows, and on "
                         "its rows and the H200's (do the H200's rows help the H100?)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    bundle = artifact.load(args.model)
    if artifact.BMM not in bundle.heads or artifact.BMM_CALL not in bundle.heads:
        ap.error(f"--model: {args.model} has no bmm and bmm_call heads (perfmodel bmm-head)")
    h200 = bh.load_bmm_checked(args.h200, "h200")
    full = bh.load_bmm_checked(args.h100, "h100-sxm")  # every H100 problem, not only the shared 600
    if args.judge_h100:
        return judge_h100(bundle, full, h200, args)
    with tempfile.TemporaryDirectory() as tmp:  # the H100's shards of the same problems
        for name in SHARDS:
            (Path(tmp) / name).symlink_to((args.h100 / name).resolve())
        h100 = bh.load_bmm_checked(Path(tmp), "h100-sxm")
    out: dict[str, Any] = {"model": str(args.model.relative_to(REPO) if args.model.is_relative_to(REPO) else args.model),
                           "h100_problems": len(h100.problems), "h200_problems": len(h200.problems)}
    out.update(zero_shot(bundle, h200, "h200"))
    print(f"H100 heads zero-shot on the H200 ({len(h200.problems)} problems, most of whose shapes they were "
          f"fitted on, on the H100): {summary(out, 'zero_shot')}")
    split = held_out_split(bundle, full, h200)
    out.update({k.replace("zero_shot/", "zero_shot_held_out/", 1): v
                for k, v in zero_shot(bundle, h200, "h200", split).items()})
    print(f"  on the {int((split == 2).sum())} whose shapes the heads held out (their test split): "
          f"{summary(out, 'zero_shot_held_out')}")
    out.update({k.replace("zero_shot/", "h100_rows/", 1): v for k, v in zero_shot(bundle, h100, "h100-sxm").items()})
    print(f"the same heads on the H100's rows of those problems (most were in their training set): "
          f"{summary(out, 'h100_rows')}")
    if not args.no_cv:
        s = settings(bundle, args.threads)
        version = bundle.encoders["gemm"].version
        seed = int(bundle.metadata.get("settings", {}).get("seed", 0))
        for dev, table, spec in (("h200", h200, "h200"), ("h100", h100, "h100-sxm")):
            t0 = time.perf_counter()
            m = bh.cross_validate(table, get_spec(spec), version, s, seed, None, lambda *a: None)
            out.update({f"{dev}_cv/" + k.removeprefix("cv/"): v for k, v in m.items()})
            out[f"{dev}_cv/seconds"] = time.perf_counter() - t0
            print(f"5-fold CV by shape on the {dev.upper()}'s own rows: {summary(out, f'{dev}_cv')}")
        for name, joint in (("from_h100", False), ("joint", True)):
            t0 = time.perf_counter()
            m = transfer_cv(h200, full, version, s, seed, joint)
            out.update({f"{name}_cv/" + k.removeprefix("cv/"): v for k, v in m.items()})
            out[f"{name}_cv/seconds"] = time.perf_counter() - t0
            what = "the H100's rows" + (" and the H200's" if joint else "")
            print(f"5-fold CV by shape on the H200's problems, fitted on {what} of the other folds' shapes: "
                  f"{summary(out, f'{name}_cv')}")
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
