"""The problem network (train/problem_head.py): one MLP in place of the cublas, call and call_static heads.

The masked loss is checked on synthetic targets (said so); the refit on a copy of the shipped models/h100
with a tiny fit (its figures say nothing about the shipped settings'); the old layout is the shipped
folders themselves (tests/test_call_head.py, test_cublas_head.py)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from perfmodel import GemmProblem, Predictor


def test_masked_loss_is_per_output_means_summed():
    # synthetic: output 0 has targets on every row, output 1 on one row, output 2 on none
    from perfmodel.train.loop import masked_smooth_l1

    pred = torch.tensor([[0.0, 1.0, 5.0], [0.0, 3.0, 5.0]], requires_grad=True)
    y = torch.tensor([[1.0, 1.5, float("nan")], [3.0, float("nan"), float("nan")]])
    loss = masked_smooth_l1(pred, y, beta=0.5)
    # output 0: |err| 1 and 3 -> (1 - 0.25) and (3 - 0.25), mean 1.75; output 1: 0.5 -> 0.5**2 / (2 * 0.5) = 0.25
    assert float(loss) == pytest.approx(1.75 + 0.25, rel=1e-6)
    loss.backward()
    assert torch.all(pred.grad[:, 2] == 0) and pred.grad[1, 1] == 0  # no gradient from a missing target


def test_the_one_cycle_schedule_runs_ten_steps():
    # torch's OneCycleLR divided by zero at 10 steps (a tenth of them warming up ends on step 0): a call head of
    # 5 epochs of 2 batches is 10 steps (the CI recipe's slice, once data/h100 had 3,600 bmm problems)
    from types import SimpleNamespace

    from perfmodel.model import MLPConfig, PerfMLP
    from perfmodel.train.loop import fit_plain, one_cycle

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = one_cycle(opt, 1.0, 10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs.index(max(lrs)) == 1 and lrs[-1] < lrs[0]  # two steps warming up (0, 1), then down
    assert one_cycle(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 1.0, 20).total_steps == 20
    head = PerfMLP(MLPConfig(3, (4,), "none"))
    s = SimpleNamespace(lr=0.01, weight_decay=0.0, epochs=5, batch_rows=3, huber_beta=0.05)
    x, y = torch.randn(5, 3), torch.randn(5)  # synthetic rows: 2 batches an epoch
    fit_plain(head, x, y, s, 0, lambda rows: head(rows).squeeze(-1))


@pytest.fixture(scope="module")
def refitted(tmp_path_factory, repo_root):
    """A copy of models/h100 whose cublas, call and call_static heads are replaced by a problem network of a
    tiny fit (2 members of 16 wide, 3 epochs), by the problem step (`build --only problem`)."""
    from perfmodel.train.problem_head import ProblemHeadSettings
    from perfmodel.train.refit import refit_problem

    folder = tmp_path_factory.mktemp("problem") / "m"
    shutil.copytree(repo_root / "models" / "h100", folder)
    threads = torch.get_num_threads()
    try:
        refit_problem(ProblemHeadSettings(model=folder, data=repo_root / "data" / "h100", hidden=(16,), members=2,
                                          epochs=3, threads=2), log=lambda *a: None)
    finally:
        torch.set_num_threads(threads)
    return folder


@pytest.mark.slow
def test_refit_replaces_three_heads(refitted):
    meta = json.loads((refitted / "metadata.json").read_text())
    # the three heads replaced; every other head of the folder (the bmm heads among them) kept
    assert set(meta["heads"]) == {"gemm", "pad", "student", "problem", "bmm", "bmm_call"}
    assert meta["problem_outputs"] == ["cublas", "call", "call_static"]
    assert meta["heads"]["problem"]["mlp"]["n_outputs"] == 3 and meta["heads"]["problem"]["encoder_kind"] == "cublas"
    assert meta["build"]["steps"][-1]["step"] == "problem-head" and meta["problem_settings"]["members"] == 2
    # the figures in the separate heads' keys, each split's problems as the call heads count them
    call, cub = meta["call_metrics"], meta["cublas_head_metrics"]
    for name in ("call", "call_static"):
        assert 0.5 <= call[f"{name}/test/choice_accuracy"] <= 1 and call[f"{name}/test/problems"] == 173
    assert cub["gemm/test/rows"] == 173 and cub["cublas_only/test/rows"] == 1500
    assert 0 < cub["gemm/test/mean_abs_log_err"] < 3 and "before/gemm/test/mean_abs_log_err" in cub
    assert meta["cublas_metrics"]["cublas/choice_accuracy"] == call["call/test/choice_accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["autotune", "inductor"])
def test_both_backends_serve_the_problem_network(refitted, kernel):
    from perfmodel.artifact import load, problem_output

    probs = [GemmProblem(m=m, n=n, k=k, dtype=d) for m, n, k, d in
             ((4096, 4096, 4096, "float16"), (16, 4096, 4096, "bfloat16"), (777, 1234, 555, "float32"),
              (2048, 50264, 768, "float16"))]
    got = {}
    for backend in ("torch", "onnx"):
        p = Predictor.load(refitted, backend=backend, kernel=kernel)
        assert p.backend == backend and p.has_cublas
        cand = p.candidates(probs[0], top_k=3)
        got[backend] = (p.predict_cublas_many(probs), p.prefers_cublas_many(probs), cand.cublas_ms, cand.prefer_cublas)
    # two graphs of the same weights: float32 rounding (the loader's own check, rtol 1e-3)
    assert got["torch"][0] == pytest.approx(got["onnx"][0], rel=1e-3)
    assert got["torch"][2] == pytest.approx(got["onnx"][2], rel=1e-3)
    assert (got["torch"][1] == got["onnx"][1]).all() and got["torch"][3] == got["onnx"][3]
    # the served values are the network's columns
    from perfmodel.features import problems_tensor

    bundle = load(refitted)
    x = bundle.encoders["cublas"].encode(problems_tensor(probs))
    with torch.inference_mode():
        cub = problem_output(bundle, "cublas")(x).double().exp().numpy()
        call = problem_output(bundle, "call_static" if kernel == "inductor" else "call").score(x).double().numpy()
    # one answer (decisions.cublas_time): the cuBLAS column's time where its verdict against the best config agrees
    # with the call column, else the time the call implies (the best config's x exp(call)); the verdict the call's
    best = Predictor.load(refitted, backend="torch", kernel=kernel).space_best_ms(probs)
    agree = (cub < best) == (call < 0)
    want = np.where(agree, cub, np.maximum(best * np.exp(call), 0.0))
    assert got["torch"][0][agree] == pytest.approx(want[agree], rel=1e-4)
    assert ((got["torch"][0] < best) == got["torch"][1]).all()
    assert (got["torch"][1] == (call < 0)).all()


@pytest.mark.slow
def test_separate_refits_refuse_a_problem_network(refitted, repo_root):
    from perfmodel.cli import main

    for command in ("call-head", "cublas-head"):
        assert main([command, "--model", str(refitted), "--data", str(repo_root / "data" / "h100"), "--epochs", "1"]) == 2


def test_problem_outputs_must_match_the_head(tmp_path, repo_root):
    # a folder whose problem_outputs do not name its problem head's outputs is refused, naming the field
    from perfmodel.artifact import ArtifactError, ModelBundle, load, save
    from perfmodel.model import MLPConfig, PerfMLP

    bundle = load(repo_root / "models" / "h100")
    heads = {k: v for k, v in bundle.heads.items() if k not in ("cublas", "call", "call_static")}
    enc = bundle.encoders["cublas"]
    heads["problem"] = PerfMLP(MLPConfig(len(enc), (4,), "none", n_outputs=2)).eval()
    encoders = {**{k: bundle.encoders[k] for k in heads if k != "problem"}, "problem": enc}
    meta = {k: v for k, v in bundle.metadata.items() if k not in ("heads", "weights_sha256")}
    save(ModelBundle(bundle.spec, heads, encoders, {**meta, "problem_outputs": ["cublas", "call", "call_static"]},
                     bundle.config_net), tmp_path)
    with pytest.raises(ArtifactError, match="problem_outputs"):
        load(tmp_path)
    save(ModelBundle(bundle.spec, heads, encoders, {**meta, "problem_outputs": ["cublas", "call"]}, bundle.config_net),
         tmp_path)
    b = load(tmp_path)
    with torch.inference_mode():
        out = b.heads["problem"](enc.encode(torch.tensor([[64.0, 64, 64, 2, 0, 0, 0, 0]], dtype=torch.float64)))
    assert b.encoders["cublas"].names == enc.names and out.shape == (1, 2) and np.isfinite(out.numpy()).all()


def test_recipe_takes_problem_and_refuses_call(tmp_path, repo_root):
    # the separate call heads are of an older layout: a [call] section is refused, naming the problem network
    from perfmodel.train.recipe import load_recipe

    base = (repo_root / "recipes" / "ci-small.toml").read_text()
    assert load_recipe(repo_root / "recipes" / "ci-small.toml").problem.members == 1
    path = tmp_path / "r.toml"
    path.write_text(base + "\n[call]\nmembers = 1\n")
    with pytest.raises(ValueError, match=r"^recipe \[call\]: a head of an older layout.*call outputs \(\[problem\]\)"):
        load_recipe(path)
    for name in ("h100", "h200"):  # the shipped recipes build the problem network
        r = load_recipe(repo_root / "recipes" / f"{name}.toml")
        assert not hasattr(r, "call") and r.problem.members == 5 and r.problem.hidden == (128, 128, 128)
