"""Triton autotuning with and without the model's pruning (GPU; run on the H100).

The kernel is data_gen's canonical Triton GEMM (kernel v4, the one the dataset timed, with Triton's
default specialisation; each config carries the constexprs the launch helper derives for the shape),
wrapped in triton.autotune three ways, each in its own process with an empty Triton cache (TRITON_CACHE_DIR), so
that no variant reuses another's compiled kernels:

  full        autotune over N configs (a stratified sample of the device's pruned space; default 40)
  pruned      the same N configs, pruned to the model's top-k by perfmodel.serve.triton_hook.perfmodel_prune
  model-space the model's top-k of the WHOLE pruned space (no sample: what the model would choose)

Per shape: the wall time of the first (autotuning) launch, which includes compiling every benchmarked
config (kernels compiled for one shape are reused by later shapes of the same specialisation within
a variant: the per-shape and total columns show it), the chosen config, and the chosen kernel's time
and torch.mm's timed side by side (perfmodel.data_gen.measure.Bench: L2 flushed, a 500 us GPU spin before each run
so that the autotuner's Python dispatch is not timed, median of >= 10 runs). Each shape runs in
try/except and records its error.

    python -m benchmarks.triton_hook_bench [--model PATH | --synthetic] [--configs 40] [--top-k 5]
                                           [--out benchmarks/results/triton_hook_bench.json]

Run time on the H100 (one specialisation compiles at ~1 kernel/s in one process, and the 5 shapes
need 3 specialisations): --configs 60 took 4.9 min (the full variant 218 s of it); the default 40
keeps a run near 4 minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks._shared.runner import resolve_model, run_worker, save_results
from perfmodel.locations import default_model_dir

# (M, N, K, dtype): square, a small-M GEMM where cuBLAS shines, an LLM MLP, decode, an unaligned one.
SHAPES = [
    (4096, 4096, 4096, "float16"),
    (128, 1000, 4096, "float16"),
    (2048, 11008, 4096, "bfloat16"),
    (16, 4096, 4096, "float16"),
    (1000, 1000, 1000, "float16"),
]
VARIANTS = ("full", "pruned", "model-space")


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    """One variant, all shapes, in this (fresh) process."""
    import torch
    import triton
    from perfmodel.data_gen.kernel import _args, matmul_kernel
    from perfmodel.data_gen.measure import Bench, TimingSettings
    from perfmodel.configs import pruned_space, stratified_sample
    from perfmodel.schema import GemmProblem
    from perfmodel.serve import Predictor
    from perfmodel.serve.triton_hook import perfmodel_prune

    t0 = time.perf_counter()
    pred = Predictor.load(args.model, backend=args.backend)
    load_s = time.perf_counter() - t0
    out: dict[str, Any] = {"variant": args.worker, "load_s": load_s, "device": torch.cuda.get_device_name(),
                           "torch": torch.__version__, "triton": triton.__version__, "shapes": []}
    bench = Bench(torch.device("cuda"), torch.cuda.get_device_properties(0).L2_cache_size,
                  TimingSettings(budget_ms=5.0, min_reps=10, max_reps=100, pre_sleep_us=500.0))
    for m, n, k, dtype in SHAPES:
        row: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype": dtype}
        try:
            tdtype = getattr(torch, dtype)
            space = pruned_space(dtype, pred.spec)
            gemm_cfgs = space if args.worker == "model-space" else stratified_sample(space, args.configs, args.seed)
            a = torch.randn(m, k, device="cuda", dtype=tdtype)
            b = torch.randn(k, n, device="cuda", dtype=tdtype)
            c = torch.empty(m, n, device="cuda", dtype=tdtype)
            strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
            # The kernel's per-config constexprs (EVEN_K, the contiguity hints) and the sizes passed
            # divided by their power-of-two divisors come from the launch helper's own rule, so that every
            # config runs exactly the kernel the dataset timed (perfmodel.data_gen.kernel._args).
            configs = []
            for g in gemm_cfgs:
                ints, meta = _args(m, n, k, strides, g, tdtype, False)
                meta.pop("num_stages"), meta.pop("num_warps")
                configs.append(triton.Config(meta, num_stages=g.num_stages, num_warps=g.num_warps))
            prune = None
            if args.worker != "full":
                # Sizes read from the tensors' shapes (the integer arguments are divided by their divisors).
                prune = {"early_config_prune": perfmodel_prune(top_k=args.top_k, predictor=pred,
                                                               a="a_ptr", b="b_ptr", m="", n="", k="")}
            tuned = triton.autotune(configs, key=["M_q", "N_q", "K_q"], prune_configs_by=prune)(matmul_kernel)

            def launch() -> None:
                grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
                tuned[grid](a, b, c, *ints)

            torch.cuda.synchronize()
            t0 = time.perf_counter()
            launch()  # autotunes: compiles and benchmarks every (pruned) config
            torch.cuda.synchronize()
            row["autotune_s"] = time.perf_counter() - t0
            row["n_configs"] = len(configs)
            row["n_benchmarked"] = len(tuned.configs_timings)
            ref = a.float() @ b.float()
            torch.testing.assert_close(c.float(), ref, rtol=2e-2, atol=2e-2 * k ** 0.5)
            best = tuned.best_config
            row["chosen"] = {**best.kwargs, "num_stages": best.num_stages, "num_warps": best.num_warps}
            (row["kernel_ms"], _), (row["cublas_ms"], _) = bench.time_many([launch, lambda: torch.mm(a, b)])
            prob = GemmProblem(m=m, n=n, k=k, dtype=dtype)
            row["cublas_pred_ms"] = pred.predict_cublas(prob) if pred.has_cublas else None
            row["tflops"] = 2 * m * n * k / (row["kernel_ms"] * 1e-3) / 1e12
        except Exception as exc:  # one failing shape must not lose the others' results; recorded below
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc(limit=4)
        out["shapes"].append(row)
        args.worker_out.write_text(json.dumps(out, indent=1))  # a timed-out worker keeps the shapes done
    return out


def _run_variant(variant: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp / f"triton-cache-{variant}")}
    res_file = tmp / f"{variant}.json"
    cmd = [sys.executable, "-m", __spec__.name, "--worker", variant, "--model", str(args.model), "--configs", str(args.configs),
           "--top-k", str(args.top_k), "--seed", str(args.seed), "--worker-out", str(res_file)] + (
               ["--backend", args.backend] if args.backend else [])
    return run_worker(variant, cmd, env, res_file, args.timeout)


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Triton autotune of the canonical GEMM kernel: {results['n_configs']} configs vs the model's top "
             f"{results['top_k']} (model {results['model']})", "",
             "| shape | variant | benchmarked | autotune s | chosen (BM,BN,BK,GM,s,w) | kernel ms | TFLOP/s "
             "| vs full | cuBLAS ms |", "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    by_variant = {v["variant"]: v for v in results["variants"]}
    for i, (m, n, k, dtype) in enumerate(SHAPES):
        full = by_variant.get("full", {}).get("shapes", [{}] * len(SHAPES))[i]
        for name in VARIANTS:
            v = by_variant.get(name, {})
            if "error" in v:
                lines.append(f"| {m}x{n}x{k} {dtype} | {name} | error: {v['error'][:80]} |||||||")
                continue
            r = v.get("shapes", [{}] * len(SHAPES))[i]
            if "error" in r:
                lines.append(f"| {m}x{n}x{k} {dtype} | {name} | error: {r['error'][:80]} |||||||")
                continue
            ch = r["chosen"]
            ratio = r["kernel_ms"] / full["kernel_ms"] if "kernel_ms" in full else float("nan")
            lines.append(f"| {m}x{n}x{k} {dtype} | {name} | {r['n_benchmarked']}/{r['n_configs']} | "
                         f"{r['autotune_s']:.1f} | {ch['BLOCK_M']},{ch['BLOCK_N']},{ch['BLOCK_K']},{ch['GROUP_M']},"
                         f"{ch['num_stages']},{ch['num_warps']} | {r['kernel_ms']:.4f} | {r['tflops']:.0f} | "
                         f"{ratio:.3f} | {r['cublas_ms']:.4f} |")
    lines.append("")
    for name in VARIANTS:
        v = by_variant.get(name, {})
        total = sum(r.get("autotune_s", 0.0) for r in v.get("shapes", []))
        lines.append(f"- {name}: autotune total {total:.1f} s over {len(SHAPES)} shapes "
                     f"(process {v.get('process_s', float('nan')):.0f} s incl. startup, model load "
                     f"{v.get('load_s', float('nan')):.2f} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=default_model_dir())
    ap.add_argument("--synthetic", action="store_true", help="random-weight model (exercises the script only)")
    ap.add_argument("--configs", type=int, default=40, help="configs of the full autotune")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--backend", choices=("torch", "onnx"), default=None, help="the Predictor's (default: its own choice)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=400, help="seconds per variant process")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "triton_hook_bench.json")
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.worker_out.write_text(json.dumps(_worker(args), indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="perfmodel-triton-bench-") as tmpdir:
        tmp = Path(tmpdir)
        found = resolve_model(args.model, args.synthetic, tmp, REPO,
                              "SYNTHETIC (random weights: the pruned choices mean nothing)")
        if found is None:
            print(f"triton_hook_bench: no model at {args.model}; pass --model or --synthetic", file=sys.stderr)
            return 2
        args.model, label = found
        results = {"model": label, "n_configs": args.configs, "top_k": args.top_k,
                   "variants": [_run_variant(v, args, tmp) for v in VARIANTS]}
    save_results(args.out, results, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
