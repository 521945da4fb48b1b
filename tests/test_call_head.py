"""The cuBLAS call (train/call_head.py): whether cuBLAS beats the best Triton config of a problem, per kernel
mode, and the Predictor's prefer_cublas that serves it. The shipped folders give it by their problem
network's call outputs (artifact.problem_output); a folder without call outputs (a one-output problem network,
tests/_layout.py) compares the times.

The shipped outputs are judged on data/h100's test problems (their measured cuBLAS and Triton times); the
fitting itself is checked on synthetic targets (said so where used)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from perfmodel import GemmConfig, GemmProblem, Predictor, artifact
from perfmodel.artifact import CALL, CALL_STATIC
from tests._layout import cublas_only_copy


@pytest.fixture(scope="module")
def tables(repo_root, shipped):
    """{head: (table, split of its problems)}: the dataset's gemm rows and its static rows."""
    from perfmodel.train.data import load_gemm, split_problems
    from perfmodel.train.static_head import load_static

    gemm, static = load_gemm(repo_root / "data" / "h100"), load_static(repo_root / "data" / "h100")
    split = split_problems(gemm.modes, int(shipped.metadata["settings"]["seed"]))
    keys = {k: i for i, k in enumerate(gemm.problem_keys)}
    return {CALL: (gemm, split), CALL_STATIC: (static, np.array([split[keys[k]] for k in static.problem_keys]))}


@pytest.mark.parametrize("name", [CALL, CALL_STATIC])
@pytest.mark.slow
def test_metrics_reproduce_from_the_data(shipped, tables, name):
    # the metadata's call accuracies, recomputed from the shipped heads and the committed rows; one problem
    # per figure may come out the other way on another CPU, where a float32 score is within rounding of 0
    # (tests/_tolerance.py)
    from perfmodel.train.call_head import call_scores, call_targets, times_call
    from tests._tolerance import share

    table, split = tables[name]
    ok, y = call_targets(table)
    pred = call_scores(shipped, artifact.problem_output(shipped, name), table)
    # the inductor-mode call's baseline: the config network's inductor mode (or a static head, in an older folder)
    before = times_call(shipped, table, artifact.inductor_mode(shipped.heads) if name == CALL_STATIC else None)
    m = shipped.metadata["call_metrics"]
    acc = {}
    for part, which in (("train", 0), ("val", 1), ("test", 2)):
        sel = ok & (split == which)
        n = int(sel.sum())
        assert m[f"{name}/{part}/problems"] == n
        acc[part] = ((pred < 0) == (y < 0))[sel].mean(), ((before < 0) == (y < 0))[sel].mean()
        assert m[f"{name}/{part}/choice_accuracy"] == share(acc[part][0], n)
        assert m[f"{name}/{part}/choice_accuracy_times"] == share(acc[part][1], n)
    # the call head beats the comparison of the two heads' times on the held-out problems
    assert acc["test"][0] > acc["test"][1]
    if name == CALL:
        assert acc["test"][0] >= 0.90


@pytest.mark.slow
def test_evaluation_uses_the_call_head(repo_root, shipped, tables):
    # `perfmodel eval` (train.evaluate.evaluate_bundle) reports the call the Predictor makes: the call
    # head's accuracy on the test problems, as recomputed here from the head and the rows
    from perfmodel.train.call_head import call_scores, call_targets, times_call
    from perfmodel.train.evaluate import evaluate_bundle
    from tests._tolerance import share

    out = evaluate_bundle(shipped, repo_root / "data" / "h100", full_space=False)
    table, split = tables[CALL]
    ok, y = call_targets(table)
    sel = ok & (split == 2)
    pred, before = call_scores(shipped, artifact.problem_output(shipped, CALL), table), times_call(shipped, table, None)
    # (evaluate_bundle runs the heads on other batches: float32 rounding may differ, one problem may flip)
    assert out["cublas"]["cublas/choice_accuracy"] == share(((pred < 0) == (y < 0))[sel].mean(), int(sel.sum()))
    assert out["cublas"]["cublas/choice_accuracy_times"] == share(((before < 0) == (y < 0))[sel].mean(), int(sel.sum()))
    assert out["cublas"]["cublas/choice_accuracy"] > out["cublas"]["cublas/choice_accuracy_times"]


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("kernel", ["autotune", "inductor"])
def test_predictor_prefers_as_the_call_head(shipped, tables, backend, kernel):
    # prefer_cublas over the model's space is the kernel mode's call head, on 40 test problems
    from perfmodel.train.call_head import call_scores

    name = CALL if kernel == "autotune" else CALL_STATIC
    table, split = tables[name]
    rows = np.flatnonzero(split == 2)[:40]
    sub = table.subset(np.isin(np.arange(len(table.problems)), rows))
    want = call_scores(shipped, artifact.problem_output(shipped, name), sub) < 0
    pred = Predictor.load(backend=backend, kernel=kernel)
    probs = [_as_problem(r) for r in sub.problems]
    got = pred.prefers_cublas_many(probs)
    assert got.dtype == bool and (got == want).all()
    assert 0 < want.sum() < len(want)  # both answers occur among these problems
    for p, w in list(zip(probs, want))[:6]:
        assert pred.candidates(p).prefer_cublas == bool(w)


def _as_problem(row) -> GemmProblem:
    """A row of PROBLEM_COLUMNS (m, n, k, dtype bytes, is_bf16, allow_tf32, transpose_left, transpose_right)."""
    m, n, k, nbytes, bf16, tf32, tl, tr = (int(v) for v in row)
    dtype = "float32" if nbytes == 4 else ("bfloat16" if bf16 else "float16")
    return GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=bool(tf32), transpose_left=bool(tl),
                       transpose_right=bool(tr))


def test_a_given_list_of_slow_configs_prefers_cublas():
    # configs given: cuBLAS below the best given config's predicted time is preferred even where the
    # call head says the best config of the whole space beats cuBLAS
    pred = Predictor.load()
    prob = GemmProblem(m=32, n=14336, k=4096, dtype="float16")  # a decode-size MLP GEMM the call gives Triton
    assert not pred.prefers_cublas_many([prob])[0]
    slow = [GemmConfig(16, 16, 16, 1, 1, 1)]
    assert np.isfinite(pred.predict(prob, slow)).all()  # a config the device runs
    c = pred.candidates(prob, slow, top_k=1)
    assert c.cublas_ms < c.best_ms and c.prefer_cublas
    assert not pred.candidates(prob).prefer_cublas


def test_a_model_without_call_heads_compares_times(repo_root, tmp_path):
    # a copy of the shipped model without call outputs (its problem network of one output, torch.mm's time):
    # prefer_cublas is the cuBLAS time below the best config's
    pred = Predictor.load(cublas_only_copy(repo_root / "models" / "h100", tmp_path / "m"), backend="torch")
    assert artifact.problem_output(pred.bundle, CALL) is None
    assert artifact.problem_output(pred.bundle, "cublas") is not None
    probs = [GemmProblem(m=m, n=4096, k=4096, dtype="bfloat16") for m in (16, 256, 4096)]
    best = np.array([r[0][1] for r in pred.rank_many(probs, top_k=1)])
    assert (pred.prefers_cublas_many(probs) == (pred.predict_cublas_many(probs) < best)).all()
    for p in probs:
        c = pred.candidates(p)
        assert c.prefer_cublas == (c.cublas_ms < c.best_ms)


def test_fit_call_learns_a_known_sign():
    # synthetic targets (not timings): y = x0 - 0.3 x1; the fitted ensemble gets the sign right
    from perfmodel.train.call_head import CallHeadSettings, fit_call

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 4, generator=gen)
    y = x[:, 0] - 0.3 * x[:, 1]
    head = fit_call(x[:1500], y[:1500], CallHeadSettings(hidden=(32,), members=2, epochs=30, batch_rows=256),
                    log=lambda *a: None)
    with torch.inference_mode():
        s = head.score(x[1500:])
    assert head.cfg.members == 2
    assert ((s < 0) == (y[1500:] < 0)).float().mean() > 0.95
