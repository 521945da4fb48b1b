"""How many predictions of a model fall below the physical floor (the roofline at the device's max clock:
FLOPs at the dtype's peak, compulsory bytes (mk + kn + mn) * dtype_bytes at DRAM bandwidth).

Grid: m, n, k over 14 sizes (1 .. 65,537, odd ones among them) with 2mnk <= 1e13, four dtype modes;
per problem the gemm head's best config (rank top-1), the cuBLAS head, and the pad head's orig and
padded outputs -- through the public Predictor on both backends.

    python -m benchmarks.below_floor [--model PATH] [--max-flop 1e13]
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

from perfmodel import GemmProblem, PadProblem, Predictor
from perfmodel.schema import DTYPE_BYTES

SIZES = (1, 7, 16, 64, 127, 256, 1000, 1024, 2049, 4096, 8191, 16384, 32768, 65537)
MODES = (("float16", False), ("bfloat16", False), ("float32", False), ("float32", True))


def roofline_ms(spec, m: int, n: int, k: int, dtype: str, tf32: bool) -> float:
    nbytes = (m * k + k * n + m * n) * DTYPE_BYTES[dtype]
    return 1e3 * max(2.0 * m * n * k / spec.peak_flops(dtype, tf32), nbytes / spec.peak_bytes_per_s())


def count(p: Predictor, max_flop: float) -> tuple[int, int, dict[str, int]]:
    align = {"float16": 8, "bfloat16": 8, "float32": 4}
    total, below = 0, {"gemm": 0, "cublas": 0, "pad_orig": 0, "pad_padded": 0}
    for m, n, k in itertools.product(SIZES, repeat=3):
        if 2.0 * m * n * k > max_flop:
            continue
        for dtype, tf32 in MODES:
            floor = roofline_ms(p.spec, m, n, k, dtype, tf32)
            prob = GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=tf32)
            d = p.pad(PadProblem(m=m, k=k, n=n, dtype=dtype, allow_tf32=tf32))
            up = (lambda x: x if x == 1 else -(-x // align[dtype]) * align[dtype])
            got = {"gemm": (p.rank(prob, top_k=1)[0][1], floor), "cublas": (p.predict_cublas(prob), floor),
                   "pad_orig": (d.orig_ms, floor),
                   "pad_padded": (d.padded_ms, roofline_ms(p.spec, up(m), up(n), up(k), dtype, tf32))}
            for name, (ms, fl) in got.items():
                total += 1
                below[name] += int(not (ms >= fl * (1 - 1e-5)))
    return total, sum(below.values()), below


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--max-flop", type=float, default=1e13)
    args = ap.parse_args(argv)
    for backend in ("torch", "onnx"):
        total, n_below, below = count(Predictor.load(args.model, backend=backend), args.max_flop)
        print(f"{backend}: {n_below} of {total} predictions below the physical floor {below}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
