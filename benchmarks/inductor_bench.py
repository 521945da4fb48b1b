"""torch.compile(mode="max-autotune-no-cudagraphs") of torch.mm: stock Inductor vs perfmodel.serve.inductor (GPU; H100).

Variants, each in its own process (so none reuses another's compiled kernels), every shape compiled
after torch._dynamo.reset() inside a fresh Inductor cache (torch._inductor.utils.fresh_inductor_cache):

  stock             Inductor's default max-autotune choices
  perfmodel         perfmodel.serve.inductor installed: the model's top-k Triton mm configs (aten etc. kept)
  perfmodel-cublas  as perfmodel, and no Triton at all where cuBLAS is predicted faster (--cublas-margin: install()'s default)
  perfmodel-pad     as perfmodel-cublas, and Inductor's pad_mm pass decided by the model (pad=True)

Reported per shape: compile time of the first call (lowering + compiling and benchmarking the
choices), the part of it spent tuning GEMMs (_shared/clock.py: Inductor's timers around precompiling and
benchmarking template choices, plus pad_mm's padding decision), the compiled function's GPU time and torch.mm's, side by side (perfmodel.data_gen.measure.Bench: L2
flushed, a 500 us GPU spin before each run so that the compiled wrapper's Python is not timed, median
of >= 10 runs), which kernel won (aten mm or a
Triton template config, read from the generated code), and how many mm choices the hook kept. A
process-wide warm-up compile runs first so that the first shape does not pay for starting Inductor's
compile workers. Each shape runs in try/except and records its error.

    python -m benchmarks.inductor_bench [--model PATH | --synthetic] [--top-k 5] [--cublas-margin M]
                                        [--out benchmarks/results/inductor_bench.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks._shared.clock import CompileClock
from benchmarks._shared.runner import resolve_model, run_worker, save_results
from perfmodel.locations import default_model_dir
from perfmodel.serve.inductor import CUBLAS_MARGIN

# (name, M, K, N, dtype): C[M, N] = A[M, K] @ B[K, N]
SHAPES = [
    ("BERT qkv/out", 2048, 768, 768, "float16"),
    ("BERT ffn up", 2048, 768, 3072, "float16"),
    ("BERT ffn down", 2048, 3072, 768, "float16"),
    ("GPT-2 c_attn", 1024, 768, 2304, "float16"),
    ("GPT-2 mlp down", 1024, 3072, 768, "float16"),
    ("AlexNet fc6", 128, 9216, 4096, "float16"),
    ("LLM prefill qkv", 4096, 4096, 6144, "bfloat16"),
    ("LLM prefill mlp", 2048, 4096, 14336, "bfloat16"),
    ("LLM decode", 16, 4096, 4096, "bfloat16"),
    ("LLM decode mlp", 8, 4096, 14336, "bfloat16"),
    ("odd 1000^3", 1000, 1000, 1000, "float16"),
    ("odd 4095x4097x1000", 4095, 4097, 1000, "float16"),
    ("odd fp32 777x1234x555", 777, 1234, 555, "float32"),
    ("odd bf16 3000x4095x2049", 3000, 4095, 2049, "bfloat16"),
]
# Shapes added with dataset v4 (--shapes v4): vision, speech and LLM training/prefill GEMMs up to 2e12
# FLOP, decode, a vocabulary projection that cuBLAS must pad. None is a data/h100 problem as benchmarked
# here (NN); Llama-3 8B qkv, Llama-3 8B lm head decode, Mixtral decode and Qwen2 o_proj are train problems
# in NT layout. Not held out from the hook's settings: GPT-2's lm head set the pad rule
# (serve/inductor.py: unpadded_triton_instead, PAD_TRITON_MARGIN, padded_path_ms), and an H200 run of all
# 12 at cublas_margin 0 and -0.05 was beside the choice of CUBLAS_MARGIN (docs/benchmarks.md).
V4_SHAPES = [
    ("ViT-B/16 qkv (64 img)", 12608, 768, 2304, "float16"),
    ("ViT-L/16 mlp up (64 img)", 12608, 1024, 4096, "bfloat16"),
    ("GPT-2 lm head", 1024, 768, 50257, "float16"),
    ("ResNet-50 fc (256)", 256, 2048, 1000, "float16"),
    ("Whisper-base enc mlp", 1500, 512, 2048, "float16"),
    ("Llama-3 8B qkv 8k tok", 8192, 4096, 6144, "bfloat16"),
    ("Llama-3 70B mlp up 4k tok", 4096, 8192, 28672, "bfloat16"),
    ("Llama-3 8B lm head decode", 1, 4096, 128256, "bfloat16"),
    ("Mixtral expert decode 32", 32, 4096, 14336, "bfloat16"),
    ("Qwen2-7B o_proj 2k tok", 2048, 3584, 3584, "bfloat16"),
    ("BERT-large fp32 ffn", 4096, 1024, 4096, "float32"),
    ("T5 odd fp16 1500x1023x3001", 1500, 1023, 3001, "float16"),
]
SHAPE_SETS = {"tuned": SHAPES, "v4": V4_SHAPES, "all": SHAPES + V4_SHAPES}
OLD_SET_NAMES = {"unseen": "v4"}  # what results written before the rename call a set
VARIANTS = ("stock", "perfmodel", "perfmodel-cublas", "perfmodel-pad")
_BLOCK_RE = [re.compile(rf"{name}\s*:\s*tl\.constexpr\s*=\s*(\d+)") for name in
             ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")]
_BLOCK_RE += [re.compile(rf"{name}\s*=\s*(\d+)") for name in ("num_stages", "num_warps")]


def _winner(codes: list[str]) -> str:
    """aten (cuBLAS) or the Triton template's config (BM,BN,BK,GM,stages,warps), from the generated source."""
    src = "\n".join(codes)
    if "triton_tem_" in src:
        blocks = [m.group(1) if (m := r.search(src)) else "?" for r in _BLOCK_RE]
        return "triton " + ",".join(blocks)
    if "extern_kernels.mm" in src or "extern_kernels.addmm" in src:
        return "aten"
    if "decompose_k" in src:
        return "decompose_k"
    return "other"


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch._inductor.utils import fresh_inductor_cache, run_and_get_code
    import perfmodel.serve.inductor as si
    from perfmodel.data_gen.measure import Bench, TimingSettings
    from perfmodel.serve import Predictor

    variant = args.worker
    out: dict[str, Any] = {"variant": variant, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "search_space": args.search_space, "shapes": []}
    torch._inductor.config.max_autotune_gemm_search_space = args.search_space
    kept: list[tuple[int, int]] = []
    from perfmodel.serve import choices as sc

    real_filter = sc.select

    def counting_filter(choices, kernel_inputs, op_name, *a, **kw):
        res = real_filter(choices, kernel_inputs, op_name, *a, **kw)
        n_triton = sum((si._uid(c) or "") in si.TRITON_MM_TEMPLATES for c in res)
        kept.append((len(choices), len(res), n_triton))
        return res

    sc.select = counting_filter  # count what the hook keeps (the handler looks the name up per call)
    tuning = CompileClock()
    bench = Bench(torch.device("cuda"), torch.cuda.get_device_properties(0).L2_cache_size,
                  TimingSettings(budget_ms=5.0, min_reps=10, max_reps=100, pre_sleep_us=500.0))
    if variant != "stock":
        t0 = time.perf_counter()
        pred = Predictor.load(args.model, backend=args.backend)
        out["load_s"] = time.perf_counter() - t0
        out["cublas_margin"] = args.cublas_margin if variant in ("perfmodel-cublas", "perfmodel-pad") else None
        ok = si.install(top_k=args.top_k, predictor=pred, pad=variant == "perfmodel-pad",
                        cublas_margin=out["cublas_margin"], kernel=args.kernel)
        out["kernel"] = args.kernel or ("inductor" if pred.has_static else pred.kernel)  # what install() chose
        if not ok:
            out["error"] = "perfmodel.serve.inductor.install() returned False (Inductor API check failed); see warnings"
            return out
    pad_clock = contextlib.ExitStack()  # open for the whole worker, closed before the hook is uninstalled
    pad_clock.enter_context(tuning.pad_timing())  # stock's pad_mm benchmark, or the hook's decision

    def mm(a, b):
        return torch.mm(a, b)

    # Warm-up: start Inductor's compile workers and CUDA on a shape not in the table.
    with fresh_inductor_cache():
        torch._dynamo.reset()
        w = torch.randn(256, 256, device="cuda", dtype=torch.float16)
        t0 = time.perf_counter()
        torch.compile(mm, mode="max-autotune-no-cudagraphs")(w, w)
        out["warmup_s"] = time.perf_counter() - t0
    for name, m, k, n, dtype in SHAPE_SETS[args.shapes]:
        row: dict[str, Any] = {"name": name, "m": m, "k": k, "n": n, "dtype": dtype}
        if args.only and name not in args.only:
            continue
        try:
            tdtype = getattr(torch, dtype)
            a = torch.randn(m, k, device="cuda", dtype=tdtype)
            b = torch.randn(k, n, device="cuda", dtype=tdtype)
            kept.clear()
            n_pad0 = len(si.pad_decisions())
            with fresh_inductor_cache():
                torch._dynamo.reset()
                compiled = torch.compile(mm, mode="max-autotune-no-cudagraphs")
                torch.cuda.synchronize()
                tuning.start()
                t0 = time.perf_counter()
                res, codes = run_and_get_code(compiled, a, b)
                torch.cuda.synchronize()
                row["compile_s"] = time.perf_counter() - t0
                row.update(tuning.stop())
                torch.testing.assert_close(res.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-2 * k ** 0.5)
                row["winner"] = _winner(codes)
                if args.keep_code:
                    row["code"] = "\n".join(codes)[-30000:]
                row["choices_kept"] = list(kept[-1]) if kept else None
                row["padded"] = "constant_pad_nd" in "\n".join(codes)
                if variant == "perfmodel-pad":
                    row["pad_decisions"] = [{"problem": str(pp), "should_pad": d.should_pad, "orig_ms": d.orig_ms,
                                             "padded_ms": d.padded_ms} for pp, d in si.pad_decisions()[n_pad0:]]
                (row["kernel_ms"], _), (row["aten_ms"], _) = bench.time_many([lambda: compiled(a, b), lambda: torch.mm(a, b)])
        except Exception as exc:  # one failing shape must not lose the others' results; recorded here
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc(limit=4)
        out["shapes"].append(row)
        args.worker_out.write_text(json.dumps(out, indent=1))  # a timed-out worker keeps the shapes done
        torch._dynamo.reset()
    pad_clock.close()
    if variant != "stock":
        si.uninstall()
    return out


def _run_variant(variant: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    res_file = tmp / f"{variant}.json"
    cmd = [sys.executable, "-m", __spec__.name, "--worker", variant, "--model", str(args.model), "--top-k", str(args.top_k),
           "--cublas-margin", str(args.cublas_margin),
           "--worker-out", str(res_file), "--shapes", args.shapes, "--search-space", args.search_space] + sum((["--only", s] for s in args.only or []), []) + (
               ["--keep-code"] if args.keep_code else []) + (["--backend", args.backend] if args.backend else [])
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor-{variant}"),
           "TRITON_CACHE_DIR": str(tmp / f"triton-{variant}")}
    return run_worker(variant, cmd, env, res_file, args.timeout)


def markdown(results: dict[str, Any]) -> str:
    lines = [f"torch.mm under torch.compile(mode='max-autotune-no-cudagraphs'), stock vs perfmodel.serve.inductor top-"
             f"{results['top_k']} (model {results['model']}; {results.get('search_space', 'DEFAULT')} search space)", "",
             "| shape | MxKxN dtype | variant | compile s | vs stock | GEMM tuning s | kernel ms | vs stock | torch.mm ms "
             "| winner | mm choices kept (Triton) |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    by_v = {v["variant"]: v for v in results["variants"]}
    stock = {r["name"]: r for r in by_v.get("stock", {}).get("shapes", [])}
    ran = {r["name"] for v in by_v.values() for r in v.get("shapes", [])}
    shape_set = results.get("shapes", "tuned")
    for name, m, k, n, dtype in SHAPE_SETS[OLD_SET_NAMES.get(shape_set, shape_set)]:
        if ran and name not in ran:
            continue  # left out with --only
        for variant in VARIANTS:
            v = by_v.get(variant)
            if v is None:
                continue
            r = next((x for x in v.get("shapes", []) if x["name"] == name), None)
            head = f"| {name} | {m}x{k}x{n} {dtype} | {variant} |"
            if r is None:
                lines.append(head + f" {v.get('error', 'not run')[:80]} |||||||")
                continue
            if "error" in r:
                lines.append(head + f" error: {r['error'][:80]} |||||||")
                continue
            s = stock.get(name, {})
            cs = r["compile_s"] / s["compile_s"] if "compile_s" in s else float("nan")
            ks = r["kernel_ms"] / s["kernel_ms"] if "kernel_ms" in s else float("nan")
            ck = r.get("choices_kept")
            kept = "{} -> {}".format(*ck[:2]) + (f" ({ck[2]})" if len(ck) > 2 else "") if ck else "-"
            lines.append(head + f" {r['compile_s']:.1f} | {cs:.2f} | {r.get('gemm_tuning_s', float('nan')):.2f} | "
                                f"{r['kernel_ms']:.4f} | {ks:.3f} | "
                                f"{r['aten_ms']:.4f} | {r['winner']}{' (padded)' if r.get('padded') else ''} | {kept} |")
    lines.append("")
    for variant in VARIANTS:
        v = by_v.get(variant)
        if v is None:
            continue
        total = sum(r.get("compile_s", 0.0) for r in v.get("shapes", []))
        tuned = sum(r.get("gemm_tuning_s", float("nan")) for r in v.get("shapes", []))
        margin = f", cublas_margin {v['cublas_margin']:g}" if v.get("cublas_margin") is not None else ""
        lines.append(f"- {variant}{margin}: compile total {total:.1f} s, of which GEMM tuning {tuned:.1f} s "
                     f"(warm-up {v.get('warmup_s', float('nan')):.1f} s, "
                     f"process {v.get('process_s', float('nan')):.0f} s){' ERROR: ' + v['error'][:200] if 'error' in v else ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=default_model_dir())
    ap.add_argument("--synthetic", action="store_true", help="random-weight model (exercises the script only)")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--cublas-margin", type=float, default=CUBLAS_MARGIN,
                    help="the hook's cublas_margin in the perfmodel-cublas and perfmodel-pad variants "
                         "(default: install()'s, %(default)s)")
    ap.add_argument("--backend", choices=("torch", "onnx"), default=None, help="the Predictor's (default: its own choice)")
    ap.add_argument("--kernel", choices=("autotune", "inductor"), default=None,
                    help="the kernel mode the hook ranks for (default: the hook's, inductor when the model has a static head)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--only", action="append", help="run only this shape name (repeatable)")
    ap.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="tuned",
                    help="tuned: the 14 shapes the hook was developed on; v4: the 12 added with dataset v4 "
                         "(GPT-2's lm head among them set the pad rule)")
    ap.add_argument("--search-space", choices=("DEFAULT", "EXHAUSTIVE"), default="DEFAULT",
                    help="Inductor's max_autotune_gemm_search_space")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per variant process")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "inductor_bench.json")
    ap.add_argument("--merge", type=Path, nargs="+", help="only combine earlier --out JSON files into one table")
    ap.add_argument("--keep-code", action="store_true", help="keep the generated code of each shape in the JSON")
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.worker_out.write_text(json.dumps(_worker(args), indent=1))
        return 0
    if args.merge:
        parts = [json.loads(f.read_text()) for f in args.merge]
        results = {**parts[0], "variants": [v for part in parts for v in part["variants"]]}
        save_results(args.out, results, markdown(results))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {bad}")
    with tempfile.TemporaryDirectory(prefix="perfmodel-inductor-bench-") as tmpdir:
        tmp = Path(tmpdir)
        found = resolve_model(args.model, args.synthetic, tmp, REPO,
                              "SYNTHETIC (random weights: the kept configs mean nothing)")
        if found is None:
            print(f"inductor_bench: no model at {args.model}; pass --model or --synthetic", file=sys.stderr)
            return 2
        args.model, label = found
        results = {"model": label, "top_k": args.top_k, "shapes": args.shapes, "search_space": args.search_space,
                   "variants": [_run_variant(v, args, tmp) for v in variants]}
    save_results(args.out, results, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
