"""Pad a bmm or not, when Triton competes? The pad hook's bmm rule on the measured data (CPU).

Inductor's pad_mm pass pads a bmm whose M, K or N is misaligned when its eager benchmark finds aten::bmm on
the padded shape (pad, bmm, slice) faster than on the original. Under the Triton bmm template that benchmark
asks the wrong question: the template runs the unaligned shape with masked loads, and padding adds copies in
front of whichever kernel wins. The pad hook (perfmodel.serve.inductor, install(pad=True) and the whole-model
set-up) leaves a bmm unpadded where the model keeps Triton for it (serve.bmm.leave_unpadded: its best
config of Inductor's DEFAULT list predicted faster than the aten::bmm its call implies), and leaves the rest to
Inductor's benchmark.

On every bmm problem of the dataset that pad_mm would pad (its bmm rows time aten::bmm, the padded path and
the Triton configs), the time each rule ends with, under the set-up's own kernel choice over the problem's timed
configs of Inductor's DEFAULT list (Triton kept where the model predicts it faster: the faster of aten::bmm and
the model's best of those configs, or that config alone
where the model is sure of it (BMM_SURE_GAIN); else aten::bmm alone):
unpadded, that; padded, the padded path as timed (aten::bmm on the padded shape, the copies included).
Inductor's rule is scored with an exact benchmark (it pads where the timed padded path beats aten::bmm); in
a compile its benchmark is noisier. Each rule against the faster of padded and unpadded (geomean, worst), on
the folder's val and test problems of its split by shape and on all of them (the heads were fitted on the
train problems' Triton times; no padded time was fitted).

    python -m benchmarks.studies.bmm_pad_rule [--model models/h100] [--data data/h100] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks import REPO

MODES = {"float16": ("float16", False), "bfloat16": ("bfloat16", False), "tf32": ("float32", True),
         "float32": ("float32", False)}


def padded_rows(data: Path):
    """(BmmTable, per problem the timed padded path's ms: nan where pad_mm would not pad)."""
    from perfmodel.data_gen.shards import read_dataset
    from perfmodel.train import bmm_head as bh

    rows, _ = read_dataset(data, "bmm")
    table = bh.table_from_rows(rows)
    order: dict[str, int] = {}
    for r in rows:  # the table's problem order (table_from_rows: first ok triton/aten row of each unit)
        if r.get("status") == "ok" and r.get("kind") in ("triton", "aten"):
            order.setdefault(r["unit"], len(order))
    pad_ms = np.full(len(table.problems), np.nan)
    for r in rows:
        if r.get("status") == "ok" and r.get("kind") == "aten_pad" and r["unit"] in order:
            pad_ms[order[r["unit"]]] = r["ms"]
    return table, pad_ms


def figures(model: Path, data: Path) -> dict:
    from perfmodel import GemmConfig, GemmProblem, Predictor
    from perfmodel.serve import bmm
    from perfmodel.serve.decisions import BMM_SURE_GAIN, bmm_sure
    from perfmodel.train import bmm_head as bh

    t, pad_ms = padded_rows(data)
    pred = Predictor.load(model, backend="torch")
    pred = pred.with_kernel("inductor") if pred.has_static else pred
    split = bh.split_by_shape(t, int(pred.bundle.metadata.get("bmm_settings", {}).get("split_seed", 0)))
    listed_best = np.full(len(t.problems), np.nan)   # the measured ms of the model's best listed config
    rows = {}
    for j in np.flatnonzero(t.inductor):
        rows.setdefault(int(t.problem_idx[j]), []).append(j)
    idx = [i for i in np.flatnonzero(np.isfinite(pad_ms) & np.isfinite(t.aten_ms)) if i in rows]
    unpadded, sure = np.zeros(len(idx), bool), np.zeros(len(idx), bool)
    for n, i in enumerate(idx):
        r = t.problems[i]
        dtype, tf32 = MODES[t.modes[i]]
        prob = GemmProblem(m=int(r[0]), n=int(r[1]), k=int(r[2]), dtype=dtype, allow_tf32=tf32,
                           transpose_left=bool(r[6]), transpose_right=bool(r[7]), batch=int(r[8]))
        js = rows[i]   # the problem's timed configs of Inductor's list: what a compile of it offers
        offered = [GemmConfig(*(int(v) for v in t.configs[j])) for j in js]
        unpadded[n], best_ms, aten_ms = bmm.leave_unpadded(pred, prob, offered)
        sure[n] = bmm_sure(aten_ms, best_ms, BMM_SURE_GAIN)
        ranked = pred.rank(prob, offered, top_k=1)[0][0]
        listed_best[i] = t.ms[js[offered.index(ranked)]]
    idx = np.array(idx)
    aten, padded, tri = t.aten_ms[idx], pad_ms[idx], listed_best[idx]
    kept = unpadded                                    # the set-up keeps Triton exactly where the rule leaves it unpadded
    unpadded_path = np.where(sure, tri, np.where(kept, np.minimum(aten, tri), aten))  # sure: the config alone
    best = np.minimum(np.minimum(aten, tri), padded)
    inductor = np.where(padded < aten, padded, unpadded_path)
    rule = np.where(unpadded, unpadded_path, inductor)
    out: dict = {"model": model.name, "data": data.name, "problems": int(len(idx)), "splits": {}}
    for name, sel in (("val", split[idx] == 1), ("test", split[idx] == 2), ("all", np.ones(len(idx), bool))):
        def g(v):
            return {"geomean": float(np.exp(np.log(v[sel] / best[sel]).mean())), "worst": float((v[sel] / best[sel]).max())}
        out["splits"][name] = {"problems": int(sel.sum()), "left_unpadded_frac": float(unpadded[sel].mean()),
                               "inductor_pads": int((padded < aten)[sel].sum()),
                               "rule_overrules_inductor": int((unpadded & (padded < aten))[sel].sum()),
                               "overruled_rightly": int((unpadded & (padded < aten) & (unpadded_path <= padded))[sel].sum()),
                               "inductor_exact_benchmark": g(inductor), "rule": g(rule), "never_pad": g(unpadded_path)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models/h100")
    ap.add_argument("--data", type=Path, default=REPO / "data/h100")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    r = figures(args.model, args.data)
    for name, s in r["splits"].items():
        print(f"{name}: {s['problems']} problems pad_mm would pad, {s['left_unpadded_frac']:.0%} left unpadded by the rule; "
              f"against the faster of padded and unpadded: Inductor's rule (exact benchmark) "
              f"{s['inductor_exact_benchmark']['geomean']:.4f} (worst {s['inductor_exact_benchmark']['worst']:.2f}), "
              f"the rule {s['rule']['geomean']:.4f} (worst {s['rule']['worst']:.2f}), never padding "
              f"{s['never_pad']['geomean']:.4f}; the rule overrules Inductor's padding on {s['rule_overrules_inductor']} "
              f"of {s['inductor_pads']}, rightly on {s['overruled_rightly']}")
    if args.out:
        args.out.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
