"""The shipped model's bmm heads (models/h100, `perfmodel bmm-head`) against the committed bmm rows (data/h100):
the serving path (Predictor.rank / prefers_cublas_many, both backends) on the held-out test problems gives the
figures the metadata records. The picks may differ from the evaluation's on one problem (a near-tie that
another CPU's rounding, or the ONNX graph's, can flip), and where the evaluation's pick is a config the device cannot
run for the problem (perfmodel.configs.runnable_for; the serving pick is then the evaluation's best runnable config);
the figures then differ by those problems' share."""
from __future__ import annotations

import numpy as np
import pytest

from perfmodel import GemmConfig, GemmProblem, Predictor
from perfmodel.configs import runnable_for
from perfmodel.locations import checkout_root, default_model_dir

ROOT = checkout_root()
pytestmark = pytest.mark.skipif(ROOT is None or not (ROOT / "data" / "h100").is_dir(),
                                reason="needs the checkout's data/h100")


def _problem(row: np.ndarray) -> GemmProblem:
    m, n, k, db, bf16, tf32, tl, tr, b = row
    dtype = "float32" if db == 4 else ("bfloat16" if bf16 else "float16")
    return GemmProblem(m=int(m), n=int(n), k=int(k), dtype=dtype, allow_tf32=bool(tf32), transpose_left=bool(tl),
                       transpose_right=bool(tr), batch=int(b))


@pytest.fixture(scope="module")
def held_out():
    from perfmodel.train.bmm_head import load_bmm, split_by_shape

    meta = Predictor.load(default_model_dir(), backend="torch").bundle.metadata
    if "bmm_metrics" not in meta:
        pytest.skip("the shipped model has no bmm heads")
    t = load_bmm(ROOT / "data" / "h100")
    split = split_by_shape(t, int(meta["bmm_settings"]["split_seed"]))
    return meta["bmm_metrics"], t, np.flatnonzero(split == 2)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.slow
def test_the_serving_path_reproduces_the_recorded_test_figures(held_out, backend):
    import torch

    from perfmodel.artifact import BMM
    from perfmodel.train.bmm_head import encode, predict_log_ms

    if backend == "onnx":
        pytest.importorskip("onnxruntime")
    m, t, test = held_out
    p = Predictor.load(default_model_dir(), backend=backend, device="h100-sxm")
    x, _ = encode(t, p.bundle.spec, p.bundle.encoders[BMM].version)
    with torch.inference_mode():
        evaluated = predict_log_ms(p.bundle.heads[BMM], x)           # the evaluation's log ms (unfolded head)
    top1, top5, problems, flips, beyond = [], [], [], 0, 0
    for i in test:
        rows = np.flatnonzero(t.problem_idx == i)
        cfgs = [GemmConfig(*map(int, c)) for c in t.configs[rows]]
        prob = _problem(t.problems[i])
        ranked = p.rank(prob, cfgs, top_k=5)
        # the serving path ranks only the configs the device runs for the problem (perfmodel.configs.runnable_for:
        # Triton's shared memory at the problem's sizes, and the registers); the evaluation ranks every timed config
        ok = runnable_for(t.configs[rows], [prob], p.spec)[0]
        beyond += not ok[int(np.argmin(evaluated[rows]))]
        pick = cfgs[int(np.argmin(np.where(ok, evaluated[rows], np.inf)))]
        flips += ranked[0][0] != pick
        ms = {c: t.ms[r] for c, r in zip(cfgs, rows)}
        best = t.ms[rows].min()
        top1.append(best / ms[ranked[0][0]])
        top5.append(best / min(ms[c] for c, _ in ranked))
        problems.append(prob)
    assert flips <= 1, f"the serving path picks another config than the evaluation on {flips} test problems"
    # one flipped pick moves a geomean by at most its problem's share: (best / slowest config) ** (1 / n)
    worst = min(t.ms[t.problem_idx == i].min() / t.ms[t.problem_idx == i].max() for i in test)
    share = np.exp(-np.log(worst) / len(test)) ** max(1, flips + beyond)
    for got, key in ((np.array(top1), "test/all/top1_eff"), (np.array(top5), "test/all/top5_eff")):
        g = float(np.exp(np.log(got).mean()))
        assert m[key] / share - 1e-9 <= g <= m[key] * share + 1e-9, (key, g, m[key])
    # the aten-or-Triton call: the call head's, on every test problem (each has both times)
    best = np.array([t.ms[t.problem_idx == i].min() for i in test])
    calls = p.prefers_cublas_many(problems)
    n_right = int((calls == (t.aten_ms[test] < best)).sum())
    assert abs(n_right - round(m["test/call/accuracy"] * len(test))) <= 1
