"""How much the dataset kernel's specialisation matters to ranking: held-out problems of a dataset re-timed
with the kernel compiled for each problem's own shape ("static": every size and stride a constant, as
Inductor compiles its mm template; one compile per problem and config), beside the dataset's rows
(kernel v4: Triton's default specialisation, one compile per specialisation key), and the shipped
model's ranking judged against both.

benchmarks/studies/kernel_fidelity.py showed, on six shapes, that the static compile orders configs as Inductor
does where v4 does not (Spearman 0.97-0.98 against 0.37-0.86). This measures what that costs the
model's picks on the project's own held-out problems, to decide between one kernel for the dataset and
a kernel mode per row (docs/data.md).

    # GPU: time `--per-mode` held-out problems of each dtype mode (their dataset configs) statically
    python -m benchmarks.static_retime --data data/h100 --per-mode 15 --out FOLDER [--time-limit 420]
    # ... or another split's, leaving out those of earlier runs
    python -m benchmarks.static_retime --split train --per-mode 15 --skip-done FOLDER... --out FOLDER2
    # CPU: compare with the dataset's rows and rank with a model (FOLDER, or a rows file of that format:
    # e.g. the same problems re-timed with the dataset's own kernel, for the noise floor)
    python -m benchmarks.static_retime --compare FOLDER_OR_ROWS_FILE... [--data data/h100] [--model models/h100]
    # CPU: the runs' rows into the dataset as gemm_static parts (data generation, data_gen/static_gen.py)
    perfmodel gen static FOLDER... --out data/h100

The timing is the GEMM sweep's (data_gen.gemm_sweep.measure_problem: correctness on the first timed
run, L2 flush, GPU spin, stall check, slow configs kept at one run); compiles run in worker processes,
problem by problem, while the main process times the problems already compiled.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import REPO

CONFIG_FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")
PROBLEM_FIELDS = ("m", "n", "k", "dtype", "allow_tf32", "transpose_left", "transpose_right")


SPLITS = {"train": 0, "val": 1, "test": 2}


def held_out_problems(data: Path, per_mode: int, seed: int, split: str = "test",
                      skip: frozenset[str] = frozenset(), fastest: int = 0,
                      random: int = 0) -> list[tuple[dict, list[dict]]]:
    """(problem fields, its ok Triton rows) for up to per_mode problems of each dtype mode of one split
    (perfmodel.train.data.split_problems with the model's seed), in a fixed random order per split,
    leaving out the units in `skip` (already re-timed: a later call takes the next ones).
    fastest/random > 0: a problem's `fastest` rows by the dataset's time plus `random` of its others
    (seeded per problem), not all its rows -- a static compile is one kernel per problem and config, so
    a share of each problem's configs covers more problems in the same compile time."""
    from perfmodel.train.data import load_gemm, split_problems

    table = load_gemm(data)
    members = np.flatnonzero(split_problems(table.modes, seed) == SPLITS[split])
    rng = np.random.default_rng(1234 + {"test": 0, "train": 1, "val": 2}[split])  # test: the first run's order
    chosen: set[str] = set()
    for mode in ("float16", "bfloat16", "tf32", "float32"):
        ids = [table.problem_keys[i] for i in members if table.modes[i] == mode]
        ids = [ids[j] for j in rng.permutation(len(ids))]
        chosen |= set([u for u in ids if u not in skip][:per_mode])
    from perfmodel.data_gen.shards import read_dataset

    rows, _ = read_dataset(data, "gemm")
    by_unit: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("unit") in chosen and r["kind"] == "triton" and r["status"] == "ok":
            by_unit.setdefault(r["unit"], []).append(r)
    if fastest or random:
        for unit, rs in by_unit.items():
            rs.sort(key=lambda r: r["ms"])
            rest = rs[fastest:]
            pick = np.random.default_rng(int(unit, 16) % 2**32).permutation(len(rest))[:random]
            by_unit[unit] = rs[:fastest] + [rest[j] for j in sorted(pick)]
    return [({f: rs[0][f] for f in PROBLEM_FIELDS}, rs) for _, rs in sorted(by_unit.items())]


def run_gpu(args: argparse.Namespace) -> int:
    import torch

    from perfmodel.data_gen.gemm_sweep import _compile_chunk, measure_problem
    from perfmodel.data_gen.problems import strides
    from perfmodel.data_gen.measure import Bench, TimingSettings
    from perfmodel.data_gen.runtime import resolve_spec
    from perfmodel.devices import ClockReader
    from perfmodel.schema import GemmConfig, GemmProblem

    skip: set[str] = set()
    for folder in args.skip_done or []:
        with gzip.open(folder / "static_rows.jsonl.gz", "rt") as fh:
            skip |= {json.loads(line)["unit"] for line in fh}
    problems = held_out_problems(args.data, args.per_mode, args.seed, args.split, frozenset(skip),
                                 args.fastest, args.random)
    spec, live = resolve_spec(None)
    device = torch.device("cuda", torch.cuda.current_device())
    bench = Bench(device, live.get("l2_bytes") or spec.l2_bytes, TimingSettings())
    clock = ClockReader(torch.cuda.current_device())
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pool = cf.ProcessPoolExecutor(max(1, (os.cpu_count() or 2) - 1), mp_context=mp.get_context("spawn"),
                                  initializer=os.nice, initargs=(10,))
    futures = [pool.submit(_compile_chunk, f["dtype"], f["allow_tf32"], f["m"], f["n"], f["k"], strides(GemmProblem(**f)),
                           [{k: r[k] for k in CONFIG_FIELDS} for r in rs], True) for f, rs in problems]
    stats: dict[str, Any] = {"problems": 0, "rows": 0, "kernels": sum(len(rs) for _, rs in problems),
                             "compile_wait_s": 0.0, "timing_s": 0.0}
    done_at: list[float] = []
    with gzip.open(args.out / "static_rows.jsonl.gz", "wt") as fh:
        try:
            for (fields, rs), fut in zip(problems, futures):
                tw = time.perf_counter()
                if tw - t0 > args.time_limit:  # compiles ahead of the timing: the wait below would not stop it
                    stats["stopped_at_time_limit"] = True
                    break
                try:  # the limit also bounds the wait for a problem's compiles (the run is compile-bound)
                    errors = [e for _, e in fut.result(timeout=max(0.0, args.time_limit - (tw - t0)))]
                except cf.TimeoutError:
                    stats["stopped_at_time_limit"] = True
                    break
                done_at.append(time.perf_counter() - t0)
                stats["compile_wait_s"] += time.perf_counter() - tw
                p = GemmProblem(**fields)
                cfgs = [(GemmConfig(**{k: r[k] for k in CONFIG_FIELDS}), e) for r, e in zip(rs, errors)]
                tt = time.perf_counter()
                out = measure_problem(p, cfgs, bench, spec, clock, static=True)
                stats["timing_s"] += time.perf_counter() - tt
                for row in out:
                    fh.write(json.dumps({**row, "unit": rs[0]["unit"], "kernel": "v4 static"}) + "\n")
                fh.flush()  # whole problems only, should the process be killed
                stats["problems"] += 1
                stats["rows"] += len(out)
                stats["kernels_done"] = stats.get("kernels_done", 0) + len(rs)
        finally:
            # a compile task is a whole problem's configs: stop the workers rather than wait for them
            workers = list(getattr(pool, "_processes", {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for w in workers:
                w.terminate()
    stats["wall_s"] = time.perf_counter() - t0
    # the compiles of the problems timed (a run stopped by --time-limit submitted more than it finished)
    stats["kernels_per_s"] = stats.get("kernels_done", 0) / max(done_at[-1] if done_at else 1e-9, 1e-9)
    stats["device"] = torch.cuda.get_device_name()
    (args.out / "stats.json").write_text(json.dumps(stats, indent=1))
    print(json.dumps(stats, indent=1))
    return 0


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def run_compare(args: argparse.Namespace) -> int:
    import torch

    from perfmodel import artifact
    from perfmodel.locations import default_model_dir
    from perfmodel.train import evaluate as ev
    from perfmodel.train.data import GemmTable, load_gemm

    static: dict[tuple, float] = {}
    for path in args.compare:
        with gzip.open(path if path.is_file() else path / "static_rows.jsonl.gz", "rt") as fh:
            for line in fh:
                r = json.loads(line)
                if r["kind"] == "triton" and r["status"] == "ok":
                    static[(r["unit"], *(r[k] for k in CONFIG_FIELDS))] = r["ms"]
    table = load_gemm(args.data)
    units = {u for u, *_ in static}
    sub = table.subset(np.array([k in units for k in table.problem_keys]))
    keys = [(sub.problem_keys[i], *map(int, c)) for i, c in zip(sub.problem_idx, sub.configs)]
    have = np.array([k in static for k in keys])
    # problems with every dataset config re-timed (failed static rows would bias the comparison)
    full = np.ones(len(sub.problems), bool)
    np.logical_and.at(full, sub.problem_idx, have)
    sub = sub.subset(full)
    keys = [(sub.problem_keys[i], *map(int, c)) for i, c in zip(sub.problem_idx, sub.configs)]
    ms_static = np.array([static[k] for k in keys])
    bundle = artifact.load(args.model or default_model_dir())
    P, C = torch.from_numpy(sub.problems[sub.problem_idx]), torch.from_numpy(sub.configs)
    with torch.inference_mode():
        x = bundle.encoders["gemm"].encode(P, C)
    score, pred = ev.head_outputs(bundle.heads["gemm"], x)
    screen = ev.head_outputs(bundle.heads[bundle.screen_name], x)[0]
    lead = ev.lead_outputs(bundle.heads["gemm"], x) if bundle.lead_keep else None
    timed_static = GemmTable(sub.problems, sub.problem_keys, sub.modes, sub.problem_idx, sub.configs, ms_static,
                             sub.cublas_ms)
    res: dict[str, Any] = {"model": str(args.model or "shipped default"), "problems": int(len(sub.problems)),
                           "rows": int(len(ms_static)), "problems_not_fully_retimed": int((~full).sum())}
    for name, t in (("dataset rows (v4)", sub), ("re-timed rows (--compare)", timed_static)):
        r = ev.rank_path(t, pred, screen, bundle.screen_keep, score, lead, bundle.lead_keep)
        res[name] = {k: round(v, 4) for k, v in r.items() if k.endswith("top1_eff") or k.endswith("top5_eff")
                     or k.endswith("spearman_median") or k.endswith("worst_top1")}
    per = []
    for i, rows in enumerate(sub.problem_rows()):
        v4, st = sub.ms[rows], ms_static[rows]
        per.append({"mode": str(sub.modes[i]), "spearman": _spearman(v4, st), "median_static_over_v4": float(np.median(st / v4)),
                    # the dataset oracle's pick, re-timed, over the re-timed oracle
                    "v4_pick_static_eff": float(st.min() / st[np.argmin(v4)])})
    for mode in ("all", "float16", "bfloat16", "tf32", "float32"):
        sel = [q for q in per if mode == "all" or q["mode"] == mode]
        if sel:
            res[f"per_problem/{mode}"] = {
                "problems": len(sel),
                "spearman_median": round(float(np.median([q["spearman"] for q in sel])), 3),
                "spearman_min": round(float(np.min([q["spearman"] for q in sel])), 3),
                "static_over_v4_median": round(float(np.median([q["median_static_over_v4"] for q in sel])), 4),
                "v4_oracle_pick_eff_geomean": round(float(np.exp(np.mean(np.log([q["v4_pick_static_eff"] for q in sel])))), 4),
                "v4_oracle_pick_eff_min": round(float(np.min([q["v4_pick_static_eff"] for q in sel])), 4)}
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=REPO / "data" / "h100")
    ap.add_argument("--per-mode", type=int, default=15, help="held-out problems per dtype mode (GPU)")
    ap.add_argument("--seed", type=int, default=0, help="the split's seed (the model's)")
    ap.add_argument("--split", choices=sorted(SPLITS), default="test", help="which split's problems (GPU)")
    ap.add_argument("--fastest", type=int, default=0,
                    help="GPU: time a problem's N fastest dataset configs (with --random) instead of all of them")
    ap.add_argument("--random", type=int, default=0, help="GPU: and N of its other configs, seeded per problem")
    ap.add_argument("--skip-done", type=Path, nargs="*", help="earlier output folders whose problems to leave out (GPU)")
    ap.add_argument("--time-limit", type=float, default=420.0, help="stop cleanly after this many seconds (GPU)")
    ap.add_argument("--out", type=Path, default=None, help="GPU: the output folder; --compare: a JSON file")
    ap.add_argument("--compare", type=Path, nargs="+", default=None,
                    help="CPU: compare GPU runs' folders (or rows files in their format) with --data")
    ap.add_argument("--model", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.compare is not None:
        return run_compare(args)
    if args.out is None:
        ap.error("--out: the output folder of the GPU run")
    return run_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
