"""What one answer per question costs in serving latency (CPU), measured side by side in one process.

Before issue 47, `rank` screened (the student on every config, the gemm ensemble on its best) and `predict` ran
the student alone; now both run the gemm ensemble on every config (predict's argmin is rank's top-1), and
cuBLAS's time needs the whole space's best config. The paths served before are still in the Predictor -- the
screened ranking is `rank(..., screened=True)`, the student's predict graph is in model.onnx -- so each new
path is timed against the old one it replaces, alternating in blocks of calls (a noisy, shared machine's slow
spells hit both), one problem or 100 (fp16, dims log-uniform 16-16384) against 368 configs (a stratified
sample of the fp16 space, as benchmarks/serve_latency.py) or the whole space (1,206 configs):

- rank (top 5): every config scored (now) / screened (before);
- predict: the gemm ensemble (now) / the student's ONNX predict graph (before);
- predict_cublas: the one cuBLAS time, its whole-space best not yet kept (now) / the cuBLAS head (before);
- candidates of the whole space (now; the CLI's and the API's call), for scale.

    python -m benchmarks.studies.one_answer_latency [--model models/h100] [--repeats 20] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks import REPO


def _time(pairs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], repeats: int, block: int) -> dict:
    """Per name: p50 ms of the new and the old path, alternating in blocks, and the median over rounds of new / old."""
    out = {}
    for name, (new, old) in pairs.items():
        new(), old()  # warm
        t = {"new": [], "old": []}
        ratios = []
        for r in range(max(1, repeats // block)):
            med = {}
            for which in (("new", "old") if r % 2 == 0 else ("old", "new")):
                fn, times = (new if which == "new" else old), []
                for _ in range(block):
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
                t[which] += times
                med[which] = float(np.median(times))
            ratios.append(med["new"] / med["old"])
        out[name] = {"new_p50_ms": float(np.median(t["new"])), "old_p50_ms": float(np.median(t["old"])),
                     "ratio_round_median": float(np.median(ratios)), "calls": len(t["new"])}
        r = out[name]
        print(f"{name:46s} now {r['new_p50_ms']:9.2f} ms  before {r['old_p50_ms']:8.2f} ms  "
              f"x{r['ratio_round_median']:.1f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    from perfmodel.configs import pruned_space, stratified_sample
    from perfmodel.domain import OutsideDomainWarning
    from perfmodel.features import problems_array
    from perfmodel.schema import GemmProblem
    from perfmodel.serve import Predictor

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models" / "h100")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", OutsideDomainWarning)
    p = Predictor.load(args.model, backend="onnx")
    space = list(p.default_configs("float16"))
    configs = stratified_sample(pruned_space("float16", p.spec), 368, 0)
    rng = np.random.default_rng(0)
    dims = np.exp(rng.uniform(np.log(16), np.log(16384), size=(100, 3))).astype(int)
    problems = [GemmProblem(m=int(m), n=int(n), k=int(k), dtype="float16") for m, n, k in dims]
    one = GemmProblem(m=4096, n=4096, k=4096, dtype="float16")
    _, _, part368, _ = p._configs(configs, "float16")
    _, _, part_all, _ = p._configs(None, "float16")

    def student(probs, part):  # predict before: the student's ONNX graph (model.onnx's predict_log_ms)
        return np.exp(p._run.predict(problems_array(probs), part, p.kernel).astype(np.float64))

    def cublas_cold(prob):  # the whole-space best not yet kept: what a new shape costs
        p._space_cache.clear()
        return p.predict_cublas(prob)

    def cublas_head(prob):
        return p._cublas_ms(p._cublas_x([prob]))

    n = args.repeats
    res = {"model": str(args.model.name), "cpu_count": os.cpu_count(), "n_space": len(space)}
    try:
        res["loadavg_before"] = os.getloadavg()[0]
    except OSError:
        pass
    res["one"] = _time({
        "rank, 1 problem, 368 configs": (lambda: p.rank(one, configs), lambda: p.rank(one, configs, screened=True)),
        "rank, 1 problem, the whole space": (lambda: p.rank(one), lambda: p.rank(one, screened=True)),
        "predict, 1 problem, 368 configs": (lambda: p.predict(one, configs), lambda: student([one], part368)),
        "predict_cublas, 1 problem (new shape)": (lambda: cublas_cold(one), lambda: cublas_head(one)),
        "candidates, 1 problem, the whole space": (lambda: p.candidates(one), lambda: p.rank(one, screened=True)),
    }, n, block=5)
    res["many"] = _time({
        "rank_many, 100 problems, 368 configs": (lambda: p.rank_many(problems, configs),
                                                 lambda: p.rank_many(problems, configs, screened=True)),
        "predict_many, 100 problems, 368 configs": (lambda: p.predict_many(problems, configs),
                                                    lambda: student(problems, part368)),
    }, max(2, n // 5), block=1)
    del part_all
    if args.out is not None:
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
