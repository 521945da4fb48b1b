"""Side-by-side check of the sweep's timings against re-timed copies (CPU; reads dataset folders).

    python -m benchmarks.studies.retime_compare --sweep SWEEP_DIR [--cublas DIR ...] [--triton DIR] [--pad OLD_PAD_DIR]

--sweep is the GEMM sweep's folder; each --cublas folder holds `perfmodel gen cublas` parts (label =
folder name); --triton holds a `gen gemm` re-run of some problems (same configs where they overlap; the
rows it kept at one run, `reps` 1, apart too, and per problem the sweep's time of its fastest config
over the sweep's best); --pad compares the pad rows of an older pad run with the sweep folder's.
Prints time ratios.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from perfmodel.data_gen.shards import iter_rows


def ratios(name: str, x: np.ndarray, y: np.ndarray) -> None:
    r = x / y
    p5, p95 = np.percentile(r, [5, 95])
    print(f"{name:45s} n={len(r):5d} median {np.median(r):.3f}  p5 {p5:.3f}  p95 {p95:.3f}  "
          f">1.5x {(r > 1.5).sum():4d}  <0.67x {(r < 0.67).sum():4d}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", type=Path, required=True)
    ap.add_argument("--cublas", type=Path, nargs="*", default=[])
    ap.add_argument("--triton", type=Path, default=None)
    ap.add_argument("--pad", type=Path, default=None)
    args = ap.parse_args()
    rows = list(iter_rows(args.sweep, "gemm"))
    inline = {r["unit"]: r["ms"] for r in rows if r["kind"] == "cublas" and r["status"] == "ok"}
    quiet = {d.name: {r["unit"]: r["ms"] for r in iter_rows(d, "cublas") if r["status"] == "ok"} for d in args.cublas}
    names = list(quiet)
    for i, n in enumerate(names):
        u = [k for k in inline if k in quiet[n]]
        ratios(f"cuBLAS in-sweep / {n}", np.array([inline[k] for k in u]), np.array([quiet[n][k] for k in u]))
        for m in names[i + 1:]:
            u = [k for k in quiet[n] if k in quiet[m]]
            ratios(f"cuBLAS {n} / {m}", np.array([quiet[n][k] for k in u]), np.array([quiet[m][k] for k in u]))
    if args.triton:
        def key(r):
            return (r["unit"], r["block_m"], r["block_n"], r["block_k"], r["num_stages"], r["num_warps"])
        base = {key(r): r["ms"] for r in rows if r["kind"] == "triton" and r["status"] == "ok"}
        retimed = [r for r in iter_rows(args.triton, "gemm")
                   if r["kind"] == "triton" and r["status"] == "ok" and key(r) in base]
        x, y = np.array([(base[key(r)], r["ms"]) for r in retimed]).T
        single = np.array([r.get("reps") == 1 for r in retimed])
        ratios(f"Triton sweep / {args.triton.name}", x, y)
        ratios(f"Triton sweep / {args.triton.name}, runs < 20 us", x[y < 0.02], y[y < 0.02])
        if single.any():  # configs the re-time kept at their first run (TimingSettings.slow_factor)
            ratios(f"Triton sweep / {args.triton.name}, reps 1", x[single], y[single])
            ratios(f"Triton sweep / {args.triton.name}, reps > 1", x[~single], y[~single])
        # The ranking: per problem, the sweep's time of the re-time's fastest config over the sweep's best
        by_unit: dict[str, list[tuple[float, float]]] = {}
        for r in retimed:
            by_unit.setdefault(r["unit"], []).append((base[key(r)], r["ms"]))
        loss = np.array([min(v, key=lambda t: t[1])[0] / min(t[0] for t in v) for v in by_unit.values()])
        print(f"{'sweep ms of the re-time pick / sweep best':45s} n={len(loss):5d} median {np.median(loss):.3f}  "
              f"max {loss.max():.3f}  same pick {(loss == 1).mean():.3f}")
    if args.pad:
        def pkey(r):
            return tuple(r[f] for f in ("m", "k", "n", "dtype", "allow_tf32", "transpose_left", "transpose_right",
                                        "prepadded_left", "prepadded_right"))
        old = {pkey(r): r for r in iter_rows(args.pad, "pad") if r["status"] == "ok"}
        new = {pkey(r): r for r in iter_rows(args.sweep, "pad") if r["status"] == "ok"}
        ks = [k for k in new if k in old]
        for f in ("orig_ms", "padded_ms"):
            ratios(f"pad {f} {args.pad.name} / sweep folder", np.array([old[k][f] for k in ks]), np.array([new[k][f] for k in ks]))
        a = np.array([old[k]["padded_ms"] < old[k]["orig_ms"] for k in ks])
        b = np.array([new[k]["padded_ms"] < new[k]["orig_ms"] for k in ks])
        print(f"pad wins: {args.pad.name} {a.mean():.3f}, sweep folder {b.mean():.3f}, same decision {(a == b).mean():.3f}")


if __name__ == "__main__":
    main()
