"""The inductor kernel mode: Predictor.load(kernel="inductor"), served by the shipped model's config network
(train/config_net.py: its inductor mode) -- or by a static head (train/static_head.py) where a folder has one.

The shipped model's inductor mode is judged on data/h100's test problems, every dataset config of each
timed statically (the gemm_static parts); the fitting itself is checked on synthetic log ratios (said so
where used)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from perfmodel import GemmConfig, GemmProblem, Predictor
from perfmodel.artifact import inductor_mode


@pytest.fixture(scope="module")
def static_test(repo_root, shipped):
    """(dataset table, its static table restricted to the test problems)."""
    from perfmodel.train.data import load_gemm, split_problems
    from perfmodel.train.static_head import load_static, split_static

    table, static = load_gemm(repo_root / "data" / "h100"), load_static(repo_root / "data" / "h100")
    split = split_problems(table.modes, int(shipped.metadata["settings"]["seed"]))
    return table, split_static(table, static, split)


@pytest.mark.slow
def test_metrics_reproduce_from_the_data(shipped, static_test):
    # the metadata's test figures are recomputed here from the shipped weights and the committed rows, to
    # the tolerance of float32 outputs on another CPU (tests/_tolerance.py: one problem's pick may flip)
    from perfmodel.train.static_head import ranking_metrics
    from tests._tolerance import efficiency

    _, st = static_test
    m = shipped.metadata["static_metrics"]
    assert len(st.problems) == m["test_static/problems"]
    got = ranking_metrics(shipped, inductor_mode(shipped.heads), st)
    base = ranking_metrics(shipped, None, st)
    for k in ("all/top1_eff", "float16/top1_eff", "bfloat16/top1_eff", "fp32_all/top1_eff", "all/top5_eff"):
        assert m[f"test_static/static_head/{k}"] == efficiency(got[k], got, k, st.modes), k
        assert m[f"test_static/without/{k}"] == efficiency(base[k], base, k, st.modes), k
    # the inductor mode is what moves the ranking towards the static times (the figures docs/model.md quotes)
    assert got["all/top1_eff"] > base["all/top1_eff"] + 0.01
    assert got["all/top1_eff"] >= 0.96 and got["all/top5_eff"] >= 0.995


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_predictor_ranks_as_the_evaluation(shipped, static_test, backend):
    # One ranking rule: Predictor(kernel="inductor")'s screened fast path, rank(..., screened=True), picks, on test
    # problems with their dataset configs, what the evaluation's screened path (train.evaluate.screened on
    # static_outputs) picks.
    from perfmodel.train import evaluate as ev
    from perfmodel.train.static_head import static_outputs

    _, st = static_test
    pred = Predictor.load(backend=backend, kernel="inductor")
    o = static_outputs(shipped, inductor_mode(shipped.heads), st)
    order = ev.screened(st, o["score"], o["log_ms"], o["screen"], shipped.screen_keep, o["lead"], shipped.lead_keep)
    fields = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")
    for i, rows in enumerate(st.problem_rows()[:24]):
        p = st.problems[i]
        prob = GemmProblem(m=int(p[0]), n=int(p[1]), k=int(p[2]), dtype=str(st.modes[i]).replace("tf32", "float32"),
                           allow_tf32=bool(p[5]), transpose_left=bool(p[6]), transpose_right=bool(p[7]))
        cfgs = [GemmConfig(**dict(zip(fields, map(int, c)))) for c in st.configs[rows]]
        got = pred.rank(prob, cfgs, top_k=5, screened=True)
        want = [cfgs[j] for j in np.argsort(order[rows], kind="stable")[:5]]
        assert [c for c, _ in got] == want, prob
        ms = np.exp(o["log_ms"][rows][np.argsort(order[rows], kind="stable")[:5]])
        np.testing.assert_allclose([t for _, t in got], ms, rtol=1e-4)


# The physical floor of kernel="inductor" on both backends, up to the schema's largest dims, is
# tests/test_floor.py::test_no_prediction_below_the_physical_floor.


def test_inductor_mode_differs_and_backends_agree():
    prob = GemmProblem(m=3000, n=4095, k=2049, dtype="bfloat16")
    a = Predictor.load(backend="torch")
    i_torch, i_onnx = Predictor.load(backend="torch", kernel="inductor"), Predictor.load(backend="onnx", kernel="inductor")
    assert i_torch.kernel == "inductor" and a.kernel == "autotune"
    pa, pt, po = a.predict(prob), i_torch.predict(prob), i_onnx.predict(prob)
    assert not np.allclose(pa, pt, rtol=1e-3)          # the inductor mode changes the times
    np.testing.assert_allclose(pt, po, rtol=1e-3)
    # onnx runs its own inductor graphs: the same picks, times apart by float32 rounding only (~1e-6)
    ti, to = i_torch.rank(prob, top_k=5), i_onnx.rank(prob, top_k=5)
    assert i_onnx.backend == "onnx" and [c for c, _ in ti] == [c for c, _ in to]
    np.testing.assert_allclose([t for _, t in to], [t for _, t in ti], rtol=1e-4)
    assert a.with_kernel("inductor").rank(prob, top_k=3) == i_torch.rank(prob, top_k=3)
    assert a.with_kernel("autotune") is a


def test_kernel_argument_errors(tmp_path):
    from tests._synthetic import write_synthetic_model

    with pytest.raises(ValueError, match="kernel"):
        Predictor.load(kernel="static")
    bare = write_synthetic_model(tmp_path / "m", hidden=(16,), onnx=False)  # SYNTHETIC: no config network, no inductor head
    with pytest.raises(ValueError, match="kernel.*inductor head"):
        Predictor.load(bare, kernel="inductor")
    with pytest.raises(ValueError, match="kernel"):
        Predictor.load().with_kernel("triton")


def test_unrunnable_config_is_inf_in_inductor_mode():
    p = Predictor.load(kernel="inductor")
    prob = GemmProblem(m=512, n=512, k=512, dtype="float16")
    too_big = GemmConfig(block_m=256, block_n=256, block_k=128, group_m=8, num_stages=5, num_warps=8)
    ok = GemmConfig(block_m=64, block_n=64, block_k=32, group_m=8, num_stages=3, num_warps=4)
    assert math.isinf(p.predict(prob, [ok, too_big])[1])
    assert p.rank(prob, [too_big, ok], top_k=2)[0][0] == ok


def test_fit_learns_a_known_ratio():
    # synthetic: the log ratio is a fixed function of two feature columns; the head must recover it
    from perfmodel.train.static_head import StaticHeadSettings, fit

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 6, generator=gen)
    y = 0.2 * torch.tanh(x[:, 0]) - 0.1 * (x[:, 1] > 0).float()
    head = fit(x[:3000], y[:3000], StaticHeadSettings(hidden=(32, 32), epochs=40, batch_rows=256), log=lambda *a: None)
    with torch.inference_mode():
        err = (head.score(x[3000:]) - y[3000:]).abs().mean()
    assert err < 0.25 * (y[3000:] - y[3000:].mean()).abs().mean()


def test_cli_rank_kernel(repo_root, capsys, tmp_path):
    from tests._synthetic import write_synthetic_model

    import json

    from perfmodel.cli import main

    assert main(["rank", "--m", "3000", "--n", "4095", "--k", "2049", "--dtype", "bfloat16", "--top-k", "3",
                 "--kernel", "inductor", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = Predictor.load(kernel="inductor").rank(GemmProblem(m=3000, n=4095, k=2049, dtype="bfloat16"), top_k=3)
    assert out["kernel"] == "inductor"
    assert [r["predicted_ms"] for r in out["configs"]] == pytest.approx([t for _, t in want], rel=1e-9)
    assert main(["rank", "--m", "64", "--n", "64", "--k", "64", "--kernel", "inductor", "--device", "h200",
                 "--model", str(repo_root / "models" / "h200")]) == 0    # its inductor head
    capsys.readouterr()
    bare = write_synthetic_model(tmp_path / "m", hidden=(16,), onnx=False)  # SYNTHETIC: no inductor mode
    assert main(["rank", "--m", "64", "--n", "64", "--k", "64", "--kernel", "inductor", "--model", str(bare)]) == 2
    assert "kernel" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_reports_both_kernel_modes(repo_root, shipped, static_test):
    # `perfmodel eval` ranks the statically timed test problems per kernel mode, as `perfmodel static-head` did
    from perfmodel.train.data import load_device_datasets
    from perfmodel.train.eval_cmd import evaluate_datasets

    from perfmodel.train.static_head import ranking_metrics
    from tests._tolerance import efficiency

    (res,) = evaluate_datasets(shipped, load_device_datasets([repo_root / "data" / "h100"]), full_space=False)
    _, st = static_test
    assert res["static"]["problems"] == len(st.problems)
    for mode, head in (("inductor", inductor_mode(shipped.heads)), ("autotune", None)):
        want = ranking_metrics(shipped, head, st)  # the same computation in this process: equal
        for k in ("all/top1_eff", "all/top5_eff", "fp32_all/top1_eff"):
            assert res["static"][mode][k] == pytest.approx(want[k], rel=1e-12), (mode, k)
    # and the metadata's figures, to another CPU's float32 rounding
    m = shipped.metadata["static_metrics"]
    for mode, key in (("inductor", "static_head"), ("autotune", "without")):
        got = res["static"][mode]
        assert m[f"test_static/{key}/all/top1_eff"] == efficiency(got["all/top1_eff"], got, "all/top1_eff", st.modes)
