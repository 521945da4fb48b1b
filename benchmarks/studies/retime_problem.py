"""GPU: re-time every dataset config of a few problems with the sweep's own measurement, side by side.

For each problem given as M,N,K,MODE[,TL,TR] (MODE: float16, bfloat16, tf32, float32; TL/TR 1 for a
transposed operand), reads its rows from the dataset and runs perfmodel.data_gen.gemm_sweep.measure_problem
on the same configs, `--passes` times, in this process (L2 flush, GPU spin, median, correctness
check as in the sweep). Prints the dataset's ms next to each pass's, and a JSON file with --out.

    python -m benchmarks.studies.retime_problem 58496,16,18,tf32,0,1 [--data data/h100] [--passes 2] [--out r.json]

--stress N runs N niced busy-loop processes meanwhile (a stand-in for the sweep's compile workers), and
--no-stall-check keeps the runs the GPU reached before the host had enqueued them, as the sweeps
before the check did (data_gen/measure.py); --slow-factor 0 gives every config its repetitions.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
from pathlib import Path

import torch

from perfmodel.data_gen.gemm_sweep import measure_problem
from perfmodel.data_gen.measure import Bench, TimingSettings
from perfmodel.data_gen.runtime import resolve_spec
from perfmodel.data_gen.shards import iter_rows
from perfmodel.devices import ClockReader
from perfmodel.locations import default_data_dir
from perfmodel.schema import GemmConfig, GemmProblem

CONFIG_FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")


def parse_problem(text: str) -> GemmProblem:
    parts = text.split(",")
    if len(parts) not in (4, 6):
        raise SystemExit(f"problem {text!r}: expected M,N,K,MODE[,TL,TR]")
    m, n, k = map(int, parts[:3])
    mode = parts[3]
    tl, tr = (bool(int(x)) for x in parts[4:6]) if len(parts) == 6 else (False, False)
    dtype = "float32" if mode == "tf32" else mode
    return GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=mode == "tf32", transpose_left=tl, transpose_right=tr)


def row_key(r: dict) -> str:
    """"cublas", or a Triton row's config as BM,BN,BK,GM,stages,warps."""
    return "cublas" if r["kind"] == "cublas" else ",".join(str(r[f]) for f in CONFIG_FIELDS)


def dataset_rows(rows: list[dict], p: GemmProblem) -> dict[str, float]:
    """{"cublas" or config key: ms} of the problem's ok rows among the dataset's rows."""
    out = {}
    want = p.as_dict()
    for r in rows:
        if r.get("status") != "ok" or any(r.get(f) != v for f, v in want.items()):
            continue
        out[row_key(r)] = r["ms"]
    return out


def _spin() -> None:
    os.nice(10)  # as the sweep's compile workers
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+", help="M,N,K,MODE[,TL,TR]")
    ap.add_argument("--data", type=Path, default=default_data_dir())
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--stress", type=int, default=0, help="busy-loop processes (niced) running meanwhile")
    ap.add_argument("--no-stall-check", action="store_true", help="keep runs the GPU reached before the host enqueued them")
    ap.add_argument("--slow-factor", type=float, default=TimingSettings().slow_factor,
                    help="keep a config far slower than the problem's fastest at its first run, as the sweep does "
                         "(0: every config gets its repetitions)")
    args = ap.parse_args()
    spec, live = resolve_spec(None)
    dev = torch.device("cuda")
    timing = TimingSettings(stall_check=not args.no_stall_check, slow_factor=args.slow_factor or None)
    bench = Bench(dev, live.get("l2_bytes") or spec.l2_bytes, timing)
    stress = [mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(args.stress)]
    for proc in stress:
        proc.start()
    clock = ClockReader(torch.cuda.current_device())
    results = []
    data_rows = list(iter_rows(args.data, "gemm"))  # read once, not once per problem
    for text in args.problems:
        p = parse_problem(text)
        old = dataset_rows(data_rows, p)
        if not old:
            raise SystemExit(f"problem {text!r}: no ok rows in {args.data}")
        cfgs = [(GemmConfig(*map(int, key.split(","))), "") for key in old if key != "cublas"]
        passes = []
        for _ in range(args.passes):
            rows = measure_problem(p, cfgs, bench, spec, clock)
            passes.append({row_key(r): (r["ms"], r["status"], r.get("flag"), r.get("host_stalls")) for r in rows})
        print(f"\n{p} ({len(cfgs)} configs)\n")
        print("| config (BM,BN,BK,GM,stages,warps) | dataset ms | " + " | ".join(f"pass {i + 1} ms" for i in range(args.passes))
              + " | pass 1 / dataset |")
        print("|---|---:|" + "---:|" * args.passes + "---:|")
        for key, ms in sorted(old.items(), key=lambda kv: kv[1]):
            new = [ps.get(key, (None, "missing", None, None)) for ps in passes]
            cells = [f"{v[0]:.4f}" if v[0] is not None else v[1] for v in new]
            ratio = f"{new[0][0] / ms:.2f}" if new[0][0] else "-"
            print(f"| {key} | {ms:.4f} | " + " | ".join(cells) + f" | {ratio} |")
        stalls = [sum(v[3] or 0 for v in ps.values()) for ps in passes]
        print(f"\nruns the GPU reached before the host had enqueued them, per pass: {stalls}"
              + ("" if not args.no_stall_check else " (kept: --no-stall-check)"))
        results.append({"problem": p.as_dict(), "dataset": old, "stress": args.stress,
                        "stall_check": not args.no_stall_check,
                        "passes": [{k: list(v) for k, v in ps.items()} for ps in passes]})
        if args.out is not None:  # after every problem: a run cut short keeps what it measured
            args.out.write_text(json.dumps({"device": live, "results": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
