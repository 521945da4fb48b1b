"""The served runnable rule (perfmodel.configs.shared_memory_need / runnable_for) against Triton's own shared memory
count: kernels of timed rows compiled on the CPU for sm_90 (`metadata.shared`), from

    python -m benchmarks.studies.runnable_rule --measure 300 --out benchmarks/results/runnable_rule.txt

(the compiled counts: benchmarks/results/runnable_rule_compiled.json; the rule against every timed row:
benchmarks/results/runnable_rule.txt). Each case below is one compiled row of that file.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from perfmodel import GemmConfig, GemmProblem
from perfmodel.configs import fits, runnable, runnable_for, shared_memory_need
from perfmodel.devices import get_spec

H200 = get_spec("h200")
E = {"float16": 2, "bfloat16": 2, "float32": 4}
CACHE = Path(__file__).resolve().parents[1] / "benchmarks/results/runnable_rule_compiled.json"

# (part, m, n, k, dtype, allow_tf32, transpose_left, transpose_right, (BM, BN, BK, stages, warps), Triton's shared)
MEASURED = [
    # the example: 2047 bf16 rows are 4,094 bytes, no 16-byte (not even 4-byte) alignment: no cp.async, one
    # buffer per operand; at 2048 every stage (wgmma), as the old rule counted
    ("gemm_static", 2047, 2047, 2047, "bfloat16", False, False, False, (128, 256, 64, 5, 8), 49152),
    ("gemm_static", 2048, 2048, 2048, "bfloat16", False, False, False, (128, 256, 64, 5, 8), 245760),
    # A's K stride (1445 bf16) unaligned: A one buffer, B four
    ("bmm", 128, 1024, 1445, "bfloat16", False, False, False, (128, 128, 128, 4, 8), 163840),
    ("bmm", 1024, 128, 1024, "bfloat16", False, False, False, (128, 128, 128, 4, 8), 262144),  # failed on the GPU
    # IEEE fp32 (no wgmma): one stage fewer; one K iteration in a static compile: one buffer
    ("bmm", 197, 64, 197, "float32", False, False, False, (64, 64, 128, 4, 4), 196608),
    ("bmm", 128, 128, 128, "float32", False, True, False, (64, 64, 128, 5, 4), 65536),
    ("bmm", 752, 752, 128, "float32", False, False, False, (128, 128, 64, 5, 8), 262144),
    # mma.sync (2 warps, or BLOCK_M < 64): one stage fewer; a 1-stage config: one buffer
    ("gemm", 272, 29952, 256, "float32", False, False, False, (16, 64, 128, 4, 2), 122880),
    ("gemm", 64, 4608, 3584, "bfloat16", False, False, True, (64, 64, 64, 1, 2), 16384),
    ("gemm_static", 333, 14336, 4096, "bfloat16", False, False, True, (32, 128, 64, 1, 8), 20480),
]


def _need(part, m, n, k, dtype, tf32, tl, tr, cfg) -> int:
    bm, bn, bk, s, w = cfg
    return int(shared_memory_need(bm, bn, bk, s, w, E[dtype], dtype == "float32" and not tf32, m, n, k, tl, tr,
                                  static=part != "gemm"))


@pytest.mark.parametrize("case", MEASURED)
def test_need_equals_triton(case) -> None:
    *args, shared = case
    assert _need(*args) == shared


def test_need_never_above_triton_on_the_measurement() -> None:
    """Every compiled row of the measurement: the rule never counts more than Triton (it may err only towards
    runnable), and equals it on nearly all (the rest: Triton's epilogue scratch above the operand buffers)."""
    cache = json.loads(CACHE.read_text())
    rows = [(v["part"], v["row"], v["shared"]) for v in cache.values() if isinstance(v["shared"], int)]
    assert len(rows) >= 900
    need = np.array([_need(p, r["m"], r["n"], r["k"], r["dtype"], r["allow_tf32"], r["transpose_left"],
                           r["transpose_right"], (r["block_m"], r["block_n"], r["block_k"], r["num_stages"],
                                                  r["num_warps"])) for p, r, _ in rows])
    shared = np.array([s for _, _, s in rows])
    assert (need <= shared).all()
    assert (need == shared).mean() > 0.97
    # and the decision is Triton's on every row: the scratch left out is at most BM*BN*4 <= 128 KiB in reach
    assert ((need <= H200.shared_memory_per_block_optin) == (shared <= H200.shared_memory_per_block_optin)).all()


def test_per_problem_rule_admits_the_example() -> None:
    cfg = GemmConfig(128, 256, 64, 8, 5, 8)
    odd, even = (GemmProblem(m=s, n=s, k=s, dtype="bfloat16") for s in (2047, 2048))
    assert not fits(cfg, "bfloat16", H200)  # not for every problem: the operand tiles of 5 stages are 245,760 bytes
    assert fits(cfg, "bfloat16", H200, odd) and not fits(cfg, "bfloat16", H200, even)
    ct = np.array([[128, 256, 64, 8, 5, 8], [64, 64, 32, 8, 3, 4]])
    assert runnable_for(ct, [odd, even], H200).tolist() == [[True, True], [False, True]]
    # never below the per-config bound: what fits for every problem fits for each
    assert runnable(ct, 2.0, H200).tolist() == [False, True]


def test_served_mask_admits_the_example(tmp_path: Path) -> None:
    from perfmodel.serve import Predictor
    from tests._synthetic import write_synthetic_model

    pt = Predictor.load(write_synthetic_model(tmp_path / "m", onnx=False), backend="torch")
    cfgs = [GemmConfig(128, 256, 64, 8, 5, 8), GemmConfig(64, 64, 32, 8, 3, 4)]
    odd, even = (GemmProblem(m=s, n=s, k=s, dtype="bfloat16") for s in (2047, 2048))
    ms = pt.predict_many([odd, even], cfgs)
    limit_ok = fits(cfgs[0], "bfloat16", pt.spec, odd)
    assert np.isfinite(ms[1, 1]) and np.isfinite(ms[0, 1])
    assert np.isfinite(ms[0, 0]) == limit_ok and (np.isinf(ms[1, 0]) or fits(cfgs[0], "bfloat16", pt.spec, even))
    top = pt.rank(odd, cfgs, top_k=2)
    assert all(np.isfinite(t) for _, t in top) == limit_ok


def test_rule_key_decides_the_mask() -> None:
    """serve caches a config set's per-problem masks by rule_key: problems with equal keys get equal masks."""
    import random
    from dataclasses import astuple

    from perfmodel.configs import exhaustive_space, rule_key

    rng = random.Random(0)
    ct = np.array([astuple(c) for c in exhaustive_space()])
    probs = [GemmProblem(m=rng.choice([1, 7, 16, 100, 333, 2047, 2048]) * rng.choice([1, 16]),
                         n=rng.choice([1, 3, 64, 1000, 2047, 4096]), k=rng.choice([16, 40, 64, 100, 256, 257, 3000, 4096]),
                         dtype=rng.choice(["float16", "bfloat16", "float32"]), allow_tf32=rng.random() < 0.5,
                         transpose_left=rng.random() < 0.5, transpose_right=rng.random() < 0.5) for _ in range(300)]
    masks = runnable_for(ct, probs, H200)
    seen: dict[tuple, np.ndarray] = {}
    for p, m in zip(probs, masks):
        assert (seen.setdefault(rule_key(p), m) == m).all(), p
    assert len(seen) < len(probs)  # the check compared something
