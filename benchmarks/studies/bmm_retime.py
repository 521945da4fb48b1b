"""How repeatable are the bmm sweep's timings? The ceiling of any bmm ranking against one timing (CPU).

A sweep's draw is deterministic (seed, n, modes, the folder whose problems it excluded), so running `perfmodel gen
bmm` again with the same arguments on one H100 re-times the same problems and configs in the same order. Two such
re-times are committed under benchmarks/results/bmm_retime_h100/, each stopped after a few minutes:

- sweep4: the fourth sweep (data/h100's bmm-s0of1-p003: `--modes float16,tf32 --seed 3 --n 600 --exclude-from <a
  folder with the first three bmm parts>`), its first 247 problems, re-timed in the same session's later call;
- sweep1: the first sweep (bmm-s0of1-p000: `--seed 0 --n 300`, every mode), all 300 problems, a day after it
  was timed (then on a machine running a second GPU job beside it);
- sweep1b: the same 300 problems timed once more, on another day, alone on the GPU: `--sweep 1q` compares the two
  re-times, two timings neither of which shared the GPU.

Each is compared with data/h100's timing of the same problems, config by config:

- top-1 of the first timing's fastest config scored on the re-time (and the reverse): what a model that knew
  one timing exactly would score against another -- the noise ceiling of the held-out top-1;
- how often the aten-or-Triton call (aten::bmm against the fastest config) is the same in both timings: the
  ceiling of the call's accuracy;
- the ratio of the two times of each config.

    python -m benchmarks.studies.bmm_retime --sweep 4 --out benchmarks/results/bmm_retime_h100_sweep4.json
    python -m benchmarks.studies.bmm_retime --sweep 1 --out benchmarks/results/bmm_retime_h100_sweep1.json
    python -m benchmarks.studies.bmm_retime --sweep 1q --out benchmarks/results/bmm_retime_h100_sweep1q.json
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
from pathlib import Path
from typing import Any

from benchmarks import REPO
CONFIG = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")
PROBLEM = ("m", "n", "k", "dtype", "allow_tf32", "transpose_left", "transpose_right", "batch")
RETIMES = REPO / "benchmarks/results/bmm_retime_h100"
# sweep: (the first timing, the second): data/h100's part file and its committed re-time; "1q" the first
# sweep's two committed re-times
SWEEPS = {"4": (REPO / "data/h100/bmm-s0of1-p003.jsonl.gz", RETIMES / "sweep4/bmm-s0of1-p000.jsonl.gz"),
          "1": (REPO / "data/h100/bmm-s0of1-p000.jsonl.gz", RETIMES / "sweep1/bmm-s0of1-p000.jsonl.gz"),
          "1q": (RETIMES / "sweep1/bmm-s0of1-p000.jsonl.gz", RETIMES / "sweep1b/bmm-s0of1-p000.jsonl.gz")}


def timings(path: Path) -> tuple[dict[tuple, dict[tuple, float]], dict[tuple, float]]:
    """({problem: {config: ms}} of the Triton rows, {problem: aten::bmm ms}) of one bmm part file (ok rows)."""
    triton: dict[tuple, dict[tuple, float]] = collections.defaultdict(dict)
    aten: dict[tuple, float] = {}
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        for r in map(json.loads, f):
            if r.get("_header") or r.get("status") != "ok" or "kind" not in r:
                continue
            key = tuple(r[k] for k in PROBLEM)
            if r["kind"] == "triton":
                triton[key][tuple(r[k] for k in CONFIG)] = r["ms"]
            elif r["kind"] == "aten":
                aten[key] = r["ms"]
    return triton, aten


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def compare(first: tuple[dict, dict], second: tuple[dict, dict]) -> dict[str, Any]:
    """The figures above, over the problems both timed (two or more configs in common)."""
    (ta, aa), (tb, ab) = first, second
    eff, rev, ratios, calls = [], [], [], []
    by_mode: dict[str, list[float]] = collections.defaultdict(list)
    for key in tb:
        common = [c for c in tb[key] if c in ta.get(key, {})]
        if len(common) < 2:
            continue
        a, b = {c: ta[key][c] for c in common}, {c: tb[key][c] for c in common}
        best_a, best_b = min(a, key=a.get), min(b, key=b.get)
        eff.append(b[best_b] / b[best_a])
        rev.append(a[best_a] / a[best_b])
        by_mode["tf32" if key[4] else key[3]].append(eff[-1])
        ratios += [b[c] / a[c] for c in common]
        if key in aa and key in ab:
            calls.append((aa[key] < a[best_a]) == (ab[key] < b[best_b]))
    ratios.sort()
    n = len(ratios)
    return {"problems": len(eff), "configs": n,
            "top1_first_on_second": _geomean(eff), "top1_second_on_first": _geomean(rev),
            "top1_by_mode": {m: {"problems": len(v), "top1": _geomean(v)} for m, v in sorted(by_mode.items())},
            "picks_differ": sum(e < 1 for e in eff) / max(1, len(eff)),
            "picks_below_0.97": sum(e < 0.97 for e in eff) / max(1, len(eff)),
            "call_same": sum(calls) / max(1, len(calls)), "call_problems": len(calls),
            "time_ratio": {"median": ratios[n // 2], "p5": ratios[n // 20], "p95": ratios[-(n // 20) - 1]} if n else {}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", choices=sorted(SWEEPS), default="4", help="which committed re-time")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    res = compare(*(timings(p) for p in SWEEPS[args.sweep]))
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return res


if __name__ == "__main__":
    main()
