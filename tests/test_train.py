"""train/: the by-problem split, the within-problem loss, the evaluation metrics, and an end-to-end
training smoke run on SYNTHETIC data (timings from a formula plus noise, not measurements)."""
from __future__ import annotations

import hashlib
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from perfmodel import GemmConfig, GemmProblem, PadProblem
from perfmodel.train import evaluate as ev
from perfmodel.train.data import GemmTable, PadTable, split_problems

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- (a) the split

def _modes(counts: dict[str, int], seed: int = 0) -> np.ndarray:
    modes = np.array([m for m, n in counts.items() for _ in range(n)])
    return modes[np.random.default_rng(seed).permutation(len(modes))]


COUNTS = {"float16": 400, "bfloat16": 257, "tf32": 94, "float32": 61}  # 10%: 40, 25.7, 9.4, 6.1


def test_split_sets_are_disjoint_and_cover_every_problem():
    modes = _modes(COUNTS)
    split = split_problems(modes, seed=0)
    assert split.shape == modes.shape and set(np.unique(split)) == {0, 1, 2}
    sets = [set(np.flatnonzero(split == s)) for s in (0, 1, 2)]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert sets[0] | sets[1] | sets[2] == set(range(len(modes)))
    # rows follow their problem: a table split by problem puts all of a problem's rows in one set
    P = len(modes)
    table = GemmTable(np.zeros((P, 8)), [f"p{i}" for i in range(P)], modes, np.repeat(np.arange(P), 3),
                      np.zeros((3 * P, 6)), np.ones(3 * P), np.ones(P))
    keys = [set(table.subset(split == s).problem_keys) for s in (0, 1, 2)]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert sum(len(table.subset(split == s).ms) for s in (0, 1, 2)) == 3 * P


def test_split_is_stratified_per_mode_with_80_10_10():
    modes = _modes(COUNTS)
    split = split_problems(modes, seed=1)
    tenth = {"float16": 40, "bfloat16": 26, "tf32": 9, "float32": 6}  # 10% of each mode, to the nearest
    for mode, n in COUNTS.items():
        s = split[modes == mode]
        assert (s == 1).sum() == tenth[mode], mode
        assert (s == 2).sum() == tenth[mode], mode
        assert (s == 0).sum() == n - 2 * tenth[mode], mode
    frac = np.bincount(split, minlength=3) / len(split)
    np.testing.assert_allclose(frac, [0.8, 0.1, 0.1], atol=0.01)


def test_split_is_deterministic_per_seed():
    modes = _modes(COUNTS)
    a, b = split_problems(modes, seed=7), split_problems(modes, seed=7)
    assert np.array_equal(a, b)
    c = split_problems(modes, seed=8)
    assert not np.array_equal(a, c)
    assert np.array_equal(np.bincount(a), np.bincount(c))  # same sizes, different members


# ---------------------------------------------------------------- (b) the within-problem loss

def _loss_reference(pred: list[float], y: list[float], group: list[int], tau: float) -> float:
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group):
        groups.setdefault(g, []).append(i)
    num = den = 0.0
    for rows in groups.values():
        best = min(y[i] for i in rows)
        w = {i: (math.exp(-(y[i] - best) / tau) + 0.05) if tau > 0 else 1.0 for i in rows}
        sw = sum(w.values())
        mean_d = sum(w[i] * (pred[i] - y[i]) for i in rows) / sw  # weighted mean of the error
        for i in rows:
            num += w[i] * ((pred[i] - y[i]) - mean_d) ** 2
            den += w[i]
    return num / den


@pytest.fixture(scope="module")
def within_problem_loss():
    """train/module.py's loss: that module is the LightningModule's, so these tests need the train extra."""
    pytest.importorskip("lightning", reason="train/module.py needs lightning (pip install 'perfmodel[train]')")
    from perfmodel.train.module import within_problem_loss

    return within_problem_loss


@pytest.mark.parametrize("tau", [0.3, 1.0, 0.0])
def test_within_problem_loss_matches_reference(within_problem_loss, tau):
    rng = random.Random(11)
    group = [rng.choice([12, 3, 7, 40, 5]) for _ in range(60)]  # non-dense ids, rows interleaved
    y = [rng.uniform(-4, 2) for _ in group]
    pred = [rng.uniform(-4, 2) for _ in group]
    got = within_problem_loss(torch.tensor(pred, dtype=torch.float64), torch.tensor(y, dtype=torch.float64),
                              torch.tensor(group), tau=tau)
    assert got.item() == pytest.approx(_loss_reference(pred, y, group, tau), rel=1e-10)


def test_within_problem_loss_ignores_a_per_problem_shift(within_problem_loss):
    gen = torch.Generator().manual_seed(0)
    group = torch.randint(0, 6, (80,), generator=gen)
    y = torch.randn(80, generator=gen, dtype=torch.float64)
    pred = torch.randn(80, generator=gen, dtype=torch.float64)
    shift = torch.randn(6, generator=gen, dtype=torch.float64) * 10
    base = within_problem_loss(pred, y, group)
    assert base > 0.1
    torch.testing.assert_close(within_problem_loss(pred + shift[group], y, group), base, rtol=1e-9, atol=1e-12)
    # a perfect ranking up to a per-problem offset costs nothing
    assert within_problem_loss(y + shift[group], y, group).item() == pytest.approx(0.0, abs=1e-12)
    # a shift that varies within a problem is not free
    assert within_problem_loss(pred + shift[group] + torch.arange(80) * 0.1, y, group) != pytest.approx(base.item())


# ---------------------------------------------------------------- (c) evaluation metrics

# Two problems, rows interleaved. Problem 0 (float16): 7 configs, problem 1 (tf32): 4 configs.
MS0 = [1.0, 2.0, 4.0, 3.0, 0.8, 0.5, 8.0]
SC0 = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]   # lower = predicted faster
MS1 = [3.0, 1.5, 6.0, 2.0]
SC1 = [5.0, 1.0, 2.0, 0.5]


def _table() -> tuple[GemmTable, np.ndarray]:
    rows = [(0, m, s) for m, s in zip(MS0, SC0)] + [(1, m, s) for m, s in zip(MS1, SC1)]
    rows = rows[::2] + rows[1::2]  # problem order must not matter
    pidx = np.array([r[0] for r in rows])
    table = GemmTable(np.array([[256, 256, 256, 2, 0, 0, 0, 0], [256, 256, 256, 4, 0, 1, 0, 0]], float),
                      ["a", "b"], np.array(["float16", "tf32"]), pidx, np.zeros((len(rows), 6)),
                      np.array([r[1] for r in rows]), np.array([1.0, 1.0]))
    return table, np.array([r[2] for r in rows])


def test_per_problem_by_hand():
    table, score = _table()
    pp = ev.per_problem(table, score)
    # problem 0: lowest score is the 1.0 ms config, oracle 0.5 ms; the fifth lowest score is 0.8 ms
    # problem 1: lowest score is the 2.0 ms config, oracle 1.5 ms; top-5 covers all 4 configs
    np.testing.assert_allclose(pp["top1"], [0.5, 0.75])
    np.testing.assert_allclose(pp["top5"], [0.625, 1.0])
    # Spearman = 1 - 6 sum d^2 / (n (n^2 - 1)): problem 0 ranks
    # score [0..6] vs ms [2,3,5,4,1,0,6]: sum d^2 = 52 (n 7); problem 1 ranks
    # score [3,1,2,0] vs ms [2,0,3,1]: sum d^2 = 4 (n 4)
    np.testing.assert_allclose(pp["spearman"], [1 - 6 * 52 / 336, 1 - 6 * 4 / 60])


def test_screened_rank_path_by_hand():
    """Problem 0 has 7 rows > 2 * keep(3): only the screen's 3 best rows keep their gemm score, so the
    rank path picks the gemm head's best among them; problem 1 (4 rows, not > 6) is untouched."""
    table, score = _table()
    gemm = np.log(score)
    screen = np.zeros_like(gemm)
    rows0 = np.flatnonzero(table.problem_idx == 0)
    screen[rows0] = np.arange(len(rows0))[::-1]   # the screen prefers problem 0's last three rows
    out = ev.screened(table, gemm, gemm, screen, keep=3)  # each row's place in the rank path's order
    kept = rows0[-3:]
    assert np.all(np.isinf(out[rows0[:-3]]))
    assert np.array_equal(np.sort(out[kept]), [0, 1, 2]) and np.array_equal(np.argsort(out[kept]), np.argsort(gemm[kept], kind="stable"))
    rows1 = np.flatnonzero(table.problem_idx == 1)
    assert np.array_equal(np.argsort(out[rows1]), np.argsort(gemm[rows1], kind="stable"))
    path = ev.rank_path(table, gemm, screen, keep=3)
    ms0 = table.ms[kept]
    want0 = table.ms[rows0].min() / ms0[np.argmin(gemm[kept])]
    assert path["float16/top1_eff"] == pytest.approx(want0)
    # MAPE and Spearman stay those of the gemm head on every row
    assert path["all/mape"] == pytest.approx(ev.summarize(table, gemm)["all/mape"])
    assert ev.rank_path(table, gemm, None, keep=3) == ev.summarize(table, gemm)


def test_summarize_by_hand():
    table, score = _table()
    pred = np.log(score)  # as predicted log ms: same ranking
    out = ev.summarize(table, pred)
    assert out["all/top1_eff"] == pytest.approx(math.sqrt(0.5 * 0.75))
    assert out["all/top5_eff"] == pytest.approx(math.sqrt(0.625))
    assert out["all/worst_top1"] == pytest.approx(0.5)
    assert out["float16/top1_eff"] == pytest.approx(0.5)
    assert out["tf32/top1_eff"] == pytest.approx(0.75)
    assert out["fp32_all/top1_eff"] == pytest.approx(0.75)
    assert out["all/problems"] == 2 and out["float16/problems"] == 1
    assert "bfloat16/top1_eff" not in out
    ape = [abs(s - m) / m for m, s in zip(MS0 + MS1, SC0 + SC1)]
    assert out["all/mape"] == pytest.approx(sum(ape) / len(ape))
    assert out["all/spearman_median"] == pytest.approx(((1 - 6 * 52 / 336) + (1 - 6 * 4 / 60)) / 2)


def test_random_choice_top1_is_the_geomean_of_oracle_over_ms():
    table, _ = _table()
    out = ev.random_choice(table)
    g0 = math.exp(sum(math.log(min(MS0) / m) for m in MS0) / len(MS0))
    g1 = math.exp(sum(math.log(min(MS1) / m) for m in MS1) / len(MS1))
    assert out["float16/top1_eff"] == pytest.approx(g0)
    assert out["tf32/top1_eff"] == pytest.approx(g1)
    assert out["all/top1_eff"] == pytest.approx(math.sqrt(g0 * g1))
    # top-5 of 4 configs always contains the oracle; of 7, it is between top-1 and 1
    assert out["tf32/top5_eff"] == pytest.approx(1.0)
    assert g0 < out["float16/top5_eff"] < 1.0


def _pad_table() -> tuple[PadTable, np.ndarray]:
    orig = np.array([1.0, 2.0, 3.0, 4.0])
    padded = np.array([0.5, 3.0, 1.0, 5.0])
    pred = np.log(np.stack([orig, [0.5, 1.0, 6.0, 5.0]], 1))  # orig predicted exactly; padded not
    table = PadTable(np.zeros((4, 11)), orig, padded, np.array(["float16", "float16", "float32", "bfloat16"]))
    return table, pred


def test_pad_metrics_by_hand():
    table, pred = _pad_table()
    out = ev.pad_metrics(table, pred)
    # decisions: pad, pad, keep, keep -> chosen 0.5 + 3 + 3 + 4 = 10.5; oracle 0.5 + 2 + 1 + 4 = 7.5
    assert out["pad/total_vs_oracle"] == pytest.approx(10.5 / 7.5)
    assert out["pad/never_pad_vs_oracle"] == pytest.approx(10 / 7.5)
    assert out["pad/always_pad_vs_oracle"] == pytest.approx(9.5 / 7.5)
    assert out["pad/decision_accuracy"] == pytest.approx(0.5)
    assert out["pad/mape_orig"] == pytest.approx(0.0, abs=1e-12)
    assert out["pad/mape_padded"] == pytest.approx((0 + 2 / 3 + 5 + 0) / 4)
    assert out["pad/problems"] == 4
    assert out["pad/float16/total_vs_oracle"] == pytest.approx(3.5 / 2.5)
    assert out["pad/float32/total_vs_oracle"] == pytest.approx(3.0)
    assert out["pad/bfloat16/total_vs_oracle"] == pytest.approx(1.0)
    assert "pad/tf32/total_vs_oracle" not in out
    # a threshold of 0.4 pads whenever padded is predicted < 2.5x orig: here always
    low = ev.pad_metrics(table, pred, threshold=0.4)
    assert low["pad/total_vs_oracle"] == pytest.approx(9.5 / 7.5)


# ---------------------------------------------------------------- (d, e) end-to-end on SYNTHETIC data

# SYNTHETIC shards (a formula with noise, never GPU timings): tests/_synthetic.py
from tests._synthetic import write_synthetic_dataset  # noqa: E402


def _settings(tmp: Path, out: Path, **kw):
    from perfmodel.train.pipeline import TrainSettings

    base = dict(data=tmp / "data", out=out, epochs=1, small_head_epochs=1, fast_dev_run=True,
                tracking_uri=f"sqlite:///{tmp}/mlflow.db", register_name="perfmodel-test", alias="candidate",
                progress=False, baselines=True, hidden=(32, 32), student_hidden=(16,),
                command="pytest tests/test_train.py")
    return TrainSettings(**{**base, **kw})


def test_a_screen_head_is_refused(tmp_path):
    # the screen head is of an older layout (perfmodel/heads/legacy.py): a non-empty screen_hidden is refused,
    # naming the field, before anything is fitted
    from perfmodel.train.pipeline import fit_heads

    with pytest.raises(ValueError, match=r"^screen_hidden: the screen head is of an older layout.*student screens"):
        fit_heads(_settings(tmp_path, tmp_path / "model", screen_hidden=(8,)), None, None)
    assert _settings(tmp_path, tmp_path / "model").screen_hidden == ()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, isolated):
    from perfmodel.train.pipeline import run

    tmp = tmp_path_factory.mktemp("train")
    write_synthetic_dataset(tmp / "data")
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp)  # MLflow's default artifact root is relative to the working directory
    try:
        res = run(_settings(tmp, tmp / "model", gemm_members=2))
    finally:
        mp.undo()
    return {"tmp": tmp, "res": res, "uri": f"sqlite:///{tmp}/mlflow.db"}


@pytest.mark.slow
def test_synthetic_dataset_loads(trained):
    from perfmodel.train.data import load_gemm, load_pad

    g = load_gemm(trained["tmp"] / "data")
    assert len(g.problems) == 32 and len(g.ms) == 32 * 8  # failed rows skipped
    assert np.isfinite(g.cublas_ms).all()
    assert set(g.modes) == {"float16", "bfloat16", "float32", "tf32"}
    assert len(load_pad(trained["tmp"] / "data").orig_ms) == 40


@pytest.mark.slow
def test_training_writes_a_loadable_model_folder(trained):
    from perfmodel import artifact, onnx_export

    out = trained["tmp"] / "model"
    assert Path(trained["res"]["out"]) == out
    for name in ("model.safetensors", "model.onnx", "metadata.json", "MODEL_CARD.md"):
        assert (out / name).is_file(), name
    bundle = artifact.load(out)
    # current-format heads only: no screen head (the student does not screen here), torch.mm's time the problem
    # network's one output (no [problem] step)
    assert set(bundle.heads) == {"gemm", "problem", "pad", "student"}
    assert bundle.screen_name is None and "screen_head" not in bundle.metadata
    assert bundle.metadata["problem_outputs"] == ["cublas"] and bundle.heads["problem"].cfg.n_outputs == 1
    assert bundle.heads["student"].cfg.hidden == (16,) and bundle.heads["student"].cfg.members == 1
    assert set(bundle.metadata["student_metrics"]) >= {"student/median_abs_log_diff", "gemm/member_spread_median"}
    assert bundle.encoders["student"].kind == "gemm" and bundle.metadata["screen_keep"] >= 1
    assert bundle.encoders["cublas"].kind == "cublas"
    assert bundle.metadata["fast_dev_run"] is True
    gemm = bundle.heads["gemm"].cfg  # two seeds, averaged after each one's floor
    assert (gemm.members, gemm.average, gemm.hidden) == (2, "after_floor", (64, 64))
    s = _settings(trained["tmp"], out)
    pad = bundle.heads["pad"].cfg
    assert (pad.members, pad.average) == (s.pad_members, "before_floor")
    assert pad.hidden == tuple(w * s.pad_members for w in s.pad_hidden)  # the members side by side
    cublas = bundle.heads["problem"].cfg  # likewise: cublas_members seeds side by side
    assert (cublas.members, cublas.average) == (s.cublas_members, "before_floor")
    assert cublas.hidden == tuple(w * s.cublas_members for w in s.cublas_hidden)
    assert bundle.metadata["dataset"]["gemm_problems"] == 32
    assert sum(bundle.metadata["split"].values()) == 32
    card = (out / "MODEL_CARD.md").read_text()
    assert "pytest tests/test_train.py" in card and bundle.metadata["dataset"]["sha256"] in card
    assert "Student head (" in card and "`predict` and `rank` run the gemm head" in card
    assert "gemm 2 x 32x32, averaged after floor" in card and (f"pad {s.pad_members} x {'x'.join(map(str, s.pad_hidden))}, "
                                                                   "averaged before floor") in card
    from perfmodel import __version__

    assert bundle.metadata["package_version"] == __version__  # the perfmodel that trained it
    assert f"Trained with perfmodel {__version__}." in card
    # nothing but the model folder and what the test made next to it
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".model")]


@pytest.mark.slow
def test_training_is_tracked_in_mlflow(trained):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=trained["uri"], registry_uri=trained["uri"])
    run = client.get_run(trained["res"]["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "1"
    assert run.data.params["hidden"] == "[32, 32]"  # settings are recorded one way (train/folder.py setting_value)
    assert "dataset_sha256" in run.data.params
    top1 = [k for k in run.data.metrics if "top1_eff" in k]
    assert top1 and any(k.startswith("perfmodel/") for k in top1)
    assert any(k.startswith("PR_156851_model/") or k.startswith("PR 156851") for k in run.data.metrics)
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/model.safetensors", "model/model.onnx", "model/metadata.json", "model/MODEL_CARD.md"} <= arts
    mv = client.get_model_version_by_alias("perfmodel-test", "candidate")
    assert mv.run_id == run.info.run_id
    assert str(mv.version) == str(trained["res"]["model_version"])
    assert mv.source.endswith("/model")


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_failed_run_leaves_the_previous_model(trained, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from perfmodel import artifact, onnx_export

    out = tmp_path / "models" / "h100"
    out.mkdir(parents=True)
    for p in (trained["tmp"] / "model").iterdir():  # a real previous model
        (out / p.name).write_bytes(p.read_bytes())
    (out / "MARKER").write_text("the previous model")
    before = _snapshot(out)

    def broken_export(*args, **kwargs):
        raise RuntimeError("synthetic failure while exporting ONNX")

    monkeypatch.setattr(onnx_export, "export_onnx", broken_export)
    monkeypatch.chdir(trained["tmp"])
    from perfmodel.train.pipeline import run

    with pytest.raises(RuntimeError, match="synthetic failure"):
        run(_settings(trained["tmp"], out, baselines=False, register_name="perfmodel-test-failed"))
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["h100"]  # no .h100.tmp-* or .h100.old left
    artifact.load(out)
    # the failed run is recorded as failed, and registered nothing
    client = MlflowClient(tracking_uri=trained["uri"], registry_uri=trained["uri"])
    runs = client.search_runs([client.get_experiment_by_name("perfmodel").experiment_id],
                              order_by=["attributes.start_time DESC"], max_results=1)
    assert runs[0].info.status == "FAILED"
    assert not client.search_registered_models("name = 'perfmodel-test-failed'")


# ---------------------------------------------------------------- (f) the CLI

@pytest.mark.parametrize("command, option", [("build", "--only"), ("eval", "--model")])
def test_cli_help(command, option):
    proc = subprocess.run([sys.executable, "-m", "perfmodel.serve.cli", command, "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert option in proc.stdout


@pytest.mark.slow
def test_train_fits_a_config_network(tmp_path, isolated, repo_root):
    # `perfmodel train --config-net` (pipeline.run, not the recipe) on a slice of data/h100 with its gemm_static
    # rows: the folder's gemm head has the kernel-mode input, its inductor figures are in static_metrics, and both
    # kernel modes load; a folder without static rows is refused naming config_net (SYNTHETIC shards, no static)
    import json

    from perfmodel import Predictor
    from perfmodel.train.data import slice_dataset
    from perfmodel.train.folder import SHARD_KINDS
    from perfmodel.train.pipeline import run

    data = slice_dataset(repo_root / "data" / "h100", tmp_path / "h100", 60, 0, SHARD_KINDS)
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp_path)
    try:
        run(_settings(tmp_path, tmp_path / "model", data=data, config_net=True, screen_hidden=(), baselines=False))
        write_synthetic_dataset(tmp_path / "synthetic")
        with pytest.raises(ValueError, match="config_net"):
            run(_settings(tmp_path, tmp_path / "model2", data=tmp_path / "synthetic", config_net=True))
    finally:
        mp.undo()
    meta = json.loads((tmp_path / "model" / "metadata.json").read_text())
    assert meta["kernel_mode_input"] == {"autotune": 0.0, "inductor": 1.0} and "static" not in meta["heads"]
    assert meta["heads"]["gemm"]["features"][-1] == "kernel_mode" and meta["settings"]["config_net"] is True
    assert meta["static_metrics"]["source"] == "config_net" and meta["static_metrics"]["test_static/problems"] > 0
    prob = GemmProblem(m=1024, n=1024, k=1024, dtype="float16")
    for kernel in ("autotune", "inductor"):
        assert Predictor.load(tmp_path / "model", backend="torch", kernel=kernel).predict(prob).min() > 0
    assert not (tmp_path / "model2").exists()
