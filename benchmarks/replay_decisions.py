"""Would another model folder decide the whole-model benchmark's GEMMs the same way? (CPU)

benchmarks/model_bench.py records every mm/addmm/bmm/baddbmm the set-up (perfmodel.serve.compile) decided, with
its problem. This script replays those decisions with Policy() under two model folders -- the one that was
measured and a candidate (a refit head, a retrained model) -- and lists the problems where the candidate keeps
Triton where the measured one did not (or the reverse) or keeps other Triton configs. Where nothing differs,
the candidate compiles those workloads to the same kernels and the measured step times carry over to it;
where something differs, the workload needs measuring again on the GPU before the candidate ships.

The replay ranks Inductor's default config list for each problem (perfmodel.configs.inductor_default_configs);
in the graph Inductor offers that list filtered by the problem's size, so `--check` first replays the measured
folder and reports how often it reproduces the recorded decisions. The pad decisions of the GEMMs given with
--pad (m,k,n,dtype[,tl][,tr]) are compared as well (the pad hook's decision with Triton in play and
Inductor's default configs offered, as under the set-up). Exit status 1 when anything differs.

    python -m benchmarks.replay_decisions --measured models/h100 --candidate /tmp/new_h100 \
        [--results benchmarks/results/model_bench_h100.json] [--pad 4096,768,50257,float16] [--device h200]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import REPO


def recorded(results: dict[str, Any], variant: str = "perfmodel") -> dict[tuple, dict[str, Any]]:
    """{(op, problem items): the first recorded decision} over every row of `variant` (its repeats included)."""
    out: dict[tuple, dict[str, Any]] = {}
    for name, r in results.get("workloads", {}).items():
        for v, x in r.get("variants", {}).items():
            if v.split("@", 1)[0] != variant:
                continue
            for d in x.get("decisions", []):
                key = (d["op"], tuple(sorted(d["problem"].items())))
                out.setdefault(key, dict(d, workload=name))
    return out


def replay(predictor: Any, op: str, problem: dict[str, Any], policy: Any) -> tuple[bool, list[str], bool]:
    """(Triton kept, the kept configs, a bmm's config kept alone without aten) for one recorded problem under
    `predictor` and `policy`."""
    from perfmodel.configs import inductor_default_configs
    from perfmodel.schema import GemmProblem
    from perfmodel.serve.compile import decide, kept_alone

    cfgs = list(inductor_default_configs())
    prob = GemmProblem(**problem)
    keep, best, aten = decide(predictor, prob, cfgs, policy)
    sure = kept_alone(prob, keep, best, aten, policy)
    return keep, [str(cfgs[i]) for i, _ in (best[:1] if sure else best)] if keep else [], sure


def _load(folder: str, device: str | None = None) -> Any:
    from perfmodel.serve.predictor import Predictor

    p = Predictor.load(folder, backend="torch", device=device)
    return p.with_kernel("inductor") if p.has_static else p


def _pad_problem(text: str) -> Any:
    from perfmodel.schema import PadProblem

    parts = text.split(",")
    try:
        m, k, n = (int(x) for x in parts[:3])
    except ValueError:
        raise SystemExit(f"--pad: expected m,k,n,dtype[,tl][,tr], got {text!r}") from None
    flags = set(parts[4:])
    return PadProblem(m=m, k=k, n=n, dtype=parts[3] if len(parts) > 3 else "float16",
                      transpose_left="tl" in flags, transpose_right="tr" in flags)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", required=True, help="the model folder the results were measured with")
    ap.add_argument("--candidate", required=True, help="the model folder to compare")
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks/results/model_bench_h100.json")
    ap.add_argument("--variant", default="perfmodel", help="the set-up variant whose decisions are replayed")
    ap.add_argument("--pad", action="append", default=[], help="m,k,n,dtype[,tl][,tr] (repeatable)")
    ap.add_argument("--device", default=None, help="the device the results were measured on (default: the GPU "
                                                   "here, else the model's default device): h200 for a H200 run")
    args = ap.parse_args(argv)
    if not args.results.is_file():
        ap.error(f"--results: no such file {args.results}")
    from perfmodel.configs import inductor_default_configs
    from perfmodel.serve.compile import Policy
    from perfmodel.serve.decisions import hook_pad_decision

    policy = Policy()
    rec = recorded(json.loads(args.results.read_text()), args.variant)
    if not rec:
        ap.error(f"--results: no decisions of variant {args.variant!r}")
    old, new = _load(args.measured, args.device), _load(args.candidate, args.device)
    same_as_recorded = diff = 0
    for (op, items), d in rec.items():
        problem = dict(items)
        a, b = replay(old, op, problem, policy), replay(new, op, problem, policy)
        same_as_recorded += (a[0] == d["triton"] and (not a[0] or a[1] == d["configs"]) and a[2] == d.get("sure", False))
        if a != b:
            diff += 1
            print(f"differs: {d['workload']}: {op} {problem} measured {a} candidate {b}")
    print(f"{len(rec)} recorded GEMM problems; the measured folder's replay reproduces {same_as_recorded} of the "
          f"recorded decisions; the candidate decides {diff} of them differently")
    for text in args.pad:
        pp = _pad_problem(text)
        # the set-up compiles with Inductor's mm templates on: Triton is in play for the pad hook, which weighs
        # the configs autotuning offers (DEFAULT search space: Inductor's default list; serve.inductor)
        offered = list(inductor_default_configs())
        a, b = hook_pad_decision(old, pp, True, offered), hook_pad_decision(new, pp, True, offered)
        print(f"pad {text}: measured pad={a.should_pad} candidate pad={b.should_pad}" + (" (differs)" if a.should_pad != b.should_pad else ""))
        diff += a.should_pad != b.should_pad
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
