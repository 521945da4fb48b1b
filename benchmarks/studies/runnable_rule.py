"""CPU: does the shared-memory rule (perfmodel/configs.py `fits`) say which of Inductor's bmm template configs run?

Every Triton row of a dataset's bmm parts (Inductor's bmm template, each config compiled for the problem's sizes and
launched on the GPU) against counts of the bytes a config needs: the rule's (the operand tiles of every stage), one
stage fewer, that plus the output tile, and one stage where the K loop has one iteration (no pipelining). Then: do
the configs that fail to launch depend on more than the config, the dtype, the layout, EVEN_K and the sizes'
alignment? (Groups of rows equal in all of those that both ran and failed.) With --compile N: N rows (half ran,
half failed, from those groups, and N of the rows the last rule calls unrunnable that ran) compiled on this CPU for
sm_90 -- data_gen/kernel.py's static kernel, every size a constant as Inductor compiles its template -- and Triton's
own `metadata.shared` against the device's limit.

    python -m benchmarks.studies.runnable_rule [--data data/h100 data/h200] [--compile 24] [--out FILE]
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
    the CPU for sm_90 (no GPU needed; ptxas ships with triton)."""
    import inspect

    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from perfmodel.data_gen import kernel
    from perfmodel.schema import GemmConfig

    m, n, k = r["m"], r["n"], r["k"]
    strides = ((1, m) if r["transpose_left"] else (k, 1)) + ((1, k) if r["transpose_right"] else (n, 1)) + (n, 1)
    cfg = GemmConfig(r["block_m"], r["block_n"], r["block_k"], r.get("group_m") or 8, r["num_stages"], r["num_warps"])
    dt = getattr(torch, r["dtype"])
    ints, meta = kernel._args(m, n, k, strides, cfg, dt, r["allow_tf32"], static=True)
    stages, warps = meta.pop("num_stages"), meta.pop("num_warps")
    names = list(inspect.signature(kernel.matmul_kernel.fn).parameters)
    ptr = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}[r["dtype"]]
    sig = {x: ptr if i < 3 else "constexpr" for i, x in enumerate(names)}
    consts = {x: (ints[i - 3] if i < 12 else meta[x]) for i, x in enumerate(names) if i >= 3}
    src = triton.compiler.ASTSource(fn=kernel.matmul_kernel, signature=sig, constexprs=consts,
                                    attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    return int(triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages}).metadata.shared)


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
            r["transpose_left"], r["transpose_right"], r["even_k"], _align(r["m"]), _align(r["n"]), _align(r["k"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, nargs="+", default=[Path("data/h100"), Path("data/h200")])
    ap.add_argument("--compile", type=int, default=0, help="rows to compile for sm_90 on the CPU (see above)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    lines = [line for folder in args.data for line in study(folder, args.compile)]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
