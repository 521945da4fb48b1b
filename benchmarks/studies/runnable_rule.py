"""CPU: does the shared-memory rule (perfmodel/configs.py `fits`) say which of Inductor's bmm template configs run?

Every Triton row of a dataset's bmm parts (Inductor's bmm template, each config compiled for the problem's sizes and
launched on the GPU) against counts of the bytes a config needs: the rule's (the operand tiles of every stage), one
stage fewer, that plus the output tile, and one stage where the K loop has one iteration (no pipelining). Then: do
the configs that fail to launch depend on more than the config, the dtype, the layout, EVEN_K and the sizes'
alignment? (Groups of rows equal in all of those that both ran and failed.) With --compile N: N rows (half ran,
half failed, from those groups, and N of the rows the last rule calls unrunnable that ran) compiled on this CPU for
sm_90 -- data_gen/kernel.py's static kernel, every size a constant as Inductor compiles its template -- and Triton's
own `metadata.shared` against the device's limit.

With --measure N (issue 49: the rule measured, not assumed): a seeded sample of every part's Triton rows (gemm,
gemm_static, bmm) of both folders -- up to N where the per-config rule and the GPU disagree, N from groups that both
ran and failed, N at random, one row per compiled kernel, and the issue's 2047 / 2048 bf16 example -- each compiled
on the CPU for sm_90 as its part timed it (`part_shared`), Triton's `metadata.shared` cached in
benchmarks/results/runnable_rule_compiled.json (a rerun compiles only what the cache lacks); then, as with
--evaluate alone, the served rule (perfmodel.configs.shared_memory_need / runnable_for) against those counts and
against the GPU's outcome on every Triton row, beside the per-config rule.

    python -m benchmarks.studies.runnable_rule [--data data/h100 data/h200] [--compile 24] [--out FILE]
    python -m benchmarks.studies.runnable_rule --measure 300 [--workers 2] --out benchmarks/results/runnable_rule.txt
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from perfmodel.data_gen.shards import read_dataset
from perfmodel.devices import get_spec

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
SPECS = {"h100": "h100-sxm", "h200": "h200"}
RULES = {
    "the rule: (BM*BK + BN*BK) x bytes x stages": lambda bm, bn, bk, s, e: (bm * bk + bn * bk) * e * s,
    "stages - 1": lambda bm, bn, bk, s, e: (bm * bk + bn * bk) * e * (s - 1),
    "stages - 1, plus the output tile": lambda bm, bn, bk, s, e: (bm * bk + bn * bk) * e * (s - 1) + bm * bn * e,
}
ONE_ITERATION = "one stage where the K loop has one iteration, else every stage"


WGMMA = "one stage for a one-iteration K loop; else every stage for fp16/bf16/TF32, one fewer for IEEE fp32"


def _wgmma_need(r: dict) -> int:
    """Hopper's wgmma path (fp16, bf16, TF32) buffers every stage; IEEE fp32 (no wgmma) one fewer (compiles on the
    CPU for sm_90: a 64x32x128 5-stage fp32 config holds 5 tiles with TF32, 4 without, 1 when K fits one block)."""
    if -(-r["k"] // r["block_k"]) <= 1:
        stages = 1
    else:
        stages = r["num_stages"] if (r["dtype"] != "float32" or r["allow_tf32"]) else r["num_stages"] - 1
    return (r["block_m"] + r["block_n"]) * r["block_k"] * DTYPE_BYTES[r["dtype"]] * stages


def _one_iteration_need(r: dict) -> int:
    stages = 1 if -(-r["k"] // r["block_k"]) <= 1 else r["num_stages"]
    return (r["block_m"] + r["block_n"]) * r["block_k"] * DTYPE_BYTES[r["dtype"]] * stages


def compiled_shared(r: dict) -> int:
    """Triton's shared memory bytes for the row's config and problem: data_gen/kernel.py's static kernel compiled on
    the CPU for sm_90 (no GPU needed; ptxas ships with triton; _compiled_kernel)."""
    return int(_compiled_kernel(r).metadata.shared)


PARTS = ("gemm", "gemm_static", "bmm")  # the parts whose Triton rows are timed (each row: one config on one problem)


def _row_key(part: str, r: dict) -> tuple:
    """What decides the row's compiled kernel: the gemm part's kernel is compiled for Triton's default
    specialisation (the sizes' classes, EVEN_K and the hints: data_gen/gemm_sweep.py `kernel_key`), the
    gemm_static and bmm parts' for the problem's own sizes."""
    cfg = (r["block_m"], r["block_n"], r["block_k"], r.get("group_m") or 8, r["num_stages"], r["num_warps"])
    head = (part, r["dtype"], bool(r["allow_tf32"]), r["transpose_left"], r["transpose_right"])
    if part == "gemm":
        from perfmodel.data_gen.gemm_sweep import kernel_key

        return head + tuple(kernel_key(_problem(r), _cfg(r))[4:7]) + cfg + tuple(kernel_key(_problem(r), _cfg(r))[8:])
    return head + (r["m"], r["n"], r["k"]) + cfg


def _problem(r: dict):
    from perfmodel.schema import GemmProblem

    return GemmProblem(m=r["m"], n=r["n"], k=r["k"], dtype=r["dtype"], allow_tf32=bool(r["allow_tf32"]),
                       transpose_left=r["transpose_left"], transpose_right=r["transpose_right"])


def _cfg(r: dict):
    from perfmodel.schema import GemmConfig

    return GemmConfig(r["block_m"], r["block_n"], r["block_k"], r.get("group_m") or 8, r["num_stages"],
                      r["num_warps"])


def part_shared(part: str, r: dict) -> int:
    """Triton's shared memory bytes (`metadata.shared`) of the kernel a row of a part timed, compiled on the CPU
    for sm_90: gemm -- data_gen/kernel.py's kernel with Triton's default specialisation of the sizes and strides
    (1 a constant, multiples of 16 marked divisible) and the DIV_ constexprs, as the gemm sweep's workers compiled
    it; gemm_static -- that kernel with every size a constant (`compiled_shared`); bmm -- data_gen/bmm_kernel.py's
    `compile_for_target` at the problem's strides (data_gen/bmm.py `strides`)."""
    import inspect

    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from perfmodel.data_gen import bmm, bmm_kernel, kernel
    from perfmodel.data_gen.problems import strides

    if part == "gemm_static":
        return compiled_shared(r)
    p, cfg, dt = _problem(r), _cfg(r), getattr(torch, r["dtype"])
    if part == "bmm":
        return int(bmm_kernel.compile_for_target(dt, p.m, p.n, p.k, bmm.strides(p), cfg, p.allow_tf32).metadata.shared)
    ints, meta = kernel._args(p.m, p.n, p.k, strides(p), cfg, dt, p.allow_tf32)
    stages, warps = meta.pop("num_stages"), meta.pop("num_warps")
    names = list(inspect.signature(kernel.matmul_kernel.fn).parameters)
    ptr = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}[r["dtype"]]
    sig = {x: ptr for x in names[:3]}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    consts = {}
    for i, x in enumerate(names[3:12]):
        if ints[i] == 1:  # Triton's specialisation: 1 a constant, multiples of 16 divisible
            sig[x], consts[x] = "constexpr", 1
        else:
            sig[x] = "i32"
            if ints[i] % 16 == 0:
                attrs[(i + 3,)] = [["tt.divisibility", 16]]
    for x in names[12:]:
        sig[x], consts[x] = "constexpr", meta[x]
    src = triton.compiler.ASTSource(fn=kernel.matmul_kernel, signature=sig, constexprs=consts, attrs=attrs)
    return int(triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages}).metadata.shared)


def _part_shared_job(job: tuple) -> tuple[str, int | str]:
    key, part, r = job
    try:
        return key, part_shared(part, r)
    except Exception as e:  # noqa: BLE001 -- recorded: a compile that fails is an outcome too
        return key, f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _align(v: int) -> int:
    return 16 if v % 8 == 0 else 8 if v % 4 == 0 else 4 if v % 2 == 0 else 1


def study(folder: Path, compile_n: int = 0) -> list[str]:
    spec = get_spec(SPECS.get(folder.name, folder.name))
    limit = spec.shared_memory_per_block_optin
    rows, _ = read_dataset(folder, "bmm")
    rows = [r for r in rows if r.get("kind") == "triton" and "block_m" in r]
    out = [f"{folder}: {len(rows)} Triton rows of the bmm template, shared memory limit {limit} bytes"]
    rules = {**{name: (lambda r, f=f: f(r["block_m"], r["block_n"], r["block_k"], r["num_stages"],
                                         DTYPE_BYTES[r["dtype"]])) for name, f in RULES.items()},
             ONE_ITERATION: _one_iteration_need, WGMMA: _wgmma_need}
    for name, need in rules.items():
        tab: Counter = Counter()
        for r in rows:
            fits = need(r) <= limit
            tab[("fits" if fits else "predicted unrunnable", "ran" if r["status"] == "ok" else "failed")] += 1
        out.append(f"  {name}: " + ", ".join(f"{a} & {b} {tab[(a, b)]}" for a in ("fits", "predicted unrunnable")
                                               for b in ("ran", "failed")))
    groups: dict[tuple, Counter] = defaultdict(Counter)
    for r in rows:
        key = _group_key(r)
        groups[key]["ran" if r["status"] == "ok" else "failed"] += 1
    mixed = [(k, c) for k, c in groups.items() if len(c) > 1]
    out.append(f"  groups equal in config, dtype, tf32, layout, EVEN_K and alignment: {len(groups)}; with a failure "
               f"{sum('failed' in c for c in groups.values())}; that both ran and failed {len(mixed)}, e.g.:")
    out += [f"    {k}: {dict(c)}" for k, c in sorted(mixed, key=lambda kc: -sum(kc[1].values()))[:4]]
    if compile_n:
        out += _compiled(rows, groups, mixed, limit, compile_n)
    return out


def _compiled(rows: list[dict], groups: dict, mixed: list, limit: int, n: int) -> list[str]:
    """Triton's compiled shared bytes against the outcome on a seeded sample (see the module's doc)."""
    import random

    rng = random.Random(0)
    keys = {k for k, _ in mixed}
    in_mixed = [r for r in rows if _group_key(r) in keys]
    ran = [r for r in in_mixed if r["status"] == "ok"]
    failed = [r for r in in_mixed if r["status"] != "ok"]
    missed = [r for r in rows if r["status"] == "ok" and _one_iteration_need(r) > limit]
    sample = rng.sample(ran, min(n // 2, len(ran))) + rng.sample(failed, min(n // 2, len(failed))) + \
        rng.sample(missed, min(n, len(missed)))
    agree = sum((compiled_shared(r) <= limit) == (r["status"] == "ok") for r in sample)
    return [f"  Triton's compile for sm_90 (metadata.shared <= limit) agrees with the GPU's outcome on {agree} of "
            f"{len(sample)} rows ({min(n // 2, len(ran))} ran and {min(n // 2, len(failed))} failed of the mixed "
            f"groups, {min(n, len(missed))} that ran but the one-iteration rule calls unrunnable)"]


def _group_key(r: dict) -> tuple:
    return (r["block_m"], r["block_n"], r["block_k"], r["num_stages"], r["num_warps"], r["dtype"], r["allow_tf32"],
            r["transpose_left"], r["transpose_right"], r["k"] % r["block_k"] == 0, _align(r["m"]), _align(r["n"]), _align(r["k"]))


CACHE = Path("benchmarks/results/runnable_rule_compiled.json")


def triton_rows(folder: Path, part: str) -> list[dict]:
    """The part's Triton rows (one config timed, or failed, on one problem)."""
    rows, _ = read_dataset(folder, part)
    return [r for r in rows if r.get("kind") == "triton" and "block_m" in r]


def _today_fits(r: dict, limit: int) -> bool:
    """perfmodel/configs.py's rule before this study's measurement (operand tiles of every stage; registers)."""
    smem = (r["block_m"] + r["block_n"]) * r["block_k"] * DTYPE_BYTES[r["dtype"]] * r["num_stages"]
    return smem <= limit and r["block_m"] * r["block_n"] / (r["num_warps"] * 32) <= 255


def measure_sample(folders: list[Path], n: int, seed: int = 0) -> list[tuple[tuple, str, dict]]:
    """The rows to compile, per folder and part, seeded: up to n where today's rule and the GPU's outcome
    disagree, up to n from groups (_group_key) that both ran and failed (half ran, half failed), and n of
    the rest at random; one row per compiled kernel (_row_key)."""
    import random

    out: dict[tuple, tuple[tuple, str, dict]] = {}
    for folder in folders:
        limit = get_spec(SPECS.get(folder.name, folder.name)).shared_memory_per_block_optin
        for part in PARTS:
            rows = triton_rows(folder, part)
            if not rows:
                continue
            rng = random.Random(f"{seed}:{folder.name}:{part}")
            groups: dict[tuple, set] = defaultdict(set)
            for r in rows:
                groups[_group_key(r)].add(r["status"] == "ok")
            disagree = [r for r in rows if _today_fits(r, limit) != (r["status"] == "ok")]
            mixed = [r for r in rows if len(groups[_group_key(r)]) > 1]
            mixed_ran = [r for r in mixed if r["status"] == "ok"]
            mixed_failed = [r for r in mixed if r["status"] != "ok"]
            picked = (rng.sample(disagree, min(n, len(disagree))) + rng.sample(mixed_ran, min(n // 2, len(mixed_ran)))
                      + rng.sample(mixed_failed, min(n // 2, len(mixed_failed))) + rng.sample(rows, min(n, len(rows))))
            for r in picked:
                key = _row_key(part, r)
                out.setdefault(key, (key, part, r))
    for r in EXAMPLES:
        out.setdefault(_row_key("gemm_static", r), (_row_key("gemm_static", r), "gemm_static", r))
    return list(out.values())


# The example (issue 49): on the H200 Inductor timed 128x256x64, 5 stages, 8 warps for a 2047-sized bf16
# NN GEMM (the fastest it timed), which the operand-tiles-of-every-stage rule gave 245,760 bytes; and 2048.
EXAMPLES = [dict(m=s, n=s, k=s, dtype="bfloat16", allow_tf32=False, transpose_left=False, transpose_right=False,
                 block_m=128, block_n=256, block_k=64, group_m=8, num_stages=5, num_warps=8) for s in (2047, 2048)]


def load_cache(path: Path = CACHE) -> dict[str, dict]:
    import json

    return json.loads(path.read_text()) if path.exists() else {}


def measure(folders: list[Path], n: int, path: Path = CACHE, workers: int = 2, seed: int = 0) -> dict[str, dict]:
    """Compile measure_sample's rows that the cache (a JSON of {row key: {part, row, shared}}) lacks, on `workers`
    processes, saving every 50 compiles; returns the cache."""
    import json
    import multiprocessing as mp
    import time

    cache = load_cache(path)
    todo = [(json.dumps(k), part, {f: r[f] for f in _ROW_FIELDS if f in r})
            for k, part, r in measure_sample(folders, n, seed) if json.dumps(k) not in cache]
    print(f"compiling {len(todo)} kernels for sm_90 ({len(cache)} cached)", flush=True)
    t0, rows = time.time(), {k: (part, r) for k, part, r in todo}
    with mp.get_context("spawn").Pool(workers) as pool:
        for i, (key, shared) in enumerate(pool.imap_unordered(_part_shared_job, todo, chunksize=4)):
            part, r = rows[key]
            cache[key] = {"part": part, "row": r, "shared": shared}
            if (i + 1) % 50 == 0 or i + 1 == len(todo):
                path.write_text(json.dumps(cache, sort_keys=True, indent=0) + "\n")
                print(f"  {i + 1}/{len(todo)} in {time.time() - t0:.0f} s", flush=True)
    return cache


def _need(rows: list[dict], static) -> "np.ndarray":
    """perfmodel.configs.shared_memory_need of each row."""
    import numpy as np

    from perfmodel.configs import shared_memory_need

    col = {f: np.array([r[f] for r in rows]) for f in _ROW_FIELDS if f not in ("dtype", "group_m")}
    e = np.array([DTYPE_BYTES[r["dtype"]] for r in rows])
    ieee = np.array([r["dtype"] == "float32" and not r["allow_tf32"] for r in rows], dtype=bool)
    return shared_memory_need(col["block_m"], col["block_n"], col["block_k"], col["num_stages"], col["num_warps"], e,
                              ieee, col["m"], col["n"], col["k"], col["transpose_left"].astype(bool),
                              col["transpose_right"].astype(bool), static)


def evaluate(folders: list[Path], path: Path = CACHE) -> list[str]:
    """The served rule (perfmodel.configs.runnable_for) against Triton's compiled count on the cached rows, and
    against the GPU's outcome on every Triton row of every part, beside today's rule."""
    import json

    import numpy as np

    from perfmodel.configs import runnable_for
    from perfmodel.schema import GemmConfig

    cache = load_cache(path)
    done = [v for v in cache.values() if isinstance(v["shared"], int)]
    out = [f"{path}: {len(cache)} kernels compiled for sm_90 on the CPU ({len(cache) - len(done)} failed to compile)"]
    for part in PARTS:
        got = [v for v in done if v["part"] == part]
        if not got:
            continue
        rows = [v["row"] for v in got]
        shared = np.array([v["shared"] for v in got])
        need = _need(rows, part != "gemm")  # the kernel the part timed: gemm's sizes are not constants
        served = _need(rows, True)  # the served rule: Inductor's static compile
        out.append(f"  {part}: {len(got)} kernels; the rule (this part's kernel) equals Triton's shared on "
                   f"{int((need == shared).sum())}, below it on {int((need < shared).sum())}, above it on "
                   f"{int((need > shared).sum())}; the served (static) rule above it on {int((served > shared).sum())}")
    for folder in folders:
        spec = get_spec(SPECS.get(folder.name, folder.name))
        limit = spec.shared_memory_per_block_optin
        for part in PARTS:
            rows = triton_rows(folder, part)
            if not rows:
                continue
            ran = np.array([r["status"] == "ok" for r in rows])
            before = np.array([_today_fits(r, limit) for r in rows])
            regs = np.array([r["block_m"] * r["block_n"] / (r["num_warps"] * 32) <= spec.registers_per_thread_max
                             for r in rows])
            after = (_need(rows, True) <= limit) & regs
            keyed = {}
            for r in rows:
                keyed.setdefault(json.dumps(_row_key(part, r)), []).append(r["status"] == "ok")
            comp = [(cache[k]["shared"] <= limit, o) for k, oks in keyed.items()
                    if k in cache and isinstance(cache[k]["shared"], int) for o in oks]
            out.append(f"{folder} {part}: {len(rows)} Triton rows ({int((~ran).sum())} failed); "
                       f"ran but predicted unrunnable {int((ran & ~before).sum())} before, {int((ran & ~after).sum())} "
                       f"now; failed but predicted runnable {int((~ran & before).sum())} before, "
                       f"{int((~ran & after).sum())} now; Triton's compiled shared <= limit agrees with the GPU on "
                       f"{sum(a == o for a, o in comp)} of {len(comp)} rows of the compiled kernels")
    cfg = GemmConfig(128, 256, 64, 8, 5, 8)
    from perfmodel.schema import GemmProblem

    ok = [bool(runnable_for(np.array([[128, 256, 64, 8, 5, 8]]), [GemmProblem(m=s, n=s, k=s, dtype="bfloat16")],
                            get_spec("h200"))[0, 0]) for s in (2047, 2048)]
    out.append(f"served: {cfg} bf16 NN on the H200 runnable at 2047^3 {ok[0]}, at 2048^3 {ok[1]}")
    return out


SPILL_TILES = [(bm, bn, w) for bm, bn in ((64, 64), (64, 128), (128, 64), (128, 128), (64, 256), (256, 64),
                                          (128, 256), (256, 128)) for w in (4, 8)]


def spills(size: int = 4096, block_k: int = 32, stages: int = 3) -> list[str]:
    """Register spills of wide tiles (not served; the issue's optional part): the static kernel of a size^3 NN GEMM
    compiled on the CPU for sm_90, its PTX through Triton's ptxas -v: registers a thread and spill bytes, for IEEE
    fp32, TF32 and bf16."""
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
    out = [f"ptxas -v (sm_90a) of the static kernel, {size}^3 NN, BLOCK_K {block_k}, {stages} stages: "
           "registers a thread, spill stores / loads (bytes)"]
    for dtype, tf32 in (("float32", False), ("float32", True), ("bfloat16", False)):
        cells = []
        for bm, bn, w in SPILL_TILES:
            r = dict(m=size, n=size, k=size, dtype=dtype, allow_tf32=tf32, transpose_left=False,
                     transpose_right=False, block_m=bm, block_n=bn, block_k=block_k, group_m=8, num_stages=stages,
                     num_warps=w)
            ptx = _compiled_kernel(r).asm["ptx"]
            with tempfile.TemporaryDirectory() as d:
                src = Path(d) / "k.ptx"
                src.write_text(ptx)
                log = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", str(src), "-o", str(Path(d) / "k.o")],
                                     capture_output=True, text=True).stderr
            regs = re.search(r"Used (\d+) registers", log)
            st = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
            cells.append(f"{bm}x{bn}/w{w}: {regs.group(1) if regs else '?'} regs, "
                         f"{st.group(1) if st else '?'}/{st.group(2) if st else '?'}")
        out.append(f"  {dtype}{' tf32' if tf32 else ''}: " + "; ".join(cells))
    return out


def _compiled_kernel(r: dict):
    """The static kernel of a row compiled for sm_90, every size a constant as Inductor compiles its template (the
    whole result: metadata.shared for compiled_shared, the PTX for the spill study)."""
    import inspect

    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from perfmodel.data_gen import kernel
    from perfmodel.data_gen.problems import strides

    ints, meta = kernel._args(r["m"], r["n"], r["k"], strides(_problem(r)), _cfg(r), getattr(torch, r["dtype"]),
                              r["allow_tf32"], static=True)
    stages, warps = meta.pop("num_stages"), meta.pop("num_warps")
    names = list(inspect.signature(kernel.matmul_kernel.fn).parameters)
    ptr = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}[r["dtype"]]
    sig = {x: ptr if i < 3 else "constexpr" for i, x in enumerate(names)}
    consts = {x: (ints[i - 3] if i < 12 else meta[x]) for i, x in enumerate(names) if i >= 3}
    src = triton.compiler.ASTSource(fn=kernel.matmul_kernel, signature=sig, constexprs=consts,
                                    attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


_ROW_FIELDS = ("m", "n", "k", "dtype", "allow_tf32", "transpose_left", "transpose_right", "block_m", "block_n",
               "block_k", "group_m", "num_stages", "num_warps")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, nargs="+", default=[Path("data/h100"), Path("data/h200")])
    ap.add_argument("--compile", type=int, default=0, help="rows to compile for sm_90 on the CPU (see above)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--measure", type=int, default=0, metavar="N",
                    help="compile (cached in --cache) up to N rows per folder, part and kind (measure_sample)")
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--evaluate", action="store_true", help="the served rule against the cache and every row")
    ap.add_argument("--spills", action="store_true", help="ptxas -v register spills of wide tiles (not served)")
    args = ap.parse_args(argv)
    if args.spills:
        lines = spills()
        print("\n".join(lines))
        if args.out:
            args.out.write_text("\n".join(lines) + "\n")
        return 0
    if args.measure:
        measure(args.data, args.measure, args.cache, args.workers)
    if args.measure or args.evaluate:
        lines = evaluate(args.data, args.cache)
        print("\n".join(lines))
        if args.out:
            args.out.write_text("\n".join(lines) + "\n")
        return 0
    lines = [line for folder in args.data for line in study(folder, args.compile)]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
