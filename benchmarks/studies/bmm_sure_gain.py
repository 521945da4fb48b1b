"""How sure must the model be before a bmm skips its benchmark? (CPU)

Both hooks keep a bmm's best ranked Triton config alone -- no aten::bmm beside it, so Inductor benchmarks
nothing -- where the aten::bmm time the model's call implies is at least BMM_SURE_GAIN slower than that
config's predicted time (perfmodel.serve.decisions.bmm_sure). Keeping aten beside it instead costs a compile
and a benchmark, and gets the faster of the two. This script scores each candidate gain on the folder's
held-out bmm problems (the val and test problems of its split by shape; the train problems for scale): of
the problems the rule is sure of, the measured time of the config used alone (the bmm head's best of
Inductor's DEFAULT list, as the hooks rank it) against the better of that config and aten::bmm, as measured.
The gain is chosen on the val problems: the smallest candidate at which that ratio is a geomean 1.002 or
less and 1.15 at worst.

    python -m benchmarks.studies.bmm_sure_gain [--model models/h100] [--data data/h100] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks import REPO

GAINS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5)
GEOMEAN_MAX, WORST_MAX = 1.002, 1.15


def figures(model: Path, data: Path) -> dict:
    from perfmodel import artifact
    from perfmodel.train import bmm_head as bh

    b = artifact.load(model)
    t = bh.load_bmm(data)
    split = bh.split_by_shape(t, int(b.metadata.get("bmm_settings", {}).get("split_seed", 0)))
    x, xa = bh.encode(t, b.spec, b.encoders["gemm"].version)
    pred = bh.predict_log_ms(b.heads[artifact.BMM], x)
    call = bh.score(b.heads[artifact.BMM_CALL], xa)      # log(aten::bmm ms / the best config's ms), predicted
    pick = np.full(len(t.problems), np.nan)               # the measured ms of the head's best listed config
    listed = np.flatnonzero(t.inductor)
    order = listed[np.lexsort((pred[listed], t.problem_idx[listed]))]
    first = order[np.r_[True, t.problem_idx[order][1:] != t.problem_idx[order][:-1]]]
    pick[t.problem_idx[first]] = t.ms[first]
    ok = np.isfinite(pick) & np.isfinite(t.aten_ms)
    loss = pick / np.minimum(pick, t.aten_ms)             # >= 1: what using the config alone costs
    out: dict = {"model": str(model), "data": str(data), "problems": {}, "gains": {}}
    for name, which in (("train", 0), ("val", 1), ("test", 2)):
        part = ok & (split == which)
        out["problems"][name] = int(part.sum())
        for g in GAINS:
            sel = part & (call >= np.log1p(g))
            row = {"sure": int(sel.sum()), "sure_frac": float(sel.sum() / max(part.sum(), 1))}
            if sel.any():
                lo = loss[sel]
                row.update(geomean=float(np.exp(np.log(lo).mean())), p90=float(np.quantile(lo, 0.9)),
                           worst=float(lo.max()), aten_faster_frac=float((lo > 1).mean()))
            out["gains"].setdefault(str(g), {})[name] = row
    ok_val = [g for g in GAINS if out["gains"][str(g)]["val"].get("geomean", 1.0) <= GEOMEAN_MAX
              and out["gains"][str(g)]["val"].get("worst", 1.0) <= WORST_MAX]
    out["chosen_on_val"] = min(ok_val) if ok_val else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models/h100")
    ap.add_argument("--data", type=Path, default=REPO / "data/h100")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    r = figures(args.model, args.data)
    r["model"], r["data"] = args.model.name, args.data.name
    print(f"problems: {r['problems']}")
    for g, row in r["gains"].items():
        print(f"gain {float(g):.2f}: " + "; ".join(
            f"{s} {v['sure']} sure ({v['sure_frac']:.0%})" + (f", alone/best {v['geomean']:.4f} geomean, p90 {v['p90']:.4f}, "
                                                            f"worst {v['worst']:.3f}" if v["sure"] else "")
            for s, v in row.items() if s != "train") + f"; train {row['train']['sure_frac']:.0%} sure")
    print(f"chosen on val (geomean <= {GEOMEAN_MAX}, worst <= {WORST_MAX}): {r['chosen_on_val']}")
    if args.out:
        args.out.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
