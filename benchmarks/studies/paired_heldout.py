"""Two model folders on the same held-out problems, problem by problem (CPU).

Each folder's serving path (the screen, the lead and the ensemble, as `perfmodel eval` scores it) ranks every
measured config of the test problems of a dataset's split (seed 0, the shipped folders'); per dtype group the
geomean top-1 (or top-5) efficiency of each folder, and a paired bootstrap over the problems (5,000 draws, seeded)
of the difference b - a: a 95 % interval that excludes 0 says the two differ by more than the choice of test
problems explains. Used to judge a retrain against the folder it replaces, e.g. the recipe-built models/h100
against the folder shipped before it (encoder version 2, in git history):

    mkdir -p /tmp/v2 && git archive 16eb8ea models/h100 | tar -x -C /tmp/v2
    python -m benchmarks.studies.paired_heldout --a /tmp/v2/models/h100 --a-name "models/h100 at 16eb8ea" --b models/h100 \
        [--data data/h100] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks import REPO

GROUPS = {"fp16": ("float16",), "bf16": ("bfloat16",), "fp32 (tf32 + IEEE)": ("tf32", "float32")}


def per_problem_figures(folder: Path, test) -> dict[str, np.ndarray]:
    from perfmodel import artifact
    from perfmodel.train.evaluate import head_outputs, lead_outputs
    from perfmodel.train.metrics import per_problem, screened

    b = artifact.load(folder)
    P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
    with torch.inference_mode():
        x = b.encoders["gemm"].encode(P, C)
        score, pred = head_outputs(b.heads["gemm"], x)
        screen = head_outputs(b.heads[b.screen_name], x)[0] if b.screen_name else None
        lead = lead_outputs(b.heads["gemm"], x) if b.lead_keep else None
    rank = screened(test, score, pred, screen, b.screen_keep, lead, b.lead_keep) if screen is not None else score
    return per_problem(test, rank)


def compare(a: Path, b: Path, data: Path, draws: int = 5000, seed: int = 0) -> dict:
    from perfmodel.train.data import load_gemm, split_problems

    gemm = load_gemm(data)
    test = gemm.subset(split_problems(gemm.modes, 0) == 2)
    fa, fb = per_problem_figures(a, test), per_problem_figures(b, test)
    rng = np.random.default_rng(seed)
    out: dict = {"a": str(a), "b": str(b), "data": str(data), "test_problems": int(len(test.problems)), "groups": {}}
    for name, modes in GROUPS.items():
        mask = np.isin(test.modes, modes)
        n = int(mask.sum())
        if n == 0:
            continue
        draw = [rng.integers(0, n, n) for _ in range(draws)]
        for key in ("top1", "top5"):
            la, lb = np.log(fa[key][mask]), np.log(fb[key][mask])
            diffs = np.array([np.exp(lb[i].mean()) - np.exp(la[i].mean()) for i in draw])
            out["groups"][f"{name}/{key}"] = {
                "problems": n, "a": float(np.exp(la.mean())), "b": float(np.exp(lb.mean())),
                "diff_ci95": [float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))],
                "problems_differing": int((np.abs(la - lb) > 1e-9).sum()),
                "b_worst_problems": [float(v) for v in np.sort(np.exp(lb))[:3]]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="the folder compared against (e.g. the one replaced)")
    ap.add_argument("--b", type=Path, required=True, help="the folder judged")
    ap.add_argument("--a-name", help="what --out records for --a (default: its path), e.g. 'models/h100 at 16eb8ea'")
    ap.add_argument("--data", type=Path, default=REPO / "data/h100")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    r = compare(args.a, args.b, args.data)
    for g, v in r["groups"].items():
        print(f"{g}: {v['problems']} problems; a {v['a']:.4f}, b {v['b']:.4f}; b - a 95 % interval "
              f"[{v['diff_ci95'][0]:+.4f}, {v['diff_ci95'][1]:+.4f}]; {v['problems_differing']} problems differ; "
              f"b's worst {', '.join(f'{x:.3f}' for x in v['b_worst_problems'])}")
    if args.out:
        r["a"], r["data"] = args.a_name or str(args.a), args.data.name
        args.out.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
