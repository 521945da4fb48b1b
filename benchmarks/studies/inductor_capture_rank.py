"""The model's ranking of Inductor's own template, judged on Inductor's own timings, on shapes the data does not hold.

GPU (--capture OUT): for each shape of SHAPES, torch.mm compiled by Inductor under max-autotune with the
EXHAUSTIVE mm search space, 70 of its configs drawn at random per shape (--sample; static shapes, pad_mm off so it sees the shape as given), and every Triton mm-template
choice Inductor benchmarks captured with the time Inductor measured for it (select_algorithm.add_feedback_saver;
benchmarks/studies/kernel_fidelity.py capture_inductor): Inductor's template, compiled and timed by Inductor.
Resumable: shapes already in OUT are skipped, OUT is rewritten after each shape.

CPU (--rank CAPTURE --model M [--model M2 ...]): each model ranks each shape's captured configs in each kernel mode
it serves; top-1 = Inductor's best time / Inductor's time of the model's first pick, top-5 = Inductor's best / the
best of the model's five; per dtype mode and layout, the worst shapes listed. --check-unseen prints, for each
shape, whether its weight shape (the family key, train/families.py) or the problem itself is in the data folders.

    python -m benchmarks.studies.inductor_capture_rank --capture OUT.json [--budget S] [--sample 70]   # GPU
    python -m benchmarks.studies.inductor_capture_rank --rank OUT.json --model models/h200 --device h200 [--out R.json]
    python -m benchmarks.studies.inductor_capture_rank --check-unseen --data data/h100 --data data/h200
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# (name, M, K, N, mode, transpose_left, transpose_right): C[M, N] = A[M, K] @ B[K, N] (transpose_right: B stored
# as [N, K], a linear layer's weight: the NT layout). Weight shapes (K, N) of models the dataset's lists do not
# name, odd and aligned sizes, decode to prefill; fp16, bf16, TF32 and IEEE fp32, both layouts.
SHAPES = [
    ("fp16 1536x2560x7680 NT", 1536, 2560, 7680, "float16", False, True),
    ("fp16 200x5120x1280 NT", 200, 5120, 1280, "float16", False, True),
    ("fp16 3000x1152x4608", 3000, 1152, 4608, "float16", False, False),
    ("fp16 24x6144x2304 NT", 24, 6144, 2304, "float16", False, True),
    ("bf16 2047x3200x8640 NT", 2047, 3200, 8640, "bfloat16", False, True),
    ("bf16 8x2560x10240 NT", 8, 2560, 10240, "bfloat16", False, True),
    ("bf16 1000x1536x1536", 1000, 1536, 1536, "bfloat16", False, False),
    ("bf16 4096x5120x640 NT", 4096, 5120, 640, "bfloat16", False, True),
    ("tf32 1500x1280x3840 NT", 1500, 1280, 3840, "tf32", False, True),
    ("tf32 777x2304x1152", 777, 2304, 1152, "tf32", False, False),
    ("tf32 64x3072x6144 NT", 64, 3072, 6144, "tf32", False, True),
    ("fp32 1024x1280x2560 NT", 1024, 1280, 2560, "float32", False, True),
    ("fp32 513x640x1920", 513, 640, 1920, "float32", False, False),
    ("fp32 2048x896x896 NT", 2048, 896, 896, "float32", False, True),
    ("fp16 2500x896x3584", 2500, 896, 3584, "float16", False, False),
    ("bf16 96x7168x1792 NT", 96, 7168, 1792, "bfloat16", False, True),
]


def problem(shape) -> Any:
    from perfmodel import GemmProblem

    _, M, K, N, mode, tl, tr = shape
    return GemmProblem(m=M, n=N, k=K, dtype="float32" if mode in ("tf32", "float32") else mode,
                       allow_tf32=mode == "tf32", transpose_left=tl, transpose_right=tr)


def sampled_exhaustive(sample: int, seed: str) -> Any:
    """A patch of Inductor's template heuristics: the EXHAUSTIVE mm space as `sample` of its configs drawn at random
    (seeded by `seed`, the shape's name), before Inductor scales and dedupes them for the shape; the full space is
    1,875 configs a shape, more than a call can compile."""
    import functools
    import random
    from unittest import mock

    from torch._inductor.template_heuristics import triton as th

    def get(self: Any) -> Any:
        configs = list(self.exhaustive_configs)
        drawn = random.Random(seed).sample(configs, min(sample, len(configs)))
        return functools.partial(self.preprocess_mm_configs, configs=drawn)

    return mock.patch.object(th.BaseConfigHeuristic, "get_exhaustive_mm_configs", get)


def capture(out: Path, budget: float | None, sample: int) -> int:
    import torch
    from torch._inductor import config as ind_config

    from benchmarks.studies.kernel_fidelity import capture_inductor

    res = json.loads(out.read_text()) if out.is_file() else {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "search_space": "EXHAUSTIVE",
        "sample": sample, "shapes": []}
    done = {s["name"] for s in res["shapes"]}
    t0 = time.perf_counter()
    for shape in SHAPES:
        if shape[0] in done:
            continue
        if budget is not None and time.perf_counter() - t0 > budget:
            print(f"budget: {budget:.0f} s spent, {shape[0]} and later left", flush=True)
            break
        try:
            with ind_config.patch(max_autotune_gemm_search_space="EXHAUSTIVE"), sampled_exhaustive(sample, shape[0]):
                got = capture_inductor(shape)
        except Exception as exc:  # recorded, the next shape goes on
            got = {"name": shape[0], "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        res["shapes"].append(got)
        n = sum(c["kind"] == "triton" for c in got.get("choices", []))
        print(f"{shape[0]}: {n} Triton choices, {got.get('compile_s', 0):.0f} s", flush=True)
        out.write_text(json.dumps(res, indent=1))
    return 0


def rank(capture_file: Path, models: list[Path], device: str | None) -> dict[str, Any]:
    from perfmodel import GemmConfig, Predictor

    cap = json.loads(capture_file.read_text())
    byname = {s[0]: s for s in SHAPES}
    out: dict[str, Any] = {"capture": capture_file.name, "device": cap.get("device"), "torch": cap.get("torch"),
                           "models": {}}
    for model in models:
        base = Predictor.load(model, backend="torch", device=device)
        modes = ("autotune", "inductor") if base.has_static else ("autotune",)
        for kernel in modes:
            p = base.with_kernel(kernel)
            rows = []
            for s in cap["shapes"]:
                tri = [c for c in s.get("choices", []) if c["kind"] == "triton" and np.isfinite(c["ms"])]
                if len(tri) < 2 or s["name"] not in byname:
                    continue
                cfgs = [GemmConfig(*c["config"]) for c in tri]
                ms = {c: t["ms"] for c, t in zip(cfgs, tri)}
                shape = byname[s["name"]]
                order = p.rank(problem(shape), list(ms), top_k=len(ms))  # every config, predict's times and order
                ranked = [c for c, _ in order[:5]]
                best = min(ms.values())
                rows.append({"name": s["name"], "configs": len(ms), "mode": shape[4],
                             "ran_called_unrunnable": sum(not np.isfinite(t) for _, t in order),
                             "layout": ("T" if shape[5] else "N") + ("T" if shape[6] else "N"),
                             "top1": best / ms[ranked[0]], "top5": best / min(ms[c] for c in ranked[:5])})
            out["models"][f"{model.as_posix()}:{kernel}"] = {"summary": summarize(rows), "shapes": rows}
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def agg(sel: list[dict[str, Any]]) -> dict[str, Any]:
        if not sel:
            return {"shapes": 0}
        return {"shapes": len(sel), "top1": float(np.mean([r["top1"] for r in sel])),
                "top5": float(np.mean([r["top5"] for r in sel])), "worst_top1": float(min(r["top1"] for r in sel))}

    out = {"all": agg(rows), "ran_called_unrunnable": sum(r["ran_called_unrunnable"] for r in rows)}
    for mode in ("float16", "bfloat16", "tf32", "float32"):
        out[mode] = agg([r for r in rows if r["mode"] == mode])
    for layout in sorted({r["layout"] for r in rows}):
        out[f"layout/{layout}"] = agg([r for r in rows if r["layout"] == layout])
    out["worst"] = sorted(({"name": r["name"], "top1": r["top1"], "top5": r["top5"]} for r in rows),
                          key=lambda r: r["top1"])[:5]
    return out


def check_unseen(folders: list[Path]) -> list[dict[str, Any]]:
    from perfmodel.features import problems_tensor
    from perfmodel.train.data import load_device_datasets
    from perfmodel.train.families import family_keys

    keys, probs = set(), set()
    for ds in load_device_datasets(folders):
        keys |= set(family_keys(ds.gemm.problems).tolist())
        probs |= set(ds.gemm.problem_keys)
    out = []
    for s in SHAPES:
        p = problems_tensor([problem(s)]).numpy()
        k = family_keys(p)[0]
        out.append({"name": s[0], "family": k, "family_in_data": k in keys})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", type=Path, default=None, help="GPU: capture Inductor's timings into this JSON")
    ap.add_argument("--budget", type=float, default=None, help="--capture: start no shape after this many seconds")
    ap.add_argument("--sample", type=int, default=70, help="--capture: configs drawn from the EXHAUSTIVE space a shape")
    ap.add_argument("--rank", type=Path, default=None, help="CPU: a capture to rank with --model")
    ap.add_argument("--model", type=Path, action="append", default=None)
    ap.add_argument("--device", default=None, help="--rank: the device to predict for (default: the model's)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--check-unseen", action="store_true")
    ap.add_argument("--data", type=Path, action="append", default=None)
    args = ap.parse_args(argv)
    if args.capture:
        return capture(args.capture, args.budget, args.sample)
    if args.check_unseen:
        res = check_unseen(args.data or [Path("data/h100"), Path("data/h200")])
        for r in res:
            print(f"{r['name']:28s} {r['family']:24s} {'IN DATA' if r['family_in_data'] else 'unseen'}")
        return 0 if not any(r["family_in_data"] for r in res) else 1
    if not args.rank or not args.model:
        ap.error("one of --capture, --rank (with --model) or --check-unseen")
    res = rank(args.rank, args.model, args.device)
    text = json.dumps(res, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    for name, m in res["models"].items():
        s = m["summary"]
        print(f"{name}: " + "; ".join(f"{k} {v['top1']:.3f}/{v['top5']:.3f} ({v['shapes']})"
                                      for k, v in s.items() if isinstance(v, dict) and v.get("shapes"))
              + f"; configs that ran predicted unrunnable: {s['ran_called_unrunnable']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
