"""The shapes a model was trained on (its domain), and the physical floor in float64 (docs/design.md, "Domain").

A model folder's metadata "domain" holds, per kind of head, the least and greatest of each dimension, the
greatest FLOPs and the operand layouts (NN, NT, TN, TT: A, B transposed or not) of the rows the heads of that
kind were fitted on (written by the build from its data
folders: perfmodel.train.data.data_domain):

- "gemm": the Triton config heads (gemm, student, the config network's two modes, static) and the cuBLAS call
  heads -- the GEMM problems' rows;
- "cublas": torch.mm's time (the cuBLAS head, the problem network's cublas output) -- the GEMM problems, the
  cuBLAS-only problems and the pad rows' unpadded problems;
- "pad": the pad head -- the pad rows;
- "bmm": the bmm heads -- the bmm rows (batch too).

Outside it (a dimension below its least or above its greatest, more FLOPs than the greatest, or a layout none
of the rows had: data/h100's GEMM problems are NN or NT, never a transposed A) the Predictor
warns once per kind (OutsideDomainWarning) and `perfmodel rank` / `pad` print a note. A dimension m, n or k
below its least trained value is predicted at that value (RAISED): a tile kernel runs one tile and one
K-iteration for any size up to the smallest block (16), so the least trained sizes (m 1, n 32, k 16 in
data/h100) cost what a smaller one does, within the one or two tiles of n; a 1x1x1 problem is predicted as
1x32x16. Beyond the greatest, the heads extrapolate. Whatever the size, no time is below the problem's
roofline (roofline_ms, float64: a float32 feature's rounding cannot put it under).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from .schema import DTYPE_BYTES

KINDS = ("gemm", "cublas", "pad", "bmm")
# the dimensions of each kind's record
DIMS = {"gemm": ("m", "n", "k"), "cublas": ("m", "n", "k"), "pad": ("m", "k", "n"), "bmm": ("m", "n", "k", "batch")}
# dimensions predicted at the least trained value when below it (not batch: a batch's time grows with it)
RAISED = ("m", "n", "k")
WHAT = {"gemm": "the Triton configs and the cuBLAS call", "cublas": "torch.mm", "pad": "the pad decision",
        "bmm": "batched GEMMs"}


class OutsideDomainWarning(UserWarning):
    """A problem outside the shapes the model was trained on (perfmodel.domain): its times are extrapolated."""


def roofline_ms(spec: Any, m: Any, n: Any, k: Any, dtype: str | Sequence[str], allow_tf32: Any = False,
                batch: Any = 1) -> np.ndarray:
    """The physical floor in ms, float64 (DeviceSpec.roofline_ms, perfmodel/devices.py)."""
    return spec.roofline_ms(m, n, k, dtype, allow_tf32, batch)


def layout(transpose_left: Any, transpose_right: Any) -> str:
    """"NN", "NT", "TN" or "TT": A, then B, stored transposed (T) or not (N)."""
    return ("T" if transpose_left else "N") + ("T" if transpose_right else "N")


def record(rows: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """The metadata record of rows {kind: (N, len(DIMS[kind]) + 2) array of the dimensions in DIMS order, then
    transpose_left and transpose_right}: per kind, [least, greatest] of each dimension and of the FLOPs
    (2 m n k, times the batch), and the layouts seen."""
    out: dict[str, dict[str, Any]] = {}
    for kind, arr in rows.items():
        nd = len(DIMS[kind])
        arr = np.asarray(arr, dtype=np.float64).reshape(-1, nd + 2)
        if not len(arr):
            continue
        rec: dict[str, Any] = {d: [int(arr[:, i].min()), int(arr[:, i].max())] for i, d in enumerate(DIMS[kind])}
        flops = 2.0 * np.prod(arr[:, :nd], axis=1)
        rec["flops"] = [float(flops.min()), float(flops.max())]
        rec["layouts"] = sorted({layout(a, b) for a, b in arr[:, nd:].astype(bool).tolist()})
        out[kind] = rec
    return out


class Domain:
    """A model's domain (its metadata "domain"); None-safe: Domain.of(metadata) is None without a record."""

    def __init__(self, kinds: dict[str, dict[str, list[float]]]) -> None:
        self.kinds = {k: v for k, v in kinds.items() if k in KINDS}

    @classmethod
    def of(cls, metadata: dict[str, Any]) -> "Domain | None":
        rec = metadata.get("domain")
        return cls(rec) if isinstance(rec, dict) and rec else None

    def outside(self, kind: str, problem: Any) -> list[str]:
        """Why a problem (GemmProblem or PadProblem) is outside the kind's domain ([] inside, or no record)."""
        rec = self.kinds.get(kind)
        if rec is None:
            return []
        why = []
        for d in DIMS[kind]:
            lo, hi = rec.get(d, (None, None))
            v = getattr(problem, d, 1)
            if lo is not None and v < lo:
                why.append(f"{d}={v} < {lo}")
            elif hi is not None and v > hi:
                why.append(f"{d}={v} > {hi}")
        flops = 2.0 * problem.m * problem.n * problem.k * getattr(problem, "batch", 1)
        top = rec.get("flops", (None, None))[1]
        if top is not None and flops > top:
            why.append(f"{flops:.3g} FLOP > {top:.3g}")
        lay = layout(problem.transpose_left, problem.transpose_right)
        if "layouts" in rec and lay not in rec["layouts"]:
            why.append(f"layout {lay} (A, B transposed: T) not among {'/'.join(rec['layouts'])}")
        return why

    def raised(self, kind: str, problem: Any) -> Any:
        """The problem as the kind's heads predict it: m, n and k below the least trained value raised to it
        (the problem itself when none is)."""
        rec = self.kinds.get(kind)
        if rec is None:
            return problem
        up = {d: int(rec[d][0]) for d in RAISED if d in rec and getattr(problem, d) < rec[d][0]}
        if not up:
            return problem
        from dataclasses import replace

        return replace(problem, **up)

    def describe(self, kind: str) -> str:
        """The kind's trained ranges, e.g. "m 1-59920, n 32-152064, k 16-65024, up to 5.5e+12 FLOP"."""
        rec = self.kinds.get(kind, {})
        parts = [f"{d} {rec[d][0]}-{rec[d][1]}" for d in DIMS[kind] if d in rec]
        if "flops" in rec:
            parts.append(f"up to {rec['flops'][1]:.3g} FLOP")
        if "layouts" in rec:
            parts.append("layouts " + "/".join(rec["layouts"]))
        return ", ".join(parts)

    def message(self, source: str, kind: str, problem: Any, why: Iterable[str]) -> str:
        """The warning (and CLI note) for a problem outside the kind's domain."""
        low = any("<" in w for w in why)
        return (f"{source}: {_short(problem)} is outside the shapes the model was trained on for {WHAT[kind]} "
                f"({'; '.join(why)}; trained: {self.describe(kind)}): "
                + ("sizes below the least trained are predicted at it, " if low else "")
                + "the times are extrapolated (never below the physical floor)")


def _short(problem: Any) -> str:
    batch = getattr(problem, "batch", 1)
    dims = f"m={problem.m}, n={problem.n}, k={problem.k}" + (f", batch={batch}" if batch != 1 else "")
    return f"{type(problem).__name__}({dims}, {problem.dtype})"

