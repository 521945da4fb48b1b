"""Do N processes compiling one model in deterministic mode choose identical kernels? (GPU; issue 50)

Each of --procs subprocesses (--parallel at a time, on one GPU) builds one benchmarks.model_bench workload (its
seed, its inputs), compiles it with perfmodel.serve.compile.compile(model, deterministic=True) in a fresh Inductor
cache, calls it once, and writes its record: the decisions (compile.decisions()), the recorded lookup table
(compile.lookup_table()) and the names of the kernels Inductor generated, read from the fresh cache's output code
(the `def triton_...` / `extern_kernels.` / `async_compile.triton('...')` names: a cheap fingerprint of the code,
not its hash, since generated source holds paths of the cache). The parent reports how many distinct decision sets,
tables and kernel-name sets there are (1 each: deterministic).

    python -m benchmarks.studies.determinism --workload "GPT-2 124M, fp16, 8x512" --procs 20 --parallel 4 \\
        --out benchmarks/results/determinism_h200.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import RESULTS

_NAMES = re.compile(r"(?:def (triton_\w+)|async_compile\.triton\('(\w+)'|(extern_kernels\.\w+))")


def digest(obj: Any) -> str:
    """A short sha256 of obj's canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def kernel_names(cache_dir: Path) -> list[str]:
    """The kernels Inductor's output code under cache_dir names (generated Triton kernels and extern calls), sorted,
    each once."""
    names: set[str] = set()
    for f in Path(cache_dir).rglob("*.py"):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if "async_compile" not in text and "extern_kernels" not in text:
            continue
        for m in _NAMES.finditer(text):
            names.add(next(g for g in m.groups() if g))
    return sorted(names)


def report(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The processes' records compared: per field (decisions, lookup_table, kernels) the number of distinct values
    among the records that have no error, and which processes hold each; deterministic: one of each and no error."""
    ok = [r for r in records if "error" not in r]
    out: dict[str, Any] = {"procs": len(records), "errors": [r["error"] for r in records if "error" in r]}
    for field in ("decisions", "lookup_table", "kernels"):
        groups: dict[str, list[int]] = {}
        for r in ok:
            groups.setdefault(digest(r.get(field)), []).append(r["proc"])
        out[field] = {"distinct": len(groups), "groups": groups}
    out["deterministic"] = bool(ok) and not out["errors"] and all(out[f]["distinct"] == 1
                                                                   for f in ("decisions", "lookup_table", "kernels"))
    return out


def _child(workload: str, proc: int, out: Path) -> None:
    """One process: build, compile deterministically in a fresh cache, call once, write the record."""
    import torch
    from torch._inductor import utils as ind_utils

    from benchmarks.model_bench import WORKLOADS, _flat
    from perfmodel.serve import compile as pc

    wl = next((w for w in WORKLOADS if w.name == workload), None)
    if wl is None:
        raise ValueError(f"--workload: no workload named {workload!r} (python -m benchmarks.model_bench --list)")
    torch.backends.cuda.matmul.allow_tf32 = wl.tf32
    torch.manual_seed(0)
    module, inputs, fwd = wl.build(torch.device("cuda"))
    fresh = getattr(ind_utils, "fresh_cache", None) or getattr(ind_utils, "fresh_inductor_cache")
    with tempfile.TemporaryDirectory() as cache, fresh(dir=cache), torch.no_grad():
        pc.reset()
        compiled = pc.compile(module, deterministic=True)
        t0 = time.perf_counter()
        _flat(fwd(compiled, *inputs))
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        from dataclasses import asdict

        # the decisions without the model's times (floating point: compared as choices, not as timings)
        decisions = [{k: v for k, v in asdict(d).items() if k not in ("cublas_ms", "triton_ms")}
                     for d in pc.decisions()]
        record = {"proc": proc, "workload": workload, "compile_s": compile_s, "decisions": decisions,
                  "lookup_table": pc.lookup_table(), "kernels": kernel_names(Path(cache))}
    out.write_text(json.dumps(record))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="GPT-2 124M, fp16, 8x512", help="a model_bench workload's full name")
    ap.add_argument("--procs", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=4, help="processes at a time (one GPU)")
    ap.add_argument("--out", type=Path, default=RESULTS / "determinism_h200.json")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        _child(args.workload, args.child, args.record)
        return 0
    if args.procs < 1 or args.parallel < 1:
        ap.error("--procs and --parallel: expected positive ints")
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        pending = list(range(args.procs))
        running: list[tuple[int, subprocess.Popen, Path, float]] = []
        while pending or running:
            while pending and len(running) < args.parallel:
                i = pending.pop(0)
                rec = Path(tmp) / f"{i}.json"
                cmd = [sys.executable, "-m", __spec__.name, "--workload", args.workload, "--child", str(i),
                       "--record", str(rec)]
                running.append((i, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}),
                                rec, time.perf_counter()))
            time.sleep(1.0)
            for item in list(running):
                i, p, rec, t0 = item
                if p.poll() is None and time.perf_counter() - t0 < args.timeout:
                    continue
                if p.poll() is None:
                    p.kill()
                err = p.stderr.read() if p.stderr else ""
                running.remove(item)
                if p.returncode == 0 and rec.is_file():
                    records.append(json.loads(rec.read_text()))
                else:
                    records.append({"proc": i, "error": f"exit {p.returncode}: {err[-1500:]}"})
                print(f"[determinism] process {i}: " + ("ok" if "error" not in records[-1] else "failed"),
                      flush=True)
    records.sort(key=lambda r: r["proc"])
    rep = {"workload": args.workload, **report(records)}
    print(json.dumps({k: (v if k not in ("decisions", "lookup_table", "kernels") else v["distinct"])
                      for k, v in rep.items()}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"report": rep, "records": records}, indent=1) + "\n")
    return 0 if rep["deterministic"] else 1


if __name__ == "__main__":
    sys.exit(main())
