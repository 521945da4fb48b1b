"""CPU: does the shared-memory rule (perfmodel/configs.py `fits`) say which of Inductor's bmm template configs run?

Every Triton row of a dataset's bmm parts (Inductor's bmm template, each config compiled for the problem's sizes and
launched on the GPU) against three counts of the bytes a config needs: the rule's (the operand tiles of every
stage), one stage fewer (Triton's pipeliner keeps num_stages - 1 buffers in flight), and that plus the output
tile. Then: do the configs that fail to launch depend on more than the config, the dtype, the layout, EVEN_K and
the sizes' alignment? (Groups of rows equal in all of those that both ran and failed.)

    python -m benchmarks.studies.runnable_rule [--data data/h100 data/h200] [--out FILE]
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


def _align(v: int) -> int:
    return 16 if v % 8 == 0 else 8 if v % 4 == 0 else 4 if v % 2 == 0 else 1


def study(folder: Path) -> list[str]:
    spec = get_spec(SPECS.get(folder.name, folder.name))
    limit = spec.shared_memory_per_block_optin
    rows, _ = read_dataset(folder, "bmm")
    rows = [r for r in rows if r.get("kind") == "triton" and "block_m" in r]
    out = [f"{folder}: {len(rows)} Triton rows of the bmm template, shared memory limit {limit} bytes"]
    for name, need in RULES.items():
        tab: Counter = Counter()
        for r in rows:
            fits = need(r["block_m"], r["block_n"], r["block_k"], r["num_stages"], DTYPE_BYTES[r["dtype"]]) <= limit
            tab[("fits" if fits else "predicted unrunnable", "ran" if r["status"] == "ok" else "failed")] += 1
        out.append(f"  {name}: " + ", ".join(f"{a} & {b} {tab[(a, b)]}" for a in ("fits", "predicted unrunnable")
                                               for b in ("ran", "failed")))
    groups: dict[tuple, Counter] = defaultdict(Counter)
    for r in rows:
        key = (r["block_m"], r["block_n"], r["block_k"], r["num_stages"], r["num_warps"], r["dtype"], r["allow_tf32"],
               r["transpose_left"], r["transpose_right"], r["even_k"], _align(r["m"]), _align(r["n"]), _align(r["k"]))
        groups[key]["ran" if r["status"] == "ok" else "failed"] += 1
    mixed = [(k, c) for k, c in groups.items() if len(c) > 1]
    out.append(f"  groups equal in config, dtype, tf32, layout, EVEN_K and alignment: {len(groups)}; with a failure "
               f"{sum('failed' in c for c in groups.values())}; that both ran and failed {len(mixed)}, e.g.:")
    out += [f"    {k}: {dict(c)}" for k, c in sorted(mixed, key=lambda kc: -sum(kc[1].values()))[:4]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, nargs="+", default=[Path("data/h100"), Path("data/h200")])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    lines = [line for folder in args.data for line in study(folder)]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
