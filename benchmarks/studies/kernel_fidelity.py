"""GPU: how close the dataset's kernel comes to Inductor's own mm template, config by config.

For each shape, torch.mm is compiled by Inductor under max-autotune (static shapes, its pad_mm pass
off so that it sees the shape as given) and every Triton mm-template choice Inductor benchmarks is
captured with its time, through `torch._inductor.select_algorithm.add_feedback_saver`: Inductor's own
template, as Inductor compiles and benchmarks it. Then, for the same configs, in one process:

  v4   the dataset's kernel (data_gen/kernel.py: the template's body, Triton's default specialisation)
  v3   the previous dataset kernel (M and N not specialised)

are compiled in parallel worker processes, checked against an fp64 reference, and timed side by side
with data_gen.measure.Bench (L2 flushed, GPU spin, median). Each config is run with the tf32 setting
Inductor's template used (Inductor turns tf32 off for M, N not multiples of 16 or K of 8).

Reported per shape: configs compared, median of v4/Inductor and v3/Inductor per config, the Spearman
rank correlation of v4 (v3) times with Inductor's, and the time of v4's best config over Inductor's best.
Target: median v4/Inductor within 1.00 +- 0.03, per-shape Spearman >= 0.9.

    python -m benchmarks.studies.kernel_fidelity [--out benchmarks/results/kernel_fidelity_h100.json] [--only NAME]
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import REPO

# (name, M, K, N, mode, transpose_left, transpose_right): C[M, N] = A[M, K] @ B[K, N]; mode float16,
# bfloat16, tf32 (fp32 inputs, tf32 on) or float32 (tf32 off). Both layouts, aligned and unaligned dims,
# decode (M = 1..32) to 1e12 FLOP.
SHAPES = [
    ("fp16 bert ffn up", 2048, 768, 3072, "float16", False, False),
    ("fp16 bert ffn down NT", 2048, 3072, 768, "float16", False, True),
    ("fp16 4096^3", 4096, 4096, 4096, "float16", False, False),
    ("fp16 8192^3 NT", 8192, 8192, 8192, "float16", False, True),
    ("fp16 decode 16x4096x4096", 16, 4096, 4096, "float16", False, False),
    ("fp16 decode 1x4096x14336 NT", 1, 4096, 14336, "float16", False, True),
    ("fp16 odd 1000^3", 1000, 1000, 1000, "float16", False, False),
    ("fp16 odd 4095x4097x1000 TN", 4095, 4097, 1000, "float16", True, False),
    ("fp16 alexnet fc8 128x4096x1000", 128, 4096, 1000, "float16", False, False),
    ("fp16 tiny 64^3", 64, 64, 64, "float16", False, False),
    ("fp16 prefill 512x4096x6144 NT", 512, 4096, 6144, "float16", False, True),
    ("bf16 mlp 4096x4096x14336 NT", 4096, 4096, 14336, "bfloat16", False, True),
    ("bf16 mlp 8192x4096x28672 NT", 8192, 4096, 28672, "bfloat16", False, True),
    ("bf16 odd 3000x4095x2049", 3000, 4095, 2049, "bfloat16", False, False),
    ("bf16 decode 32x4096x4096 NT", 32, 4096, 4096, "bfloat16", False, True),
    ("bf16 2048^3 TN", 2048, 2048, 2048, "bfloat16", True, False),
    ("bf16 qwen 333x3584x4608 NT", 333, 3584, 4608, "bfloat16", False, True),
    ("bf16 decode 1x4096x4096", 1, 4096, 4096, "bfloat16", False, False),
    ("tf32 2048^3", 2048, 2048, 2048, "tf32", False, False),
    ("tf32 4096^3 NT", 4096, 4096, 4096, "tf32", False, True),
    ("tf32 odd 1000^3", 1000, 1000, 1000, "tf32", False, False),
    ("tf32 64x4096x4096 NT", 64, 4096, 4096, "tf32", False, True),
    ("fp32 1024^3", 1024, 1024, 1024, "float32", False, False),
    ("fp32 odd 777x1234x555 NT", 777, 1234, 555, "float32", False, True),
    ("fp32 16x4096x4096", 16, 4096, 4096, "float32", False, False),
    ("fp32 2048x2048x512 TN", 2048, 512, 2048, "float32", True, False),
]


def _torch_dtype(mode: str):
    import torch

    return torch.float32 if mode in ("tf32", "float32") else getattr(torch, mode)


def operands(M: int, K: int, N: int, mode: str, tl_: bool, tr: bool, seed: int = 0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = _torch_dtype(mode)
    a = torch.randn(K, M, device="cuda", dtype=dt, generator=g).t() if tl_ else torch.randn(M, K, device="cuda", dtype=dt, generator=g)
    b = torch.randn(N, K, device="cuda", dtype=dt, generator=g).t() if tr else torch.randn(K, N, device="cuda", dtype=dt, generator=g)
    return a, b


def capture_inductor(shape) -> dict[str, Any]:
    """Inductor's mm-template choices for one shape and the times Inductor measured for them."""
    import torch
    from torch._inductor import config as ind_config
    from torch._inductor.select_algorithm import add_feedback_saver, clear_feedback_savers
    from torch._inductor.utils import fresh_inductor_cache

    name, M, K, N, mode, tl_, tr = shape
    a, b = operands(M, K, N, mode, tl_, tr)
    got: list[dict[str, Any]] = []

    def saver(timings, op_name, input_nodes, choices, profiled_fn, precompile_times=None):
        for choice, ms in timings.items():
            info = choice.info_dict() if hasattr(choice, "info_dict") else {}
            if "tile_shape" not in info:
                got.append({"kind": "extern", "name": getattr(choice, "name", str(choice)), "ms": float(ms)})
                continue
            bm, bk, bn = ast.literal_eval(str(info["tile_shape"]))
            got.append({"kind": "triton", "name": getattr(choice, "name", ""), "ms": float(ms),
                        "config": [bm, bn, bk, int(info.get("GROUP_M", 8)), int(info["num_stages"]),
                                   int(info["num_warps"])],
                        "allow_tf32": str(info.get("allow_tf32")) == "True"})

    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    clear_feedback_savers()
    add_feedback_saver(saver)
    t0 = time.perf_counter()
    with fresh_inductor_cache(), ind_config.patch(max_autotune=True, max_autotune_gemm=True, shape_padding=False,
                                                  max_autotune_gemm_backends="ATEN,TRITON"):
        torch._dynamo.reset()
        fn = torch.compile(torch.mm, dynamic=False)
        fn(a, b)
        torch.cuda.synchronize()
    clear_feedback_savers()
    torch._dynamo.reset()
    return {"name": name, "compile_s": time.perf_counter() - t0, "choices": got}


def static_args(M: int, N: int, K: int, strides: tuple[int, ...], cfg: Any, dtype: Any, tf32: bool
                ) -> tuple[list[int], dict[str, Any]]:
    """The dataset kernel's arguments for a static-shape compile, as Inductor compiles its template: every
    size and stride passed as 1 times a constexpr DIV_ equal to it (data_gen/kernel.py multiplies them
    back), so the compiler sees them as constants (the "v4 static" probe: the v4 source, one compile per
    shape)."""
    from perfmodel.data_gen import kernel

    return kernel._args(M, N, K, strides, cfg, dtype, tf32, static=True)


def launch_static(a: Any, b: Any, c: Any, cfg: Any, tf32: bool) -> None:
    from perfmodel.data_gen import kernel

    M, K = a.shape
    N = b.shape[1]
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    ints, meta = static_args(M, N, K, strides, cfg, a.dtype, tf32)
    kernel.matmul_kernel[(kernel.grid_size(M, N, cfg.block_m, cfg.block_n),)](a, b, c, *ints, **meta)


def _compile(which: str, mode: str, M: int, N: int, K: int, strides: tuple[int, ...], cfg: list[int],
             tf32: bool) -> str:
    """Worker: compile one (kernel, config) for the shape's specialisation; "" or the error."""

    from perfmodel.data_gen import kernel
    from perfmodel.schema import GemmConfig

    c = GemmConfig(*cfg)
    dt = _torch_dtype(mode)
    try:
        if which == "v4":
            kernel.warmup(dt, M, N, K, strides, c, tf32)
        elif which == "v4s":
            ints, meta = static_args(M, N, K, strides, c, dt, tf32)
            kernel.matmul_kernel.warmup(dt, dt, dt, *ints, **meta, grid=(1,))
        else:
            kernel.matmul_kernel_v3.warmup(
                dt, dt, dt, M, N, K, *strides, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                GROUP_M=c.group_m, INPUT_PRECISION=kernel.input_precision(dt, tf32),
                A_M_CONTIGUOUS=strides[0] == 1, B_N_CONTIGUOUS=strides[3] == 1,
                num_stages=c.num_stages, num_warps=c.num_warps, grid=(1,))
        return ""
    except Exception as exc:  # recorded per config in the results
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def spearman(x: list[float], y: list[float]) -> float:
    if len(x) < 3:
        return float("nan")
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    return float(np.corrcoef(rx, ry)[0, 1])


def time_ours(shape, captured: dict[str, Any], bench, static: bool = False) -> dict[str, Any]:
    import torch

    from perfmodel.data_gen import kernel
    from perfmodel.data_gen.measure import TOLERANCE
    from perfmodel.schema import GemmConfig

    name, M, K, N, mode, tl_, tr = shape
    a, b = operands(M, K, N, mode, tl_, tr)
    ref = (a.double() @ b.double()).float()
    ref_norm = ref.norm()
    c = torch.empty(M, N, device="cuda", dtype=a.dtype)
    rows, timed_rows, fns = [], [], []
    variants = [("v4", kernel.launch), ("v3", kernel.launch_v3)] + ([("v4s", launch_static)] if static else [])
    for ch in captured["choices"]:
        if ch["kind"] != "triton" or not np.isfinite(ch["ms"]):
            continue
        cfg = GemmConfig(*ch["config"]) if ch["config"][5] in (1, 2, 4, 8) else None
        if cfg is None:
            continue
        tf32 = ch["allow_tf32"] and mode == "tf32"
        tol = TOLERANCE[("float32" if mode in ("tf32", "float32") else mode, mode == "tf32")]
        row = {"config": ch["config"], "inductor_ms": ch["ms"], "tf32": tf32}
        ok = True
        for which, launch in variants:
            c.fill_(float("nan"))
            try:
                launch(a, b, c, cfg, tf32)
                err = ((c.float() - ref).norm() / ref_norm).item()
            except Exception as exc:  # out of resources: recorded
                row[f"{which}_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
                ok = False
                continue
            row[f"{which}_rel_err"] = err
            if not err <= max(tol, 1e-2 if mode == "tf32" else tol):
                row[f"{which}_error"] = f"wrong result (rel err {err:.3g})"
                ok = False
        if not ok:
            rows.append(row)
            continue
        fns += [lambda cfg=cfg, tf32=tf32, launch=launch: launch(a, b, c, cfg, tf32) for _, launch in variants]
        rows.append(row)
        timed_rows.append(row)
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    timed = bench.time_many(fns + [lambda: torch.mm(a, b)])
    it = iter(timed[:-1])
    for row in timed_rows:  # every variant of a row ran right, else none of them was timed
        for which, _ in variants:
            row[f"{which}_ms"] = next(it)[0]
    good = [r for r in rows if "v4_ms" in r]
    ind = [r["inductor_ms"] for r in good]
    v4 = [r["v4_ms"] for r in good]
    v3 = [r["v3_ms"] for r in good]
    best_ind = min(range(len(good)), key=lambda i: ind[i]) if good else None
    best_v4 = min(range(len(good)), key=lambda i: v4[i]) if good else None
    out_static = {}
    if static and good:
        v4s = [r["v4s_ms"] for r in good]
        out_static = {"median_v4s_over_inductor": statistics.median(x / y for x, y in zip(v4s, ind)),
                      "spearman_v4s": spearman(v4s, ind), "spearman_v4s_vs_v4": spearman(v4s, v4),
                      "median_v4s_over_v4": statistics.median(x / y for x, y in zip(v4s, v4))}
    return {
        **out_static,
        "name": name, "M": M, "K": K, "N": N, "mode": mode, "transpose_left": tl_, "transpose_right": tr,
        "flops": 2.0 * M * N * K, "inductor_compile_s": captured["compile_s"], "configs": rows,
        "n": len(good), "torch_mm_ms": timed[-1][0],
        "aten_inductor_ms": next((ch["ms"] for ch in captured["choices"] if ch["kind"] == "extern"), None),
        "median_v4_over_inductor": statistics.median(x / y for x, y in zip(v4, ind)) if good else None,
        "median_v3_over_inductor": statistics.median(x / y for x, y in zip(v3, ind)) if good else None,
        "spearman_v4": spearman(v4, ind), "spearman_v3": spearman(v3, ind),
        # Inductor's time of the config v4 ranks first, over Inductor's best: what ranking by v4 costs.
        "v4_pick_regret": ind[best_v4] / ind[best_ind] if good else None,
        "tf32_used": sorted({r["tf32"] for r in good}),
    }


def inductor_repeat(row: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """A second capture of the same shape against the first: how well Inductor's own benchmark agrees with
    itself, config by config -- the ceiling of any kernel's Spearman against one capture."""
    second = {tuple(ch["config"]): ch["ms"] for ch in again["choices"] if ch["kind"] == "triton"}
    good = [r for r in row["configs"] if "v4_ms" in r and np.isfinite(second.get(tuple(r["config"]), np.nan))]
    first = [r["inductor_ms"] for r in good]
    repeat = [second[tuple(r["config"])] for r in good]
    v4 = [r["v4_ms"] for r in good]
    return {"n": len(good), "spearman_inductor_self": spearman(repeat, first),
            "spearman_v4_vs_repeat": spearman(v4, repeat),
            "spearman_v4_vs_mean": spearman(v4, [(x + y) / 2 for x, y in zip(first, repeat)]),
            "median_repeat_over_first": statistics.median(y / x for x, y in zip(first, repeat)) if good else None}


def markdown(res: dict[str, Any]) -> str:
    lines = [f"Dataset kernel v4 and v3 against Inductor's mm template ({res['device']}, torch {res['torch']}, "
             f"triton {res['triton']}); per config: kernel time / Inductor's benchmarked time", "",
             "| shape | MxKxN | layout | configs | v4/Inductor (median) | Spearman v4 | v3/Inductor (median) "
             "| Spearman v3 | v4 pick / Inductor best | tf32 in template |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in res["shapes"]:
        if "error" in s:
            lines.append(f"| {s['name']} | error: {s['error'][:100]} |||||||||")
            continue
        lay = ("T" if s["transpose_left"] else "N") + ("T" if s["transpose_right"] else "N")
        f = lambda v, d=3: "-" if v is None or v != v else f"{v:.{d}f}"  # noqa: E731
        lines.append(f"| {s['name']} | {s['M']}x{s['K']}x{s['N']} | {lay} | {s['n']} | "
                     f"{f(s['median_v4_over_inductor'])} | {f(s['spearman_v4'], 2)} | {f(s['median_v3_over_inductor'])} "
                     f"| {f(s['spearman_v3'], 2)} | {f(s['v4_pick_regret'])} | {s['tf32_used']} |")
    st = [s for s in res["shapes"] if "spearman_v4s" in s]
    if st:
        lines += ["", "The v4 source compiled with every size and stride a constant (`--static`, as Inductor's template is "
                      "compiled), beside v4 as the dataset compiles it.", "",
                  "| shape | configs | v4 static/Inductor (median) | Spearman v4 static | Spearman v4 | v4 static/v4 (median) "
                  "| Spearman v4 static vs v4 |", "|---|---:|---:|---:|---:|---:|---:|"]
        for s in st:
            lines.append(f"| {s['name']} | {s['n']} | {s['median_v4s_over_inductor']:.3f} | {s['spearman_v4s']:.2f} | "
                         f"{s['spearman_v4']:.2f} | {s['median_v4s_over_v4']:.3f} | {s['spearman_v4s_vs_v4']:.2f} |")
    rep = [s for s in res["shapes"] if s.get("inductor_repeat")]
    if rep:
        lines += ["", "Inductor captured twice (`--repeat-inductor`): its own benchmark against itself, config by config.", "",
                  "| shape | configs | Spearman Inductor vs itself | Spearman v4 vs 1st | v4 vs 2nd | v4 vs mean of both "
                  "| Inductor 2nd / 1st (median) |", "|---|---:|---:|---:|---:|---:|---:|"]
        for s in rep:
            r = s["inductor_repeat"]
            lines.append(f"| {s['name']} | {r['n']} | {r['spearman_inductor_self']:.2f} | {s['spearman_v4']:.2f} | "
                         f"{r['spearman_v4_vs_repeat']:.2f} | {r['spearman_v4_vs_mean']:.2f} | "
                         f"{r['median_repeat_over_first']:.3f} |")
    ok = [s for s in res["shapes"] if s.get("n")]
    if ok:
        allr = [r["v4_ms"] / r["inductor_ms"] for s in ok for r in s["configs"] if "v4_ms" in r]
        allr3 = [r["v3_ms"] / r["inductor_ms"] for s in ok for r in s["configs"] if "v3_ms" in r]
        sp = [s["spearman_v4"] for s in ok if s["spearman_v4"] == s["spearman_v4"]]
        lines += ["", f"- shapes {len(ok)}, configs {len(allr)}: median per-config v4/Inductor "
                      f"{statistics.median(allr):.3f} (v3: {statistics.median(allr3):.3f}); "
                      f"per-shape Spearman v4 min {min(sp):.2f}, median {statistics.median(sp):.2f}; "
                      f"shapes with median ratio within 1.00 +- 0.03: "
                      f"{sum(abs(s['median_v4_over_inductor'] - 1) <= 0.03 for s in ok)} of {len(ok)}",
                  f"- wall {res['wall_s']:.0f} s (Inductor capture {res['capture_s']:.0f} s, our compiles "
                  f"{res['compile_s']:.0f} s for {res['kernels']} kernels)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "kernel_fidelity.json")
    ap.add_argument("--only", action="append", help="only this shape name (repeatable)")
    ap.add_argument("--index", default=None, help="only these shapes, by comma-separated index into SHAPES")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="only combine earlier --out JSON files into one table (a later file's shape wins)")
    ap.add_argument("--static", action="store_true",
                    help="also time the v4 source compiled with every size and stride a constant (as Inductor's "
                         "static-shape template is), one compile per shape")
    ap.add_argument("--repeat-inductor", action="store_true",
                    help="capture each shape from Inductor a second time: its benchmark's agreement with itself")
    ap.add_argument("--capture-budget", type=float, default=None,
                    help="seconds: capture no further shapes from Inductor after this long")
    args = ap.parse_args(argv)
    if args.merge:
        parts = [json.loads(f.read_text()) for f in args.merge]
        shapes: dict[str, dict] = {}
        for f, part in zip(args.merge, parts):
            for s in part["shapes"]:
                if "error" not in s:
                    shapes[s["name"]] = {**s, "from": f.name}
        order = {s[0]: i for i, s in enumerate(SHAPES)}
        res = {**{k: parts[-1][k] for k in ("device", "torch", "triton")}, "merged_from": [f.name for f in args.merge],
               "shapes": sorted(shapes.values(), key=lambda s: order.get(s["name"], len(order))),
               "wall_s": sum(p.get("wall_s", 0) for p in parts), "capture_s": sum(p.get("capture_s", 0) for p in parts),
               "compile_s": sum(p.get("compile_s", 0) for p in parts), "kernels": sum(p.get("kernels", 0) for p in parts)}
        args.out.write_text(json.dumps(res, indent=1))
        text = markdown(res) + "\n\n(merged from " + ", ".join(res["merged_from"]) + ")"
        args.out.with_suffix(".md").write_text(text + "\n")
        print(text)
        return 0
    import torch
    import triton

    from perfmodel.data_gen.measure import Bench, TimingSettings

    shapes = [s for s in SHAPES if not args.only or s[0] in args.only]
    if args.index:
        shapes = [SHAPES[int(i)] for i in args.index.split(",")]
    t0 = time.perf_counter()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "shapes": []}
    bench = Bench(torch.device("cuda"), torch.cuda.get_device_properties(0).L2_cache_size,
                  TimingSettings(budget_ms=3.0, min_reps=10, max_reps=50))
    res["capture_s"] = res["compile_s"] = 0.0
    res["kernels"] = 0
    # Shape by shape (Inductor's capture alone on the machine, then our compiles in worker processes,
    # then the timing), writing the results after each: a run cut off keeps every shape it finished.
    with cf.ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
        for s in shapes:
            if args.capture_budget is not None and time.perf_counter() - t0 > args.capture_budget:
                res["shapes"].append({"name": s[0], "error": "not run: --capture-budget reached"})
                continue
            try:
                t1 = time.perf_counter()
                captured = capture_inductor(s)
                res["capture_s"] += time.perf_counter() - t1
                t1 = time.perf_counter()
                _, M, K, N, mode, tl_, tr = s
                strides = ((1, M) if tl_ else (K, 1)) + ((1, K) if tr else (N, 1)) + (N, 1)
                jobs = [pool.submit(_compile, which, mode, M, N, K, strides, ch["config"],
                                    ch["allow_tf32"] and mode == "tf32")
                        for ch in captured["choices"] if ch["kind"] == "triton" and ch["config"][5] in (1, 2, 4, 8)
                        for which in ("v4", "v3") + (("v4s",) if args.static else ())]
                errors = sorted({e for e in (j.result() for j in jobs) if e})
                res["compile_s"] += time.perf_counter() - t1
                res["kernels"] += len(jobs)
                row = time_ours(s, captured, bench, static=args.static)
                row["compile_errors"] = errors[:5]
                if args.repeat_inductor:
                    t1 = time.perf_counter()
                    row["inductor_repeat"] = inductor_repeat(row, capture_inductor(s))
                    res["capture_s"] += time.perf_counter() - t1
                res["shapes"].append(row)
                print(f"{s[0]}: median v4/Inductor {row['median_v4_over_inductor']:.3f}, Spearman "
                      f"{row['spearman_v4']:.2f}", flush=True)
            except Exception as exc:  # one shape failing must not lose the others
                res["shapes"].append({"name": s[0], "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc(limit=5)})
            res["wall_s"] = time.perf_counter() - t0
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(res, indent=1))
    text = markdown(res)
    args.out.with_suffix(".md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
