"""What more ensemble members would cost the one-problem `rank` (CPU, onnxruntime, one thread).

The served ensemble runs in the ONNX graph as one chain of 2-D Gemm+Relu products per member (model.MemberNet) on
the lead member's best 12 rows (lead_keep). This times such chains alone -- G members x W wide, three hidden
layers, the gemm encoder's 48 inputs, random weights (only the latency is measured) -- for the member counts and
widths the config network was tried with, alternated in blocks of 50 calls, medians over 30 blocks:

    python -m benchmarks.studies.ensemble_latency --out benchmarks/results/ensemble_latency_cpu2.json
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ARMS = ((3, 256), (4, 192), (6, 128), (6, 192), (6, 256))


class Chains(torch.nn.Module):
    """G member MLPs side by side, their outputs summed (as MemberNet's forward)."""

    def __init__(self, members: int, width: int, n_in: int = 48, depth: int = 3) -> None:
        super().__init__()
        self.members = torch.nn.ModuleList(
            torch.nn.Sequential(*[m for j in range(depth) for m in (torch.nn.Linear(n_in if j == 0 else width, width),
                                                                    torch.nn.ReLU())], torch.nn.Linear(width, 1))
            for _ in range(members))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.members[0](x)
        for m in self.members[1:]:
            out = out + m(x)
        return out


def session(members: int, width: int):
    import onnxruntime as ort

    torch.manual_seed(0)
    f = io.BytesIO()
    torch.onnx.export(Chains(members, width), (torch.randn(12, 48),), f, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}}, dynamo=False)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    return ort.InferenceSession(f.getvalue(), opts, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[12, 16])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    sessions = {arm: session(*arm) for arm in ARMS}
    res: dict = {"arms": [f"{g}x{w}" for g, w in ARMS], "us": {}}
    for rows in a.rows:
        x = np.random.default_rng(0).standard_normal((rows, 48)).astype(np.float32)
        times: dict = {arm: [] for arm in ARMS}
        for _ in range(a.blocks):
            for arm, s in sessions.items():
                t0 = time.perf_counter()
                for _ in range(50):
                    s.run(None, {"x": x})
                times[arm].append((time.perf_counter() - t0) / 50 * 1e6)
        res["us"][str(rows)] = {f"{g}x{w}": float(np.median(v)) for (g, w), v in times.items()}
        print(rows, "rows:", {k: round(v, 1) for k, v in res["us"][str(rows)].items()}, "us", flush=True)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
