"""The shipped model (models/h100) keeps its held-out quality, and its ONNX graph agrees with the torch
weights. Floors a little below the figures of `perfmodel eval` when this test was written
(the model trained on dataset v4: top-1 fp16 0.9825, bf16 0.9756, fp32 0.9731; top-5 >= 0.9963; pad total
vs oracle 1.0121; cuBLAS-or-Triton call 0.896)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfmodel import GemmProblem, Predictor

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "h100"


@pytest.mark.slow
def test_shipped_model_held_out_quality() -> None:
    if not (REPO / "data" / "h100").is_dir():
        pytest.skip("no dataset (data/h100) in this checkout")
    r = subprocess.run([sys.executable, "-m", "perfmodel.cli", "eval", "--model", str(MODEL), "--json"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    m = out["results"]["perfmodel"]
    assert m["float16/top1_eff"] >= 0.98
    assert m["bfloat16/top1_eff"] >= 0.97
    assert m["fp32_all/top1_eff"] >= 0.97
    for mode in ("float16", "bfloat16", "fp32_all"):
        assert m[f"{mode}/top5_eff"] >= 0.995, mode
    assert out["pad"]["pad/total_vs_oracle"] <= 1.015
    assert out["cublas"]["cublas/choice_accuracy"] >= 0.89


def test_shipped_onnx_agrees_with_torch() -> None:
    pt = Predictor.load(MODEL, backend="torch")
    ox = Predictor.load(MODEL, backend="onnx")
    assert (pt.backend, ox.backend) == ("torch", "onnx")
    for prob in (GemmProblem(m=4096, n=4096, k=4096, dtype="float16"),
                 GemmProblem(m=1000, n=3000, k=77, dtype="bfloat16", transpose_left=True),
                 GemmProblem(m=128, n=50000, k=1024, dtype="float32", allow_tf32=True),
                 GemmProblem(m=333, n=257, k=4097, dtype="float32", transpose_right=True)):
        a, b = pt.predict(prob), ox.predict(prob)
        assert a.shape == b.shape and np.all(np.isfinite(a))
        np.testing.assert_allclose(np.log(b), np.log(a), atol=1e-3, err_msg=str(prob))
